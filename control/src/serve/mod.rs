//! `cnimesh-control serve`: wires the issuer, the control plane's own certificate, the gRPC
//! services and the admin listener together. One entry point, [`run`], with a [`Config`] whose
//! optional sections (the cluster's services, the webhook, the tap relay, tracing) the command
//! line fills in ([`crate::cli`]); tests and benchmarks call it in-process with bound listeners.
//!
//! Layer: runtime: the one place where sources, index, gRPC services and admin are wired together.

mod listen;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cnimesh_common::names::TAP_TOKEN_AUDIENCE;
use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use cnimesh_identity::trust_domain::Verifying;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::admin::{self, AdminState};
use crate::grpc::destination::DestinationService;
use crate::grpc::identity::IdentityService;
use crate::grpc::inbound::InboundService;
use crate::grpc::limits::Admission;
use crate::grpc::outbound::OutboundService;
use crate::grpc::peer::{self, OptionalMeshClientVerifier};
use crate::grpc::spans::{GrpcTracing, TraceConfig};
use crate::sources::{KubeSource, Source};
use crate::tap::Relay;
use cnimesh_model::destination::Index;
use cnimesh_model::external::join_store::JoinStore;
use cnimesh_model::identity::issuer::IssuerRx;
use cnimesh_model::identity::{Authenticator, KubeTokens, Policy, issuer, own_cert};
use cnimesh_model::metrics::Metrics;

pub use listen::Listener;

/// What ends serving: when it resolves, gRPC calls drain and [`run`] returns.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How long a writer task (webhook certificate, trust bundle) may take to stop (an elector
/// releases its Lease, bounded by a renew interval).
const WRITER_TASK_STOP: Duration = Duration::from_secs(10);

pub struct Config {
    /// `ca.crt`, `tls.crt`, `tls.key`, watched for changes.
    pub issuer_dir: PathBuf,
    /// The control plane's own identity: the name proxies verify when they connect.
    pub identity_name: Name,
    pub policy: Policy,
    /// Where workload tokens are checked: TokenReview against this API server.
    pub tokens: kube::Client,
    /// ServiceAccounts Identity refuses to certify: the control plane's and the node agent's.
    pub reserved: cnimesh_model::identity::Reserved,
    /// The namespace whose join-token Secret Identity reads (through the API server of
    /// `tokens`): the control plane's own, never another.
    pub join_namespace: String,
    /// What one client may hold open on the gRPC port (`crate::grpc::limits`).
    pub limits: crate::grpc::limits::Limits,
    pub listeners: Listeners,
    pub shutdown: Shutdown,
    /// Answers' cluster and trust domains (Destination's, and the admin port's
    /// `/destination.json`).
    pub destination: cnimesh_model::destination::Config,
    /// Destination, inbound and outbound policy, served from the cluster's objects; `None`:
    /// Identity alone.
    pub cluster: Option<ClusterConfig>,
    /// The injection webhook, when enabled.
    pub webhook: Option<WebhookConfig>,
    /// The webhook's certificate from a watched Secret, and in managed mode the election and the
    /// leader's upkeep of it (`crate::webhook_certs`). `None`: the one in `webhook` is fixed.
    pub webhook_certs: Option<crate::webhook_certs::SecretSource>,
    /// How replicas elect the writer of the endorsed trust bundle in every namespace
    /// (`crate::trust_bundle`, through the API server of `tokens`); `None`: none is written.
    pub trust_bundle: Option<cnimesh_runtime::leader::ElectionConfig>,
    /// The tap relay on the admin port (`/tap`); without it `/tap` is 404.
    pub tap: bool,
    /// A SERVER span per gRPC call, exported to this collector ([`crate::grpc::spans`]).
    pub trace: Option<TraceConfig>,
}

impl Config {
    /// Identity alone, with default limits and nothing reserved: every optional
    /// section off (no cluster, webhook, tap or tracing). Tests and benchmarks start here and set
    /// the sections they need.
    pub fn new(
        issuer_dir: PathBuf,
        identity_name: Name,
        policy: Policy,
        tokens: kube::Client,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Config {
            issuer_dir,
            identity_name,
            policy,
            tokens,
            reserved: Default::default(),
            join_namespace: cnimesh_common::names::CONTROL_NAMESPACE.to_string(),
            limits: Default::default(),
            listeners,
            shutdown: Box::pin(shutdown),
            destination: Default::default(),
            cluster: None,
            webhook: None,
            webhook_certs: None,
            trust_bundle: None,
            tap: false,
            trace: None,
        }
    }
}

pub struct Listeners {
    /// gRPC over TLS: Identity to anyone, everything else to mesh identities only.
    pub grpc: Listener,
    /// HTTP `/metrics`, `/ready`, `/live`.
    pub admin: Listener,
}

/// Where the cluster's objects come from and how inbound policy treats them.
pub struct ClusterConfig {
    /// The API server watched for Services, EndpointSlices, Pods, policy and routes.
    pub client: kube::Client,
    /// Inbound policy's defaults; policy is served beside Destination, from the same source.
    pub inbound_policy: cnimesh_model::policy::Config,
}

/// The HTTPS admission webhook.
pub struct WebhookConfig {
    pub webhook: crate::inject::Webhook,
    /// Its serving certificate.
    pub tls: Arc<rustls::ServerConfig>,
    pub listener: Listener,
}

/// Runs the control plane until `config.shutdown` resolves, then drains gRPC calls and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let grpc_listener = config.listeners.grpc.bind().await?;
    let admin_listener = config.listeners.admin.bind().await?;
    let webhook = match config.webhook {
        Some(webhook) => Some((webhook.listener.bind().await?, webhook.webhook, webhook.tls)),
        None => None,
    };
    let tracer = start_tracing(config.trace.as_ref())?;
    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = watch::channel(false);
    let cert_tasks = config
        .webhook_certs
        .map(|source| crate::webhook_certs::spawn(source, metrics.clone(), stopped.clone()))
        .unwrap_or_default();
    let issuer = issuer::watch_dir(config.issuer_dir.clone(), metrics.clone(), stopped.clone())
        .with_context(|| format!("loading the issuer from {}", config.issuer_dir.display()))?;

    let own_cert = Arc::new(CurrentCert::default());
    let own_cert_task = tokio::spawn(own_cert::keep_current(
        config.identity_name.clone(),
        issuer.clone(),
        config.policy.clone(),
        own_cert.clone(),
        stopped.clone(),
    ));
    let server_tls = grpc_tls(&config.identity_name, &issuer, &own_cert)?;
    let bundle_tasks = config
        .trust_bundle
        .map(|election| spawn_trust_bundle(&config.tokens, election, &issuer, &own_cert, &metrics, &stopped))
        .unwrap_or_default();

    let trust_domain = config.policy.trust_domain.clone();
    let tap_authenticator = config.tap.then(|| tap_authenticator(&config.tokens));
    let join = JoinStore::new(config.tokens.clone(), &config.join_namespace);
    let identity =
        IdentityService::new(issuer.clone(), token_authenticator(config.tokens), config.policy, metrics.clone())
            .with_reserved(config.reserved)
            .with_join(join);
    let routes = Routes::new(identity.into_server());
    let (routes, cluster) = match config.cluster {
        Some(cluster) => {
            let (routes, served) = serve_cluster(routes, cluster, &config.destination, &metrics);
            (routes, Some(served))
        }
        None => (routes, None),
    };
    let index = cluster.as_ref().map(|c| c.index.clone());

    tracing::info!(
        grpc = %grpc_listener.local_addr()?,
        admin = %admin_listener.local_addr()?,
        identity = %config.identity_name,
        "serving"
    );
    let grpc = tokio::spawn(crate::grpc::serve_tls_traced(
        grpc_listener,
        routes,
        server_tls,
        Admission::new(config.limits),
        metrics.clone(),
        tracer,
        until(stopped.clone()),
    ));
    let webhook_addr = webhook.as_ref().and_then(|(l, _, _)| l.local_addr().ok());
    let webhook = match webhook {
        Some((listener, webhook, tls)) => Some(spawn_webhook(listener, webhook, tls, &issuer, stopped.clone())?),
        None => None,
    };
    let tap = tap_authenticator.map(|authenticator| {
        Relay::new(authenticator, metrics.clone(), index.clone(), issuer.clone(), own_cert.clone(), trust_domain)
    });
    let admin_state =
        AdminState { metrics, issuer, index, tap, destination: Arc::new(config.destination), webhook_addr };
    let admin = tokio::spawn(admin::serve(admin_listener, admin_state, until(stopped)));
    let tasks = Tasks {
        grpc,
        admin,
        webhook,
        own_cert: own_cert_task,
        writers: cert_tasks.into_iter().chain(bundle_tasks).collect(),
        source: cluster.map(|c| c.source),
    };

    config.shutdown.await;
    tracing::info!("shutting down");
    stop.send_replace(true);
    tasks.drain().await
}

/// What [`run`] started, for the shutdown to wait on.
struct Tasks {
    grpc: JoinHandle<()>,
    admin: JoinHandle<()>,
    webhook: Option<JoinHandle<()>>,
    own_cert: JoinHandle<()>,
    /// The webhook certificate's (the Secret watch, and in managed mode the elector and manager)
    /// and the trust bundle's (its elector and writer).
    writers: Vec<JoinHandle<()>>,
    /// The cluster's source: it has no shutdown of its own and is aborted last.
    source: Option<JoinHandle<Result<(), crate::sources::SourceError>>>,
}

impl Tasks {
    /// Once told to stop: waits for the servers to drain their calls, for the own certificate's
    /// upkeep, and (bounded) for the webhook certificate tasks (the elector releases its Lease),
    /// then stops watching the cluster.
    async fn drain(self) -> anyhow::Result<()> {
        self.grpc.await.context("gRPC server task")?;
        self.admin.await.context("admin server task")?;
        if let Some(webhook) = self.webhook {
            webhook.await.context("webhook task")?;
        }
        self.own_cert.await.context("own certificate task")?;
        for task in self.writers {
            if tokio::time::timeout(WRITER_TASK_STOP, task).await.is_err() {
                tracing::warn!("a writer task (webhook certificate, trust bundle) did not stop in time");
            }
        }
        if let Some(source) = self.source {
            source.abort();
        }
        Ok(())
    }
}

/// The exporter of the control plane's own spans, when a collector is configured.
fn start_tracing(trace: Option<&TraceConfig>) -> anyhow::Result<Option<GrpcTracing>> {
    let Some(trace) = trace else { return Ok(None) };
    let tracer = GrpcTracing::spawn(trace).context("the control plane's tracing")?;
    tracing::info!(collector = %trace.collector, sampling = %trace.sampling, "tracing gRPC calls");
    Ok(Some(tracer))
}

/// The gRPC server's TLS: our own certificate, and client certificates asked for but optional (a
/// proxy asks for its first one here). Those presented are checked against the issuer's anchors
/// as they are now; every call but Certify needs one (crate::grpc::peer).
fn grpc_tls(
    identity_name: &Name,
    issuer: &IssuerRx,
    own_cert: &Arc<CurrentCert>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let verifying = Verifying::new(identity_name.clone(), own_cert.clone());
    let verifier = OptionalMeshClientVerifier::following(issuer.clone(), verifying);
    peer::server_config(own_cert.clone(), verifier).context("TLS configuration for the gRPC server")
}

/// Workload tokens for Certify, checked by TokenReview.
fn token_authenticator(tokens: kube::Client) -> Arc<dyn Authenticator> {
    Arc::new(KubeTokens::new(tokens))
}

/// Tap tokens carry their own audience.
fn tap_authenticator(tokens: &kube::Client) -> Arc<dyn Authenticator> {
    Arc::new(KubeTokens::new(tokens.clone()).with_audience(TAP_TOKEN_AUDIENCE))
}

/// What serving the cluster started: the Destination index (admin and tap read it) and the task
/// that keeps the indexes in step with the API server.
struct ClusterServed {
    index: Index,
    source: JoinHandle<Result<(), crate::sources::SourceError>>,
}

/// Adds Destination, inbound and outbound policy to `routes`, and starts the source feeding
/// their indexes (egress with the same cluster networks inbound policy uses).
fn serve_cluster(
    routes: Routes,
    cluster: ClusterConfig,
    destination: &cnimesh_model::destination::Config,
    metrics: &Arc<Metrics>,
) -> (Routes, ClusterServed) {
    let index = Index::new();
    let egress = cnimesh_model::egress::Index::counting_refusals(
        cnimesh_model::egress::Config::new(cluster.inbound_policy.cluster_networks.clone()),
        metrics.clone(),
    );
    let outbound = cnimesh_model::outbound::Index::new(egress);
    let policy = cnimesh_model::policy::Index::new(cluster.inbound_policy);
    let routes = routes
        .add_service(DestinationService::new(index.clone(), destination.clone()).into_server())
        .add_service(InboundService::new(policy.clone()).into_server())
        .add_service(
            OutboundService::new(index.clone(), destination.clone()).with_outbound(outbound.clone()).into_server(),
        );
    let source = tokio::spawn(
        KubeSource::new(cluster.client)
            .with_policy(policy)
            .with_index(outbound)
            .with_metrics(metrics.clone())
            .run(index.clone()),
    );
    (routes, ClusterServed { index, source })
}

/// The endorsed trust bundle in every namespace: the Lease elector for its writer, and the writer.
fn spawn_trust_bundle(
    client: &kube::Client,
    election: cnimesh_runtime::leader::ElectionConfig,
    issuer: &IssuerRx,
    own_cert: &Arc<CurrentCert>,
    metrics: &Arc<Metrics>,
    stopped: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let role = crate::trust_bundle::TRUST_BUNDLE_WRITE;
    let (leadership, elector) =
        cnimesh_runtime::leader::spawn(client.clone(), role, election, metrics.clone(), stopped.clone());
    let writer =
        crate::trust_bundle::run(client.clone(), leadership, issuer.clone(), own_cert.clone(), stopped.clone());
    vec![elector, tokio::spawn(writer)]
}

/// The injection webhook on its listener, with the issuer's anchors for the proxies it injects.
fn spawn_webhook(
    listener: tokio::net::TcpListener,
    webhook: crate::inject::Webhook,
    tls: Arc<rustls::ServerConfig>,
    issuer: &IssuerRx,
    stopped: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let addr: SocketAddr = listener.local_addr()?;
    tracing::info!(%addr, "serving the injection webhook");
    let webhook = Arc::new(webhook.with_issuer_anchors(issuer.clone()));
    Ok(tokio::spawn(crate::inject::serve_webhook(listener, tls, webhook, until(stopped))))
}

async fn until(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests;
