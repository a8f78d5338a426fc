//! The API server's version, for `SidecarMode::Auto`: read from `/version` once at start and
//! then every few minutes (a control plane outlives API server upgrades), never on the
//! admission path, so a review never waits on the API server.
//!
//! Layer: sources (kube): the API server's `/version`.

use std::time::Duration;

use tokio::sync::watch;

use cnimesh_model::inject::ServerVersion;

/// How often a known version is read again.
const REFRESH: Duration = Duration::from_secs(600);
/// Retries while the version is not known yet: short at first, so the first pods of a fresh
/// install already get the right form.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Reads the server's version with `client` now and then, until the receiver is dropped.
/// Until the first answer the receiver holds `None` (auto then means a regular container).
pub fn watch_server_version(client: kube::Client) -> watch::Receiver<Option<ServerVersion>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut retry = RETRY_FIRST;
        loop {
            let wait = match client.apiserver_version().await {
                Ok(info) => match ServerVersion::from_info(&info) {
                    Some(version) => {
                        let changed = tx.send_if_modified(|known| known.replace(version) != Some(version));
                        if changed {
                            tracing::info!(%version, native_sidecars = version.has_native_sidecars(), "API server version");
                        }
                        retry = RETRY_FIRST;
                        REFRESH
                    }
                    None => {
                        tracing::warn!(major = %info.major, minor = %info.minor, "unreadable API server version");
                        REFRESH
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, "reading the API server version; sidecar form unchanged");
                    retry = (retry * 2).min(RETRY_MAX);
                    retry
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kube client whose API server answers `/version` with `minor`.
    pub(crate) fn server(minor: &'static str) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| async move {
            assert_eq!(req.uri().path(), "/version");
            let body = serde_json::json!({
                "major": "1", "minor": minor, "gitVersion": format!("v1.{minor}.3"), "gitCommit": "", "gitTreeState": "",
                "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"
            });
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().body(kube::client::Body::from(body.to_string().into_bytes())).unwrap(),
            )
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn the_version_is_read_from_the_api_server() {
        for (minor, expected) in [("24", 24), ("29+", 29)] {
            let mut rx = watch_server_version(server(minor));
            rx.wait_for(Option::is_some).await.unwrap();
            assert_eq!(*rx.borrow(), Some(ServerVersion { major: 1, minor: expected }));
        }
    }
}
