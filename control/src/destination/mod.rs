//! Destination: service discovery for proxies, as `io.linkerd.proxy.destination.Destination`
//! (linkerd2-proxy-api), so a stock linkerd2-proxy can use it as well as ours (docs/architecture.md, "Control plane protocol").
//!
//! Cluster state flows one way: a [`Source`](crate::sources::Source) turns Services,
//! EndpointSlices (discovery.k8s.io/v1) and Pods into [`Change`]s on an [`Index`]; the
//! [`DestinationService`](crate::grpc::destination::DestinationService) streams answers from that
//! index. The source is [`KubeSource`] (in [`crate::sources`]): kube-rs watchers (list, then
//! watch with resume; a 410 Gone re-lists), all namespaces, never polling. Needs list/watch on
//! services, pods and endpointslices. Tests and local mode run it against the in-process API
//! server (cnimesh-apiserver); an object that does not read as its kind is logged and its last
//! good version stays in force.
//!
//! [`KubeSource`]: crate::sources::KubeSource
//!
//! Wiring (what [`crate::serve`] does):
//! ```no_run
//! use cnimesh_control::destination::{Config, Index};
//! use cnimesh_control::grpc::destination::DestinationService;
//! use cnimesh_control::sources::{KubeSource, Source};
//!
//! async fn serve(client: kube::Client, addr: std::net::SocketAddr) -> anyhow::Result<()> {
//!     let index = Index::new();
//!     tokio::spawn(KubeSource::new(client).run(index.clone()));
//!     let destination = DestinationService::new(index, Config::default()).into_server();
//!     tonic::transport::Server::builder().add_service(destination).serve(addr).await?;
//!     Ok(())
//! }
//! ```
//!
//! Answers:
//! - `Get("<svc>.<ns>.svc.<cluster-domain>:<port>")` (also `<svc>.<ns>.svc:<port>` and
//!   `<svc>.<ns>:<port>`) streams `add`/`remove` as ready endpoints change. The first message comes
//!   at once: an `add` if the service has endpoints, else `no_endpoints{exists: true}`; unknown
//!   services get `no_endpoints{exists: false}` (not NotFound: the stream stays open and turns into
//!   adds if the service appears, and meanwhile the client may use DNS). Malformed paths and IP
//!   paths get InvalidArgument naming the expected form.
//! - Endpoints of meshed pods (a `cnimesh-proxy` container, or native-sidecar init container)
//!   carry the pod's service-account identity and an H2 hint, or the Opaque hint on ports listed in
//!   the pod's `config.cnimesh.io/opaque-ports`. Named targetPorts resolve through the slice's
//!   ports, else the pod's container ports.
//! - `GetProfile("<ip>:<port>")`: a ClusterIP gives the service's FQDN (the proxy then calls
//!   `Get`), a pod IP gives that endpoint (`endpoint`, with identity and hint), anything else a
//!   passthrough profile; `GetProfile("<service name>:<port>")` gives the FQDN if the service
//!   exists. `opaque_protocol` follows the opaque-ports annotation of the Service or Pod. Profiles
//!   are live streams too.
//!
//! A multicluster gateway marks its requests (`context_token`) and is answered as if only the
//! Services exported through it existed ([`caller`]).
//!
//! Until the source has loaded every kind once (the first list, or the first read of the
//! directory), requests wait: answering earlier could tell a proxy that a service does not exist
//! when it has merely not been listed yet. [`Index::is_ready`] is meant for the readiness probe.
//!
//! Streams share per-service (and per-IP) watch channels holding one snapshot. The updates of a
//! `Get` stream are worked out and encoded once per service port and change, and shared by every
//! stream that stood at the same state ([`updates`]); an idle stream has no task or timer of our own.
//!
//! Layer: model/index (pure): this module and its children use neither the kube client nor tonic;
//! the sources are [`crate::sources`], the gRPC service [`crate::grpc::destination`].

pub mod accrual;
pub mod app_protocol;
pub mod caller;
pub(crate) mod follower;
pub(crate) mod index;
mod model;
pub(crate) mod path;
pub mod read;
pub(crate) mod resolve;
#[cfg(test)]
pub(crate) mod test_objects;
pub(crate) mod updates;

pub use caller::Caller;
pub use index::{Change, Index, IndexStats};
pub use model::{
    Conflict, Declaration, KINDS, Kind, Object, PodRecord, PortSet, ServiceRecord, SliceRecord, declared_for_pod_port,
};
#[doc(hidden)]
pub use path::parse_for_fuzzing as parse_path_for_fuzzing;

/// What the answers depend on besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Suffix of service names after `.svc.`; Kubernetes' `--cluster-domain`.
    pub cluster_domain: String,
    /// The trust domain identities are issued in (docs/architecture.md, "Names and numbers").
    pub trust_domain: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".to_string(),
            trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
