//! `cnimesh-local apiserver`: local mode's Kubernetes API server, the in-process one of crate
//! `cnimesh-apiserver` served over HTTPS on the bridge's gateway address, where the host and every
//! pod's network namespace reach it. It keeps its objects in memory only: `down` and `up` start
//! an empty cluster.
//!
//! The server authorizes nothing beyond its tokens, and every pod reaches it, so a token is
//! required on every request: the administrator's, made here at random and written only into
//! the kubeconfig (0600, root's), or one the server issued for a ServiceAccount (`up` asks for
//! those through the token request subresource).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use cnimesh_apiserver::ClusterApi;
use serde_json::{Value, json};

use crate::runtime::random_id;

/// The API server's port on the bridge's gateway, as kube-apiserver's secure port.
pub const API_PORT: u16 = 6443;
/// The kubeconfig's cluster, context and administrator.
const CLUSTER: &str = "cnimesh-local";
const ADMIN: &str = "admin";

/// Serves until killed; the kubeconfig at `kubeconfig` (0600) is written once it listens.
pub async fn serve(listen: SocketAddr, kubeconfig: &Path, namespace: &str) -> anyhow::Result<()> {
    let api = ClusterApi::new();
    let admin_token = random_id()?;
    api.require_token(&admin_token);
    let served = api.try_serve_at(listen).await.with_context(|| format!("serving the API server on {listen}"))?;
    let config = render(&served.server(), &served.ca_pem, ADMIN, &admin_token, namespace);
    cnimesh_common::fs::write_atomic(kubeconfig, config.as_bytes(), Some(0o600))
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    tracing::info!(server = %served.server(), kubeconfig = %kubeconfig.display(), "serving local mode's API server");
    std::future::pending::<()>().await;
    Ok(())
}

/// A kubeconfig (JSON, which is YAML too) for `server` with its CA inline, as `user` with
/// `token`, whose context's namespace is `namespace` (local mode's workloads: `-n` is optional).
pub fn render(server: &str, ca_pem: &str, user: &str, token: &str, namespace: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": CLUSTER, "context": {"cluster": CLUSTER, "user": user, "namespace": namespace}}],
        "current-context": CLUSTER,
    });
    serde_json::to_string_pretty(&config).expect("a JSON value serializes")
}

/// The kubeconfig at `admin` (written by [`serve`]) for another user: `user` with `token`.
pub fn with_token(admin: &Path, user: &str, token: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(admin).with_context(|| format!("reading {}", admin.display()))?;
    let config: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not local mode's kubeconfig", admin.display()))?;
    let cluster = &config["clusters"][0]["cluster"];
    let (Some(server), Some(ca)) = (cluster["server"].as_str(), cluster["certificate-authority-data"].as_str()) else {
        anyhow::bail!("{}: no server or CA", admin.display());
    };
    let ca = base64::engine::general_purpose::STANDARD.decode(ca).context("the kubeconfig's CA")?;
    let namespace = config["contexts"][0]["context"]["namespace"].as_str().unwrap_or("default");
    Ok(render(server, &String::from_utf8_lossy(&ca), user, token, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kubeconfig_reaches_the_server_and_a_request_without_its_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        tokio::spawn({
            let path = path.clone();
            async move { serve(addr, &path, "demo").await }
        });
        while !path.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let client = |text: String| async move {
            let kubeconfig: kube::config::Kubeconfig = serde_json::from_str(&text).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
            kube::Client::try_from(config).unwrap()
        };
        let admin = client(std::fs::read_to_string(&path).unwrap()).await;
        assert_eq!(admin.default_namespace(), "demo");
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(admin);
        namespaces.list(&Default::default()).await.unwrap();
        let stranger = client(with_token(&path, "stranger", "not-the-token").unwrap()).await;
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(stranger);
        let refused = namespaces.list(&Default::default()).await.unwrap_err();
        assert!(matches!(&refused, kube::Error::Api(s) if s.code == 401), "{refused}");
    }
}
