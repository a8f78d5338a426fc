//! Following a trust-anchors file (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS`, e.g. a mounted
//! ConfigMap, which the kubelet updates in place): rotating the mesh's root adds the new anchor
//! to the bundle, and later drops the old one (docs/install/rotation.md), and a proxy must
//! trust what the file holds without a restart that would cut its connections.
//!
//! The file is re-read every [`POLL`]: a few kilobytes, and it works whatever way the file is
//! replaced (a symlink swap, a rename, a rewrite). A file that does not parse, or holds no
//! usable certificate, is logged and the anchors in force stay: an emptied bundle must not make
//! the proxy trust nothing (or anything).
//!
//! Anchors given as PEM text (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM`, what the injector
//! sets) are fixed for the pod's life: a rotation restarts those workloads after the bundle step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_identity::tls::Anchors;

use super::config::TrustAnchors;

/// How often the file is looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// Keeps `anchors` equal to what `path` holds, forever (the proxy's life).
pub async fn follow(path: PathBuf, anchors: Arc<Anchors>) {
    let mut last = std::fs::read(&path).ok();
    loop {
        tokio::time::sleep(POLL).await;
        let read = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(error) => {
                if last.take().is_some() {
                    tracing::warn!(path = %path.display(), %error, "trust anchors unreadable; keeping those in force");
                }
                continue;
            }
        };
        if last.as_ref() == Some(&read) {
            continue;
        }
        match super::trust_anchors(&TrustAnchors::File(path.clone())).and_then(|roots| Ok(anchors.set(roots)?)) {
            Ok(()) => {
                tracing::info!(path = %path.display(), anchors = anchors.len(), "trust anchors reloaded");
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), error = format!("{error:#}"), "trust anchors not reloaded; keeping those in force")
            }
        }
        last = Some(read);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rewritten_bundle_is_followed_and_a_broken_one_keeps_the_anchors_in_force() {
        let pem =
            |_| cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap().cert_pem;
        let (old, new) = (pem(0), pem(1));
        let path = std::env::temp_dir().join(format!("cnimesh-proxy-anchors-follow-{}.crt", std::process::id()));
        std::fs::write(&path, &old).unwrap();
        let anchors = Anchors::new(super::super::trust_anchors(&TrustAnchors::File(path.clone())).unwrap()).unwrap();
        tokio::spawn(follow(path.clone(), anchors.clone()));
        // Let it read the file as it is now (a current-thread runtime: it runs until it sleeps).
        tokio::task::yield_now().await;
        let wait_for = |n: usize| {
            let anchors = anchors.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while anchors.len() != n {
                    assert!(tokio::time::Instant::now() < deadline, "never {n} anchors");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        std::fs::write(&path, format!("{old}{new}")).unwrap();
        wait_for(2).await;
        std::fs::write(&path, "").unwrap();
        tokio::time::sleep(POLL * 3).await;
        assert_eq!(anchors.len(), 2, "an empty bundle keeps the anchors in force");
        std::fs::write(&path, &new).unwrap();
        wait_for(1).await;
        let _ = std::fs::remove_file(&path);
    }
}
