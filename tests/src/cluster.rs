//! A cluster's API server for the end-to-end tests: the in-process server ([`ClusterApi`]) served
//! over HTTPS the way a cluster's processes reach theirs — inside a pod's network namespace at the
//! pod's address (the control plane's pod, which the mirror of another cluster dials too), or on
//! the host's loopback (the node agent) — with the admin token required and kubeconfig files
//! (0600) for the processes that use it.
//!
//! Tests change the cluster as `kubectl apply -f FILE` would: [`Cluster::apply_yaml`]
//! ([`ClusterApi::apply_yaml`]) puts every object of a YAML stream and remembers which objects
//! came from that name, so applying the name
//! again deletes what it no longer holds and [`Cluster::delete_file`] deletes them all. The
//! test itself reads and writes [`Cluster::api`] in memory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;
use tempfile::TempDir;

use cnimesh_apiserver::{ClusterApi, Served};

/// The port an API server listens on in a pod, as kube-apiserver's secure port.
pub const API_PORT: u16 = 6443;
/// The token of the cluster's administrator (what `kubeconfig()` carries).
const ADMIN_TOKEN_BYTES: usize = 24;

pub struct Cluster {
    /// The cluster's state: what tests put, get and wait on.
    pub api: Arc<ClusterApi>,
    /// Where it is served (the pod's address and [`API_PORT`], or 127.0.0.1:ephemeral).
    pub addr: SocketAddr,
    ca_pem: String,
    admin_token: String,
    dir: TempDir,
    /// Ends the serving thread (and its connections) when dropped.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Cluster {
    /// Served inside the network namespace at `netns` on `ip`:[`API_PORT`]. The server's threads
    /// live in that netns too, so what it dials itself (the pod and service proxies) reaches the
    /// pods as a cluster's API server reaches them.
    pub fn serve_in(netns: &Path, ip: IpAddr) -> anyhow::Result<Self> {
        let netns = std::fs::File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
        Self::serve(Some(netns), SocketAddr::new(ip, API_PORT))
    }

    /// Served on the host's 127.0.0.1 (an ephemeral port): for processes of the host's netns.
    pub fn serve_on_host() -> anyhow::Result<Self> {
        Self::serve(None, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    fn serve(netns: Option<std::fs::File>, addr: SocketAddr) -> anyhow::Result<Self> {
        let api = ClusterApi::new();
        let admin_token = random_token()?;
        api.require_token(&admin_token);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (served_tx, served_rx) = std::sync::mpsc::channel::<anyhow::Result<(SocketAddr, String)>>();
        let serving = api.clone();
        std::thread::Builder::new().name("apiserver".into()).spawn(move || {
            // Threads inherit the netns of the thread that makes them: the runtime's workers and
            // its blocking pool, made below, all live in the pod's.
            if let Some(netns) = netns
                && let Err(e) = nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)
            {
                return drop(served_tx.send(Err(anyhow::anyhow!("entering the pod's netns: {e}"))));
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
                Ok(r) => r,
                Err(e) => return drop(served_tx.send(Err(e.into()))),
            };
            runtime.block_on(async move {
                let served: Served = match serving.try_serve_at(addr).await {
                    Ok(s) => s,
                    Err(e) => return drop(served_tx.send(Err(e.into()))),
                };
                let _ = served_tx.send(Ok((served.addr, served.ca_pem.clone())));
                let _ = stopped.await;
                drop(served);
            });
        })?;
        let (addr, ca_pem) = served_rx.recv().context("the API server's thread ended")??;
        let dir = tempfile::Builder::new().prefix("cnimesh-cluster").tempdir()?;
        let cluster = Self { api, addr, ca_pem, admin_token, dir, _stop: stop };
        Ok(cluster)
    }

    /// `https://ADDR:PORT`.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA (PEM) its serving certificate chains to, as a kubeconfig's
    /// `certificate-authority-data` carries it.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for this cluster as `name`, authenticating with `token`.
    pub fn kubeconfig_text(&self, name: &str, token: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n    namespace: default\ncurrent-context: {name}\nusers:\n- name: {name}\n  user:\n    token: {token}\n",
            self.server()
        )
    }

    /// The administrator's kubeconfig file (0600): what the control plane, the node agent and the
    /// CLI are given unless a test says otherwise.
    pub fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("admin.kubeconfig");
        if !path.exists() {
            let text = self.kubeconfig_text("cluster", &self.admin_token);
            cnimesh_common::fs::write_atomic(&path, text.as_bytes(), Some(0o600)).expect("writing the kubeconfig");
        }
        path
    }

    /// A kubeconfig file (0600) authenticating as service account `namespace/name`, with a token
    /// this server issued for it.
    pub fn kubeconfig_for(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        let token = self.api.issue_token(namespace, name, &[])?;
        let path = self.dir.path().join(format!("{namespace}-{name}.kubeconfig"));
        let text = self.kubeconfig_text("cluster", &token);
        cnimesh_common::fs::write_atomic(&path, text.as_bytes(), Some(0o600))?;
        Ok(path)
    }

    /// A kube client as the administrator, over HTTPS like every other client.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.server().parse().expect("the server's URL"));
        let ca = cnimesh_identity::pem::certs(self.ca_pem.as_bytes(), "the API server's CA").expect("its CA");
        config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
        config.auth_info.token = Some(self.admin_token.clone().into());
        kube::Client::try_from(config).expect("a client for the API server")
    }

    /// Every object of the YAML (or JSON) stream `yaml`, put as `kubectl apply -f <name>` would:
    /// objects `name` held before and no longer does are deleted.
    pub fn apply_yaml(&self, name: &str, yaml: &str) -> anyhow::Result<()> {
        Ok(self.api.apply_yaml(name, yaml)?)
    }

    /// [`Cluster::apply_yaml`] of one object.
    pub fn apply(&self, name: &str, object: &Value) -> anyhow::Result<()> {
        self.apply_yaml(name, &object.to_string())
    }

    /// Deletes every object applied as `name` (`kubectl delete -f <name>`).
    pub fn delete_file(&self, name: &str) {
        self.api.delete_applied(name)
    }
}

/// A fresh random token (hex), as a bearer token must be unguessable even in a test.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; ADMIN_TOKEN_BYTES];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
