//! `cnimesh-control` in a pod of its own (not captured, as in a cluster), with a fresh trust
//! anchor and issuer from `ca init`, on the Kubernetes code path (`--kube`) against the
//! cluster's API server ([`Cluster`]) served in the same pod: tests change the cluster through
//! [`Control::cluster`], and workloads' tokens are the API server's, checked by TokenReview.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::cluster::Cluster;
use crate::pod::Pod;
use crate::sidecar::{PROXY_UID, Sidecar, http_in};

pub const CONTROL_PORT: u16 = 4190;
pub const ADMIN_PORT: u16 = 9990;

/// How a second cluster's issuer is made from the shared anchor.
#[derive(Debug, Clone, Copy)]
pub enum Issuer {
    /// As `cnimesh ca issuer` makes it: constrained to its trust domain.
    Constrained,
    /// As issuers were made before they carried name constraints.
    Unconstrained,
}

pub struct Control {
    child: Child,
    /// The `serve` command, for [`Control::restart`].
    serve: Command,
    netns: PathBuf,
    dir: TempDir,
    pub addr: SocketAddr,
    /// The trust domain its identities are issued in (`cluster.local` unless started by
    /// [`Control::start_sharing_anchor`]).
    pub trust_domain: String,
    /// The cluster's API server, served in the control plane's pod: what the tests apply their
    /// objects to and what the control plane watches and reviews tokens with.
    pub cluster: Cluster,
    /// The control plane's kubeconfig (its ServiceAccount's token), for more replicas.
    kubeconfig: PathBuf,
}

/// The control plane's namespace and ServiceAccount, as the install manifests create them.
const CONTROL_ACCOUNT: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: cnimesh}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: cnimesh-control, namespace: cnimesh}\n";

/// The identity of a service account in the default trust domain.
pub fn identity(ns: &str, sa: &str) -> String {
    format!("{sa}.{ns}.serviceaccount.identity.cnimesh.cluster.local")
}

impl Control {
    /// Generates a CA and starts the control plane in `pod` with `args` added to `serve`.
    pub fn start(bin: &Path, pod: &Pod<'_>, args: &[&str]) -> anyhow::Result<Self> {
        Self::launch(bin, pod, args, None, &[])
    }

    /// [`Control::start`] with the cluster already holding `objects` (name, YAML stream), applied
    /// as [`Cluster::apply_yaml`] does, so that the control plane's first answers know them (it
    /// is ready once it has listed them).
    pub fn start_with_objects(
        bin: &Path,
        pod: &Pod<'_>,
        args: &[&str],
        objects: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::launch(bin, pod, args, None, objects)
    }

    /// A second cluster's control plane, with trust domain `trust_domain` and an
    /// issuer signed by `anchor`'s trust anchor (the anchor the clusters share, as `cnimesh ca
    /// issuer` makes it from the anchor's key), started in `pod` with `args` added to `serve`.
    pub fn start_sharing_anchor(
        bin: &Path,
        pod: &Pod<'_>,
        args: &[&str],
        anchor: &Control,
        trust_domain: &str,
    ) -> anyhow::Result<Self> {
        Self::launch(bin, pod, args, Some((anchor, trust_domain, Issuer::Constrained)), &[])
    }

    /// The control plane in `pod` with `args` added to `serve`: with its own new CA, or, with
    /// `shared`, an issuer of the given kind for its trust domain signed by another control
    /// plane's anchor.
    pub fn start_with_ca(
        bin: &Path,
        pod: &Pod<'_>,
        args: &[&str],
        shared: Option<(&Control, &str, Issuer)>,
    ) -> anyhow::Result<Self> {
        Self::launch(bin, pod, args, shared, &[])
    }

    fn launch(
        bin: &Path,
        pod: &Pod<'_>,
        args: &[&str],
        shared: Option<(&Control, &str, Issuer)>,
        objects: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("cnimesh-control").tempdir()?;
        // Proxies run as UID 2102 and read the trust anchors from here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let issuer = dir.path().join("issuer");
        let mut trust_domain = cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string();
        match shared {
            // What `cnimesh ca init --dir` writes (the control binary no longer has a `ca` command).
            None => {
                cnimesh_model::ca_init::run(&cnimesh_model::ca_init::CaInit::new(&issuer))?;
            }
            Some((anchor, domain, kind)) => {
                use cnimesh_model::identity::issuer::{ANCHORS_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE};
                let from = anchor.issuer_dir();
                let root = cnimesh_identity::ca::CaPem {
                    cert_pem: std::fs::read_to_string(from.join(ANCHORS_FILE))?,
                    key_pem: std::fs::read_to_string(from.join(cnimesh_model::ca_init::ANCHOR_KEY_FILE))?,
                };
                let ours = match kind {
                    Issuer::Constrained => cnimesh_identity::ca::new_issuer(&root, domain, Duration::from_secs(86400))?,
                    Issuer::Unconstrained => {
                        cnimesh_identity::ca::new_unconstrained_issuer(&root, domain, Duration::from_secs(86400))?
                    }
                };
                std::fs::create_dir_all(&issuer)?;
                std::fs::write(issuer.join(ANCHORS_FILE), &root.cert_pem)?;
                write_secret(&issuer.join(ISSUER_KEY_FILE), &ours.key_pem, None)?;
                std::fs::write(issuer.join(ISSUER_CERT_FILE), &ours.cert_pem)?;
                trust_domain = domain.to_string();
            }
        }
        std::fs::set_permissions(&issuer, std::fs::Permissions::from_mode(0o755))?;
        let cluster = Cluster::serve_in(&pod.netns.path(), pod.ipv4().into())?;
        cluster.apply_yaml("cnimesh-control.yaml", CONTROL_ACCOUNT)?;
        for (name, yaml) in objects {
            cluster.apply_yaml(name, yaml)?;
        }
        let kubeconfig = cluster.kubeconfig_for("cnimesh", cnimesh_common::names::CONTROL_NAME)?;
        let mut serve = Command::new("ip");
        serve
            .args(["netns", "exec", pod.netns.name()])
            .arg(bin)
            .args(["serve", "--addr", &format!("0.0.0.0:{CONTROL_PORT}")])
            .args(["--admin-addr", &format!("0.0.0.0:{ADMIN_PORT}")])
            .arg("--issuer-dir")
            .arg(&issuer)
            .arg("--kube")
            .args(["--trust-domain", &trust_domain])
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("CNIMESH_CONTROL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = serve.spawn()?;
        let control = Self {
            child,
            serve,
            netns: pod.netns.path(),
            dir,
            addr: SocketAddr::new(IpAddr::V4(pod.ipv4()), CONTROL_PORT),
            trust_domain,
            cluster,
            kubeconfig,
        };
        control.wait_ready()?;
        Ok(control)
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(self.admin("/ready"), Ok((200, _))) {
            anyhow::ensure!(Instant::now() < deadline, "cnimesh-control did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts the control plane again after [`Control::stop`], with the same issuer, cluster and
    /// settings (a replacement pod mounting the same Secret).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.child = self.serve.spawn()?;
        self.wait_ready()
    }

    /// Stops the control plane with SIGKILL (proxies must carry on with what they know).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn admin(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_in(&self.netns, &format!("127.0.0.1:{ADMIN_PORT}"), "GET", path, "")
    }

    pub fn metrics(&self) -> String {
        self.admin("/metrics").map(|(_, b)| b).unwrap_or_default()
    }

    pub fn trust_anchors(&self) -> PathBuf {
        self.dir.path().join("issuer/ca.crt")
    }

    pub fn issuer_dir(&self) -> PathBuf {
        self.dir.path().join("issuer")
    }

    /// The control plane's kubeconfig file (0600): its ServiceAccount's token for the cluster.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Makes ServiceAccount `ns/sa` if it is missing and has the API server issue it a token for
    /// Identity's audience, as the kubelet projects one; the proxy gets it in a file of its own
    /// (0600, owned by the proxy UID).
    pub fn token(&self, ns: &str, sa: &str) -> anyhow::Result<PathBuf> {
        let token = self.issue(ns, sa, cnimesh_identity::TOKEN_AUDIENCE)?;
        self.proxy_token(&format!("{ns}-{sa}"), &token)
    }

    /// A token of the tap relay's ServiceAccount (cnimesh/cnimesh-tap) for the tap audience, as
    /// `cnimesh tap` requests one: what the control plane's `/tap` accepts.
    pub fn tap_token(&self) -> anyhow::Result<String> {
        self.issue("cnimesh", "cnimesh-tap", cnimesh_common::names::TAP_TOKEN_AUDIENCE)
    }

    /// A token of ServiceAccount `ns/sa` (made if missing) for `audience`, from the API server.
    fn issue(&self, ns: &str, sa: &str, audience: &str) -> anyhow::Result<String> {
        if self.cluster.api.get("v1", "ServiceAccount", ns, sa).is_none() {
            self.cluster.api.put(serde_json::json!({
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns},
            }));
        }
        Ok(self.cluster.api.issue_token(ns, sa, &[audience])?)
    }

    /// A token file for a proxy with arbitrary contents (a forged one, say).
    pub fn proxy_token(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(format!("proxy-token-{name}"));
        write_secret(&path, token, Some(PROXY_UID))?;
        Ok(path)
    }

    /// The identity of a service account in this control plane's trust domain.
    pub fn identity(&self, ns: &str, sa: &str) -> String {
        format!("{sa}.{ns}.serviceaccount.identity.cnimesh.{}", self.trust_domain)
    }

    /// The sidecar's identity settings for service account `sa` of namespace `ns`.
    pub fn proxy_env(&self, ns: &str, sa: &str, token: &Path) -> Vec<(String, String)> {
        let mut env = self.proxy_env_default_domain(ns, sa, token);
        if self.trust_domain != cnimesh_identity::DEFAULT_TRUST_DOMAIN {
            // The control plane proves its own identity in its trust domain.
            env.push(("CNIMESH_PROXY_IDENTITY_SVC_NAME".into(), self.identity("cnimesh", "cnimesh-control")));
        }
        env
    }

    fn proxy_env_default_domain(&self, ns: &str, sa: &str, token: &Path) -> Vec<(String, String)> {
        vec![
            ("CNIMESH_PROXY_IDENTITY_NAME".into(), self.identity(ns, sa)),
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS".into(), self.trust_anchors().display().to_string()),
            ("CNIMESH_PROXY_IDENTITY_TOKEN_FILE".into(), token.display().to_string()),
            ("CNIMESH_PROXY_IDENTITY_ADDR".into(), self.addr.to_string()),
            ("CNIMESH_PROXY_IDENTITY_MAX_BACKOFF_MS".into(), "1000".into()),
        ]
    }
}

fn write_secret(path: &Path, contents: &str, owner: Option<u32>) -> anyhow::Result<()> {
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    if let Some(uid) = owner {
        chown(path, Some(uid), Some(uid))?;
    }
    Ok(())
}

impl Control {
    /// A policy test's cast in namespace `shop`: the proxy of `api` (workload `shop:api-0`),
    /// which takes its inbound policy and destinations from this control plane, and a meshed
    /// proxy per `(pod, service account)` client that knows api's identity, so the clients'
    /// requests to api are mTLS and api's policy sees who sent them.
    pub fn api_and_clients(
        &self,
        proxy: &Path,
        api: &Pod<'_>,
        clients: &[(&Pod<'_>, &str)],
    ) -> anyhow::Result<(Sidecar, Vec<Sidecar>)> {
        let mut api_env = self.proxy_env("shop", "api", &self.token("shop", "api")?);
        api_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), self.addr.to_string()));
        api_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:api-0".into()));
        let api_proxy = Sidecar::start(proxy, &api.netns, &env_refs(&api_env))?;
        let clients = clients
            .iter()
            .map(|(pod, sa)| {
                let mut env = self.proxy_env("shop", sa, &self.token("shop", sa)?);
                env.push((
                    "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
                    format!("{}={}", api.ipv4(), identity("shop", "api")),
                ));
                Sidecar::start(proxy, &pod.netns, &env_refs(&env))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((api_proxy, clients))
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces a file in one rename, as Kubernetes volume updates do (a watcher of the file never
/// reads it half-written): the issuer's files, for one.
pub fn write_atomically(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Borrows `(String, String)` pairs as the `&[(&str, &str)]` the sidecar takes.
pub fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
