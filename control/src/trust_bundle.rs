//! The trust bundle in every namespace: the ConfigMap `cnimesh-trust-bundle`, holding the trust
//! anchors the control plane's issuer directory holds (`ca.crt`) and their endorsement by the
//! control plane's own mesh certificate (`ca.crt.endorsement`, [`cnimesh_identity::endorsement`]).
//! Injected proxies mount it and re-read it, so a rotation of the mesh's root (anchors added,
//! issuer switched, old anchor dropped) reaches running proxies without restarting them. A proxy
//! takes a new bundle only with a valid endorsement, so the ConfigMap's writers in a namespace
//! cannot add an anchor of their own; without one the proxy keeps the anchors it started with
//! (from its environment).
//!
//! One writer at a time (the Lease `cnimesh-control-trust-bundle`): every replica has its own
//! certificate, and two writers would endorse with different keys in turn. The bundle is written
//! to every namespace not being deleted, when a namespace appears, when the anchors change and
//! when the control plane's certificate is renewed (an endorsement carries the certificate, and a
//! proxy started later checks it then), and again everywhere every ten minutes, which restores a
//! bundle someone else changed. The control plane may create ConfigMaps but patch only
//! this one name (daemonset/control-plane.yaml).
//!
//! Layer: runtime (kube writes, under a Lease).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use rustls::sign::CertifiedKey;
use serde_json::json;
use tokio::sync::watch;

use cnimesh_identity::endorsement::{ENDORSEMENT_SUFFIX, endorse};
use cnimesh_identity::tls::CurrentCert;
use cnimesh_model::identity::IssuerRx;
use cnimesh_model::inject::{TRUST_BUNDLE_CONFIG_MAP, TRUST_BUNDLE_KEY};
use cnimesh_runtime::leader::Leadership;

/// The Lease role of the bundle's writer.
pub const TRUST_BUNDLE_WRITE: &str = "trust-bundle";
/// The field manager of the writes.
pub const FIELD_MANAGER: &str = "cnimesh-control";
/// How often the writer looks whether its own certificate was renewed, and retries failed writes.
const LOOK_EVERY: Duration = Duration::from_secs(30);
/// Every this many looks the bundle is applied everywhere again, so that a ConfigMap someone else
/// changed is restored (its proxies meanwhile keep the anchors they trust).
const REAPPLY_EVERY_LOOKS: u32 = 20;

/// The ConfigMap's data for `anchors_pem`, endorsed by `own`.
pub fn data(
    anchors_pem: &str,
    own: &CertifiedKey,
) -> Result<BTreeMap<String, String>, cnimesh_identity::endorsement::EndorsementError> {
    let endorsement = endorse(anchors_pem.as_bytes(), own, std::time::SystemTime::now())?;
    Ok(BTreeMap::from([
        (TRUST_BUNDLE_KEY.to_string(), anchors_pem.to_string()),
        (format!("{TRUST_BUNDLE_KEY}{ENDORSEMENT_SUFFIX}"), endorsement),
    ]))
}

/// Keeps the bundle written in every namespace while this replica leads, until `stopped`.
pub async fn run(
    client: kube::Client,
    mut leadership: Leadership,
    mut issuer: IssuerRx,
    own: Arc<CurrentCert>,
    mut stopped: watch::Receiver<bool>,
) {
    let namespaces_api: Api<Namespace> = Api::all(client.clone());
    let mut namespaces = watcher::watcher(namespaces_api, watcher::Config::default()).boxed();
    let mut state =
        State { client, live: BTreeSet::new(), listing: BTreeSet::new(), written: HashMap::new(), signed: None };
    let mut look = tokio::time::interval(LOOK_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looks = 0u32;
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            event = namespaces.next() => match event {
                Some(Ok(event)) => state.namespace_event(event),
                Some(Err(error)) => tracing::warn!(%error, "watching namespaces for the trust bundle; retrying"),
                None => return,
            },
            changed = issuer.changed() => if changed.is_err() { return },
            _ = look.tick() => {
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(REAPPLY_EVERY_LOOKS) {
                    state.written.clear();
                }
            }
            () = leadership.acquired(), if !leadership.is_leading() => {
                // Another replica may have written its own endorsement meanwhile.
                state.written.clear();
            }
        }
        if !leadership.is_leading() {
            continue;
        }
        let anchors = issuer.borrow().as_ref().map(|i| i.anchors_pem().to_string());
        let (Some(anchors), Some(own)) = (anchors, own.get()) else { continue };
        state.write(&anchors, &own, &leadership).await;
    }
}

/// Anchors, the certificate that endorsed them, and the ConfigMap data made of both.
type Signed = (String, Arc<CertifiedKey>, Arc<BTreeMap<String, String>>);

struct State {
    client: kube::Client,
    /// Namespaces that exist and are not being deleted.
    live: BTreeSet<String>,
    /// During a (re-)list: the namespaces seen so far.
    listing: BTreeSet<String>,
    /// What each namespace was last given.
    written: HashMap<String, Arc<BTreeMap<String, String>>>,
    /// The data for the anchors and certificate it was made from.
    signed: Option<Signed>,
}

impl State {
    fn namespace_event(&mut self, event: Event<Namespace>) {
        let name = |ns: &Namespace| ns.metadata.name.clone().unwrap_or_default();
        let alive = |ns: &Namespace| ns.metadata.deletion_timestamp.is_none();
        match event {
            Event::Init => self.listing.clear(),
            Event::InitApply(ns) => {
                if alive(&ns) {
                    self.listing.insert(name(&ns));
                }
            }
            Event::InitDone => {
                self.live = std::mem::take(&mut self.listing);
                self.written.retain(|ns, _| self.live.contains(ns));
            }
            Event::Apply(ns) if alive(&ns) => {
                self.live.insert(name(&ns));
            }
            Event::Apply(ns) | Event::Delete(ns) => {
                self.live.remove(&name(&ns));
                self.written.remove(&name(&ns));
            }
        }
    }

    /// Writes the bundle where it is missing or stale; a failed write is retried at the next look.
    async fn write(&mut self, anchors: &str, own: &Arc<CertifiedKey>, leadership: &Leadership) {
        let data = match &self.signed {
            Some((a, key, data)) if a == anchors && Arc::ptr_eq(key, own) => data.clone(),
            _ => match data(anchors, own) {
                Ok(data) => {
                    let data = Arc::new(data);
                    self.signed = Some((anchors.to_string(), own.clone(), data.clone()));
                    data
                }
                Err(error) => {
                    tracing::error!(%error, "cannot endorse the trust bundle");
                    return;
                }
            },
        };
        let stale: Vec<String> = self
            .live
            .iter()
            .filter(|ns| self.written.get(*ns).is_none_or(|w| !Arc::ptr_eq(w, &data)))
            .cloned()
            .collect();
        for namespace in stale {
            if !leadership.is_leading() {
                return;
            }
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
            let object = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": TRUST_BUNDLE_CONFIG_MAP,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/part-of": "cnimesh", "app.kubernetes.io/managed-by": FIELD_MANAGER},
                },
                "data": *data,
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match api.patch(TRUST_BUNDLE_CONFIG_MAP, &params, &Patch::Apply(&object)).await {
                Ok(_) => {
                    tracing::debug!(%namespace, "trust bundle written");
                    self.written.insert(namespace, data.clone());
                }
                Err(error) => tracing::warn!(%namespace, %error, "cannot write the trust bundle; retrying"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cnimesh_apiserver::ClusterApi;
    use cnimesh_identity::Name;
    use serde_json::{Value, json};

    use super::*;
    use cnimesh_model::identity::issuer::tests::write_pki;
    use cnimesh_model::identity::{Issuer, own_cert};

    /// Only guards against a hung test.
    const PATIENCE: Duration = Duration::from_secs(30);
    const CONTROL: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

    fn namespace(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    }

    /// The bundle and endorsement in `namespace` once they hold `anchors`.
    async fn bundle_in(api: &ClusterApi, namespace: &str, anchors: &str) -> (String, String) {
        let read = || {
            let data = api.get("v1", "ConfigMap", namespace, TRUST_BUNDLE_CONFIG_MAP)?["data"].clone();
            let text = |key: &str| data[key].as_str().map(str::to_string);
            Some((text(TRUST_BUNDLE_KEY)?, text(&format!("{TRUST_BUNDLE_KEY}{ENDORSEMENT_SUFFIX}"))?))
        };
        tokio::time::timeout(PATIENCE, async {
            loop {
                if let Some(found) = read().filter(|(bundle, _)| bundle == anchors) {
                    return found;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the bundle in {namespace}: {:?}", read()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_namespace_gets_the_anchors_endorsed_by_the_control_plane_and_a_rotation_follows() {
        let api = ClusterApi::new();
        api.put(namespace("shop"));
        let dir = tempfile::tempdir().unwrap();
        let anchor = write_pki(dir.path(), Duration::from_secs(3600));
        let (issuer_tx, issuer) = watch::channel(Some(Arc::new(Issuer::load(dir.path()).unwrap())));
        let control = Name::parse(CONTROL).unwrap();
        let own = own_cert::issue_from_dir(dir.path(), &control, Duration::from_secs(600)).unwrap();
        let (_stop, stopped) = watch::channel(false);
        let leadership = Leadership::always(TRUST_BUNDLE_WRITE);
        tokio::spawn(run(api.client(), leadership, issuer, own.clone(), stopped));

        let trusted =
            cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "a").unwrap())
                .unwrap();
        let (bundle, endorsement) = bundle_in(&api, "shop", &anchor.cert_pem).await;
        cnimesh_identity::endorsement::verify(bundle.as_bytes(), endorsement.as_bytes(), trusted.clone(), &control)
            .expect("endorsed by the control plane under the anchors in force");

        // A namespace made later gets it too.
        api.put(namespace("billing"));
        bundle_in(&api, "billing", &anchor.cert_pem).await;

        // The rotation's first step: a second anchor beside the first, endorsed under the first.
        let next = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let both = format!("{}{}", anchor.cert_pem, next.cert_pem);
        std::fs::write(dir.path().join("ca.crt"), &both).unwrap();
        issuer_tx.send_replace(Some(Arc::new(Issuer::load(dir.path()).unwrap())));
        for namespace in ["shop", "billing"] {
            let (bundle, endorsement) = bundle_in(&api, namespace, &both).await;
            cnimesh_identity::endorsement::verify(bundle.as_bytes(), endorsement.as_bytes(), trusted.clone(), &control)
                .unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_that_does_not_lead_writes_nothing() {
        let api = ClusterApi::new();
        api.put(namespace("shop"));
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), Duration::from_secs(3600));
        let (_issuer_tx, issuer) = watch::channel(Some(Arc::new(Issuer::load(dir.path()).unwrap())));
        let own =
            own_cert::issue_from_dir(dir.path(), &Name::parse(CONTROL).unwrap(), Duration::from_secs(600)).unwrap();
        let (_stop, stopped) = watch::channel(false);
        tokio::spawn(run(api.client(), Leadership::never(TRUST_BUNDLE_WRITE), issuer, own, stopped));
        api.nth_watch("/api/v1/namespaces", 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(api.get("v1", "ConfigMap", "shop", TRUST_BUNDLE_CONFIG_MAP).is_none());
    }
}
