//! Following a trust-anchors file (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS`, e.g. a mounted
//! ConfigMap, which the kubelet updates in place): rotating the mesh's root adds the new anchor
//! to the bundle, and later drops the old one (docs/install/rotation.md), and a proxy must
//! trust what the file holds without a restart that would cut its connections.
//!
//! The file's directory is watched (inotify), and the file re-read when something in it changes:
//! watching the directory rather than the file sees every way the file is replaced (the
//! kubelet's symlink swap, a rename, a rewrite), and an idle proxy does no work at all. It is
//! also re-read every [`SAFETY_READ`] in case an event was missed, and every [`POLL`] if the
//! directory cannot be watched. A file that does not parse, or holds no
//! usable certificate, is logged and the anchors in force stay: an emptied bundle must not make
//! the proxy trust nothing (or anything).
//!
//! On a cluster the injector gives both: the PEM text (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM`)
//! the proxy starts with, and the namespace's trust-bundle ConfigMap as the file, taken only with
//! the control plane's endorsement (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY`): whoever
//! may write ConfigMaps in the namespace cannot add an anchor. Anchors given as PEM text alone are
//! fixed for the pod's life.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cnimesh_identity::Name;
use cnimesh_identity::tls::Anchors;
use prometheus_client::metrics::counter::Counter;

/// How often the file is looked at when its directory cannot be watched.
pub const POLL: Duration = Duration::from_secs(1);
/// How often the file is re-read even without an event (an inotify queue overflow, the
/// directory itself replaced).
pub const SAFETY_READ: Duration = Duration::from_secs(60);
/// Writers change the bundle and its endorsement one after the other (the kubelet in one swap,
/// others file by file): the file is read once events have been quiet this long, so a half-done
/// change is not read and refused.
const SETTLE: Duration = Duration::from_millis(100);

/// Wakes the follower when something in `dir` changes; `None` when it cannot be watched (the
/// follower then polls). Access events (its own reads among them) are left out.
fn watch(dir: &Path) -> Option<(notify::RecommendedWatcher, Arc<tokio::sync::Notify>)> {
    use notify::Watcher;
    let changed = Arc::new(tokio::sync::Notify::new());
    let wake = changed.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if !matches!(&event, Ok(e) if matches!(e.kind, notify::EventKind::Access(_))) {
            wake.notify_one();
        }
    });
    let mut watcher = watcher.map_err(|error| tracing::warn!(%error, "cannot watch trust anchors; polling")).ok()?;
    match watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        Ok(()) => Some((watcher, changed)),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot watch the trust anchors' directory; polling");
            None
        }
    }
}

/// Returns once the file may have changed: after an event and [`SETTLE`] of quiet (at most ten
/// times that), after [`SAFETY_READ`] without one, or after [`POLL`] when there is no watch.
async fn changed(watch: Option<&tokio::sync::Notify>) {
    let Some(changed) = watch else {
        return tokio::time::sleep(POLL).await;
    };
    if tokio::time::timeout(SAFETY_READ, changed.notified()).await.is_ok() {
        // Bounded: a directory that never goes quiet must not postpone the read for ever.
        let read_by = tokio::time::Instant::now() + SETTLE * 10;
        while tokio::time::Instant::now() < read_by && tokio::time::timeout(SETTLE, changed.notified()).await.is_ok() {}
    }
}

/// The endorsement of the bundle at `path`: beside it, `<file name>.endorsement` (another key
/// of the same ConfigMap, so the kubelet swaps both at once).
pub fn endorsement_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(cnimesh_identity::endorsement::ENDORSEMENT_SUFFIX);
    path.with_file_name(name)
}

/// Keeps `anchors` equal to what `path` holds, forever (the proxy's life). With `signer`, a bundle
/// is taken only when its endorsement ([`endorsement_path`]) is `signer`'s, verified under the
/// anchors in force ([`cnimesh_identity::endorsement`]); anything else is logged and those stay.
/// An endorsement made before `since` (Unix seconds: when the injector gave the pod its anchors)
/// is passed over quietly: at best it says what the pod's anchors already say, at worst it is a
/// replay of a bundle holding an anchor a rotation has dropped since, which a proxy that has taken
/// no endorsement yet could not tell from a rotation otherwise.
pub async fn follow(path: PathBuf, anchors: Arc<Anchors>, signer: Option<Name>, since: Option<u64>, refused: Counter) {
    let endorsement = signer.as_ref().map(|_| endorsement_path(&path));
    let read = |path: &Path| std::fs::read(path);
    // Unendorsed, the file was loaded at start; endorsed, the anchors in force came from the
    // pod's environment and the file is yet to be checked.
    // The signing time of the endorsement in force: an older one is a replay.
    let mut newest = None;
    let mut last = match &endorsement {
        None => read(&path).ok().map(|bundle| (bundle, None)),
        Some(_) => None,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let watch = watch(dir);
    // Read once at once (the watch is set: nothing is missed between), then on each change.
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            changed(watch.as_ref().map(|(_, changed)| &**changed)).await;
        }
        let seen = match (tokio::fs::read(&path).await, &endorsement) {
            (Ok(bundle), None) => Ok((bundle, None)),
            // A bundle without its endorsement is refused below, not waited for.
            (Ok(bundle), Some(endorsement)) => Ok((bundle, tokio::fs::read(endorsement).await.ok())),
            (Err(error), _) => Err(error),
        };
        let seen = match seen {
            Ok(seen) => seen,
            Err(error) => {
                if last.take().is_some() {
                    tracing::warn!(path = %path.display(), %error, "trust anchors unreadable; keeping those in force");
                }
                continue;
            }
        };
        if last.as_ref() == Some(&seen) {
            continue;
        }
        match take(&path, &seen, &anchors, signer.as_ref(), since, &mut newest) {
            Ok(true) => {
                tracing::info!(path = %path.display(), anchors = anchors.len(), "trust anchors reloaded");
            }
            Ok(false) => {
                tracing::debug!(path = %path.display(), "trust anchors endorsed before the pod's own; keeping those in force");
            }
            Err(error) => {
                refused.inc();
                tracing::warn!(path = %path.display(), error = format!("{error:#}"), "trust anchors not reloaded; keeping those in force")
            }
        }
        last = Some(seen);
    }
}

/// Puts the bundle in `seen` in force, once endorsed by `signer` when one is required, and no
/// earlier than the endorsement in force (`newest`): a replayed older bundle may still hold an
/// anchor a rotation has since dropped. One endorsed before `since` is passed over (`Ok(false)`).
fn take(
    path: &Path,
    seen: &(Vec<u8>, Option<Vec<u8>>),
    anchors: &Arc<Anchors>,
    signer: Option<&Name>,
    since: Option<u64>,
    newest: &mut Option<u64>,
) -> anyhow::Result<bool> {
    let mut signed_at = None;
    if let Some(signer) = signer {
        let (bundle, endorsement) = seen;
        let endorsement =
            endorsement.as_ref().with_context(|| format!("{} has no endorsement beside it", path.display()))?;
        let at = cnimesh_identity::endorsement::verify(bundle, endorsement, anchors.clone(), signer)
            .with_context(|| format!("the endorsement of {}", path.display()))?;
        if let Some(newest) = *newest {
            anyhow::ensure!(
                at >= newest,
                "{} was endorsed at {at}, before the bundle in force (endorsed at {newest}): a replay",
                path.display()
            );
        }
        if since.is_some_and(|since| at < since) {
            return Ok(false);
        }
        signed_at = Some(at);
    }
    let certs = cnimesh_identity::pem::certs(&seen.0, &format!("trust anchors {}", path.display()))?;
    anchors.set(cnimesh_identity::tls::roots(&certs)?)?;
    *newest = signed_at.or(*newest);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use cnimesh_identity::ca::{CaPem, Signer, new_issuer, new_trust_anchor};
    use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::super::config::TrustAnchors;
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const CONTROL: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

    /// Waits (bounded) until `anchors` holds `n`.
    async fn wait_for(anchors: &Anchors, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while anchors.len() != n {
            assert!(tokio::time::Instant::now() < deadline, "never {n} anchors");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A mesh certificate for `name` from `issuer`: its chain and key.
    fn certified(issuer: &CaPem, name: &str) -> Arc<rustls::sign::CertifiedKey> {
        let signer = Signer::new(issuer).unwrap();
        let name = Name::parse(name).unwrap();
        let (key, _) = cnimesh_identity::ca::new_csr(&name).unwrap();
        let now = SystemTime::now();
        let leaf = signer.sign(&name, &key, now - HOUR, now + HOUR).unwrap();
        let chain = vec![leaf, signer.issuer_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        cnimesh_identity::tls::certified_key(chain, key).unwrap()
    }

    /// `bundle` and its endorsement by a mesh certificate for `name` from `issuer`, signed `at`.
    fn write_endorsed_at(path: &Path, bundle: &str, issuer: &CaPem, name: &str, at: SystemTime) {
        let certified = certified(issuer, name);
        let endorsement = cnimesh_identity::endorsement::endorse(bundle.as_bytes(), &certified, at).unwrap();
        // The endorsement first: the bundle's change is what the follower acts on.
        std::fs::write(endorsement_path(path), endorsement).unwrap();
        std::fs::write(path, bundle).unwrap();
    }

    /// [`write_endorsed_at`] now.
    fn write_endorsed(path: &Path, bundle: &str, issuer: &CaPem, name: &str) {
        write_endorsed_at(path, bundle, issuer, name, SystemTime::now());
    }

    #[tokio::test]
    async fn an_endorsed_file_rotates_the_anchors_and_one_endorsed_by_anyone_else_is_never_taken() {
        let old = new_trust_anchor("cluster.local", HOUR).unwrap();
        let old_issuer = new_issuer(&old, "cluster.local", HOUR).unwrap();
        let new = new_trust_anchor("cluster.local", HOUR).unwrap();
        let attacker = new_trust_anchor("cluster.local", HOUR).unwrap();
        let dir = std::env::temp_dir().join(format!("cnimesh-proxy-endorsed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        let anchors =
            Anchors::new(super::super::trust_anchors(&TrustAnchors::Pem(old.cert_pem.clone())).unwrap()).unwrap();
        let refused = Counter::default();
        tokio::spawn(follow(path.clone(), anchors.clone(), Some(Name::parse(CONTROL).unwrap()), None, refused.clone()));

        // A ConfigMap writer's bundle, endorsed by a workload's valid certificate, by the
        // control plane's name from the attacker's own CA, or not endorsed at all.
        let planted = format!("{}{}", old.cert_pem, attacker.cert_pem);
        write_endorsed(&path, &planted, &old_issuer, "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        tokio::time::sleep(POLL * 3).await;
        let attacker_issuer = new_issuer(&attacker, "cluster.local", HOUR).unwrap();
        write_endorsed(&path, &format!("{planted}\n"), &attacker_issuer, CONTROL);
        tokio::time::sleep(POLL * 3).await;
        std::fs::remove_file(endorsement_path(&path)).unwrap();
        std::fs::write(&path, format!("{planted}\n\n")).unwrap();
        tokio::time::sleep(POLL * 3).await;
        assert_eq!(anchors.len(), 1, "no planted anchor is taken");
        assert_eq!(refused.get(), 3, "each refusal counted");

        // The rotation: old + new endorsed under old; the issuer switched (endorsed under new);
        // then new alone.
        let both = format!("{}{}", old.cert_pem, new.cert_pem);
        let now = SystemTime::now();
        write_endorsed_at(&path, &both, &old_issuer, CONTROL, now - Duration::from_secs(120));
        wait_for(&anchors, 2).await;
        let issuer_of_new = new_issuer(&new, "cluster.local", HOUR).unwrap();
        let switched = format!("{both}\n");
        write_endorsed_at(&path, &switched, &issuer_of_new, CONTROL, now - Duration::from_secs(60));
        tokio::time::sleep(POLL * 3).await;
        write_endorsed_at(&path, &new.cert_pem, &issuer_of_new, CONTROL, now);
        wait_for(&anchors, 1).await;
        // The switch's bundle replayed, endorsed as it was (its chain verifies under the new
        // anchor): older than the one in force, refused; the dropped anchor stays out.
        write_endorsed_at(&path, &switched, &issuer_of_new, CONTROL, now - Duration::from_secs(60));
        tokio::time::sleep(POLL * 3).await;
        assert_eq!(anchors.len(), 1, "a replayed older bundle is refused");
        assert_eq!(refused.get(), 4);
        let under_new = certified(&issuer_of_new, CONTROL);
        cnimesh_identity::tls::verify(anchors.clone(), &under_new.cert, &Name::parse(CONTROL).unwrap())
            .expect("the one anchor in force is the new one");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_freshly_started_proxy_refuses_a_replayed_bundle_endorsed_before_its_pod_was_admitted() {
        // The rotation is over: the old anchor was dropped and the pod admitted since holds the new
        // one alone. A ConfigMap writer puts back the bundle of the switch ({old, new}, endorsed
        // under the new issuer, before the pod was admitted): the proxy has taken no endorsement
        // yet, so only the admission time can tell it the bundle is a replay.
        let old = new_trust_anchor("cluster.local", HOUR).unwrap();
        let new = new_trust_anchor("cluster.local", HOUR).unwrap();
        let issuer_of_new = new_issuer(&new, "cluster.local", HOUR).unwrap();
        let dir = std::env::temp_dir().join(format!("cnimesh-proxy-replay-fresh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        let admitted = SystemTime::now() - Duration::from_secs(30);
        let switched = format!("{}{}", old.cert_pem, new.cert_pem);
        write_endorsed_at(&path, &switched, &issuer_of_new, CONTROL, admitted - Duration::from_secs(600));
        let anchors =
            Anchors::new(super::super::trust_anchors(&TrustAnchors::Pem(new.cert_pem.clone())).unwrap()).unwrap();
        let since = admitted.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let control = Some(Name::parse(CONTROL).unwrap());
        tokio::spawn(follow(path.clone(), anchors.clone(), control, Some(since), Counter::default()));
        tokio::time::sleep(POLL * 3).await;
        assert_eq!(anchors.len(), 1, "the dropped anchor stays out");
        // An endorsement made after admission is taken.
        write_endorsed(&path, &switched, &issuer_of_new, CONTROL);
        wait_for(&anchors, 2).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_rewritten_bundle_is_followed_and_a_broken_one_keeps_the_anchors_in_force() {
        let pem =
            |_| cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap().cert_pem;
        let (old, new) = (pem(0), pem(1));
        let path = std::env::temp_dir().join(format!("cnimesh-proxy-anchors-follow-{}.crt", std::process::id()));
        std::fs::write(&path, &old).unwrap();
        let anchors = Anchors::new(super::super::trust_anchors(&TrustAnchors::File(path.clone())).unwrap()).unwrap();
        tokio::spawn(follow(path.clone(), anchors.clone(), None, None, Counter::default()));
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

    #[tokio::test]
    async fn a_bundle_swapped_in_as_the_kubelet_swaps_a_configmap_volume_is_followed() {
        // The kubelet's atomic writer: the keys live in a timestamped directory that `..data`
        // links to, each key links through `..data`, and an update renames a new `..data` link
        // over the old one. Only that rename happens in the watched directory itself.
        let dir = std::env::temp_dir().join(format!("cnimesh-proxy-anchors-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..1")).unwrap();
        let pem =
            |_| cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap().cert_pem;
        let (old, new) = (pem(0), pem(1));
        std::fs::write(dir.join("..1/ca.crt"), &old).unwrap();
        std::os::unix::fs::symlink("..1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/ca.crt", dir.join("ca.crt")).unwrap();
        let path = dir.join("ca.crt");
        let anchors = Anchors::new(super::super::trust_anchors(&TrustAnchors::File(path.clone())).unwrap()).unwrap();
        tokio::spawn(follow(path, anchors.clone(), None, None, Counter::default()));
        tokio::task::yield_now().await;
        std::fs::create_dir_all(dir.join("..2")).unwrap();
        std::fs::write(dir.join("..2/ca.crt"), format!("{old}{new}")).unwrap();
        std::os::unix::fs::symlink("..2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        wait_for(&anchors, 2).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
