//! `cnimesh tap`: live requests and responses from the proxies of a resource, like `linkerd viz
//! tap`, read from the control plane's tap relay (`cnimesh_control::tap`; its query and lines are
//! [`cnimesh_model::tap`]'s):
//! - in a cluster through the API server's service proxy
//!   (`/api/v1/namespaces/cnimesh/services/cnimesh-control:admin/proxy/tap?…`), with a short-lived
//!   token of the ServiceAccount `cnimesh/cnimesh-tap` for the audience `tap.cnimesh.io` from a
//!   TokenRequest (the operator needs
//!   the Role `cnimesh-tap`: `serviceaccounts/token` create and `services/proxy`);
//! - in local mode (`--local DIR`) the same way, through local mode's API server.
//!
//! [`render`] prints the lines; `cnimesh top` ([`super::top`]) reads the same stream.
//!
//! Layer: runtime (operator CLI).

pub mod render;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use cnimesh_common::names::{CONTROL_NAME, CONTROL_NAMESPACE, TAP_SERVICE_ACCOUNT, TAP_TOKEN_AUDIENCE};
use futures::io::{AsyncBufRead, AsyncBufReadExt};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;

use self::render::TapOutput;
use super::ClusterArgs;
use super::query_error::QueryError;
use super::stat::mesh::Resource;
use cnimesh_model::tap::{TOKEN_HEADER, TapLine, TapQuery};

/// How long the token minted for one tap lives: the API server's minimum. The relay checks it
/// once, when the tap starts.
const TOKEN_SECONDS: i64 = 600;

/// What to tap: shared by `tap` and `top`.
#[derive(Debug, Clone, clap::Args)]
pub struct Filter {
    /// `<kind>[/<name>]`: namespace, deployment, statefulset, daemonset, replicaset, job, cronjob
    /// or pod (kubectl's short names too); its proxies are tapped, both directions.
    pub resource: Resource,
    /// The resource's namespace [default: the kubeconfig context's; with --local, the namespace
    /// of local mode's workloads].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Only requests to this resource's pods (`kind[/name]`), or to `egress[/<hostname>]`: an
    /// EgressNetwork's destinations, by the hostname the proxy saw (HTTP Host).
    #[arg(long, value_name = "RESOURCE")]
    pub to: Option<Resource>,
    /// The namespace of --to [default: the resource's].
    #[arg(long, value_name = "NS")]
    pub to_namespace: Option<String>,
    /// Only requests whose path starts with this.
    #[arg(long)]
    pub path: Option<String>,
    /// Only requests with this method.
    #[arg(long)]
    pub method: Option<String>,
    /// Only requests with this :authority (exact).
    #[arg(long)]
    pub authority: Option<String>,
    /// Only requests with this scheme (http, https).
    #[arg(long)]
    pub scheme: Option<String>,
    /// At most this many new requests a second are shown (0: all).
    #[arg(long, default_value_t = cnimesh_model::tap::query::DEFAULT_MAX_RPS)]
    pub max_rps: f64,
    /// Local mode's directory (`cnimesh-local up --dir DIR`): its cluster, a shorthand for
    /// `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
}

impl Filter {
    fn resource_text(&self) -> String {
        cnimesh_model::tap::query::resource_text(&self.resource)
    }

    /// The relay's query for these flags and `limit`, in `default_namespace` unless `-n` says
    /// otherwise; invalid values are named.
    pub fn query(&self, limit: u32, default_namespace: &str) -> anyhow::Result<TapQuery> {
        let namespace = self.namespace.clone().unwrap_or_else(|| default_namespace.to_string());
        let mut q = TapQuery::new(self.resource.clone(), namespace);
        q.to = self.to.clone().map(|to| (to, self.to_namespace.clone().unwrap_or_else(|| q.namespace.clone())));
        q.method = match &self.method {
            Some(m) => Some(http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).context("--method")?),
            None => None,
        };
        q.path = self.path.clone();
        q.authority = self.authority.clone();
        q.scheme = self.scheme.clone();
        q.limit = limit;
        q.max_rps = self.max_rps;
        // The relay's own checks, here, so that a mistake is reported before anything is asked.
        TapQuery::parse(&q.to_query_string()).map_err(|e| anyhow::anyhow!("{e}"))
    }
}

#[derive(Debug, clap::Args)]
pub struct TapArgs {
    #[command(flatten)]
    pub filter: Filter,
    /// Stop after this many requests (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
    #[arg(short = 'o', long, value_enum, default_value_t = TapOutput::Text)]
    pub output: TapOutput,
}

/// The relay's lines as they come.
pub type Lines = Pin<Box<dyn Stream<Item = anyhow::Result<TapLine>> + Send>>;

/// Starts a tap: the relay's answer as lines, or why it refused.
pub async fn open(cluster: &ClusterArgs, filter: &Filter, limit: u32) -> anyhow::Result<Lines> {
    let client = cluster.or_local(filter.local.as_deref()).client().await?;
    let query = filter.query(limit, client.default_namespace()).map_err(bad_query)?.to_query_string();
    let reader: Pin<Box<dyn AsyncBufRead + Send>> = Box::pin(open_cluster(&client, &query).await?);
    Ok(lines(reader))
}

/// A filter the relay cannot be asked (a bad flag or resource), typed so callers tell it apart.
fn bad_query(error: anyhow::Error) -> QueryError {
    QueryError::BadQuery(format!("{error:#}"))
}

/// A reader of NDJSON as tap lines; a line that is not one is an error naming it.
pub fn lines(reader: Pin<Box<dyn AsyncBufRead + Send>>) -> Lines {
    Box::pin(reader.lines().map_err(|e| anyhow::anyhow!("reading the tap stream: {e}")).filter_map(|line| async move {
        match line {
            Ok(line) if line.trim().is_empty() => None,
            Ok(line) => Some(
                serde_json::from_str::<TapLine>(&line).with_context(|| format!("not a tap event: {}", line.trim())),
            ),
            Err(e) => Some(Err(e)),
        }
    }))
}

/// Through the API server's service proxy, with a token minted for `cnimesh/cnimesh-tap`.
pub async fn open_cluster(client: &kube::Client, query: &str) -> anyhow::Result<impl AsyncBufRead + Send + use<>> {
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![TAP_TOKEN_AUDIENCE.to_string()],
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(TAP_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| {
            let what = format!(
                "a token for the ServiceAccount {CONTROL_NAMESPACE}/{TAP_SERVICE_ACCOUNT} (tapping needs the Role \
                 {TAP_SERVICE_ACCOUNT} in {CONTROL_NAMESPACE})"
            );
            QueryError::from_kube(what, &e)
        })?
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .context("the TokenRequest answered no token")?;
    let uri = format!("/api/v1/namespaces/{CONTROL_NAMESPACE}/services/{CONTROL_NAME}:admin/proxy/tap?{query}");
    let request = http::Request::get(&uri).header(TOKEN_HEADER, token).body(Vec::new())?;
    Ok(client.request_stream(request).await.map_err(|e| QueryError::from_kube("tap", &e))?)
}

/// `GET /tap?query` at a relay's admin address over plain HTTP/1.
pub async fn open_at(addr: SocketAddr, token: &str, query: &str) -> anyhow::Result<impl AsyncBufRead + Send + use<>> {
    let stream = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("connecting to {addr}: no answer within 10s"))?
        .with_context(|| format!("connecting to {addr}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .with_context(|| format!("{addr}"))?;
    tokio::spawn(conn);
    let request = http::Request::get(format!("/tap?{query}"))
        .header(http::header::HOST, addr.to_string())
        .header(TOKEN_HEADER, token)
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let response = sender.send_request(request).await.with_context(|| format!("{addr}/tap"))?;
    let status = response.status();
    let body = http_body_util::BodyExt::into_data_stream(response.into_body()).map_err(std::io::Error::other);
    if !status.is_success() {
        let text: Vec<bytes::Bytes> = body.try_collect().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&text.concat()).trim().to_string();
        anyhow::bail!("tap: HTTP {status}: {text}");
    }
    Ok(body.into_async_read())
}

pub async fn tap_main(cluster: &ClusterArgs, args: TapArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let mut lines = open(cluster, &args.filter, args.limit).await?;
    let (mut events, mut errors) = (0usize, 0usize);
    while let Some(line) = lines.next().await {
        let line = line?;
        match line.body {
            cnimesh_model::tap::Body::Error { .. } => errors += 1,
            _ => events += 1,
        }
        out.write_all(render::line(&line, args.output).as_bytes())?;
        out.flush()?;
    }
    anyhow::ensure!(events > 0 || errors == 0, "no proxy of {} could be tapped", args.filter.resource_text());
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
