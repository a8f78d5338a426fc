//! Trust anchor and issuer rotation under live mTLS traffic: a client pod calls a
//! server pod through their proxies without pause while the three steps of
//! `cnimesh identity rotate` (the same functions, applied to the files the kubelet would update)
//! run: bundle old + new anchors, switch the issuer, drop the old anchor. Not one request may
//! fail, and the proxies must end up holding certificates from the new issuer and trusting only
//! the new anchor.
//!
//! The control plane reads its issuer Secret as a directory (it reloads it). The proxies are
//! configured as the injector configures them: the anchors of the moment as PEM, then their
//! namespace's trust bundle, the ConfigMap the control plane writes and endorses, mounted as files
//! (copied here as the kubelet would), taken only with the control plane's endorsement. A planted
//! ConfigMap (an extra anchor beside the real endorsement) is never taken. No proxy restarts.
//! Certificates live 10 s so that proxies renew theirs under the new issuer within the test.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cnimesh_cli::identity_rotate::{self, Stored};
use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity, write_atomically};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_identity::ca;
use serde_json::{Value, json};

const ANCHORS_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS";
const BUNDLE: &str = "cnimesh-trust-bundle";

/// The kubelet's part: the namespace's trust-bundle ConfigMap copied into `dir` whenever it
/// changes (the endorsement first), until `stop`.
fn mount_bundle(control: &Control, dir: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let api = control.cluster.api.clone();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let mut last = Value::Null;
        while !stop.load(Ordering::SeqCst) {
            let data = api.get("v1", "ConfigMap", "shop", BUNDLE).map(|c| c["data"].clone()).unwrap_or_default();
            if data != last {
                for key in ["ca.crt.endorsement", "ca.crt"] {
                    if let Some(text) = data[key].as_str() {
                        write_atomically(&dir.join(key), text);
                        std::fs::set_permissions(dir.join(key), std::fs::Permissions::from_mode(0o644)).unwrap();
                    }
                }
                last = data;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// The issuer directory as the Secret's files.
fn read_stored(issuer_dir: &Path) -> Stored {
    let read = |f: &str| std::fs::read_to_string(issuer_dir.join(f)).unwrap();
    Stored {
        anchors: cnimesh_identity::pem::split_pem(&read("ca.crt")),
        issuer_cert: read("tls.crt"),
        issuer_key: read("tls.key"),
    }
}

/// `kubectl apply` of the step's issuer Secret, as the kubelet then updates the volume: each file
/// replaced whole. The key before the certificate: the control plane rejects the mismatched pair
/// in between and keeps the last good issuer. The proxies' bundle is the control plane's to write.
fn apply(next: &Stored, issuer_dir: &Path) {
    write_atomically(&issuer_dir.join("tls.key"), &next.issuer_key);
    write_atomically(&issuer_dir.join("tls.crt"), &next.issuer_cert);
    write_atomically(&issuer_dir.join("ca.crt"), &next.anchors_pem());
}

fn identity_json(proxy: &Sidecar) -> Value {
    proxy
        .admin("GET", "/identity.json", "")
        .ok()
        .and_then(|(_, body)| serde_json::from_str(&body).ok())
        .unwrap_or_default()
}

fn issuer_serial(pem: &str) -> String {
    let der = cnimesh_identity::pem::certs(pem.as_bytes(), "issuer").unwrap().remove(0);
    cnimesh_identity::tls::serial_of(&der).unwrap()
}

#[test]
fn rotating_the_trust_anchor_and_issuer_under_live_mtls_traffic_fails_no_request() {
    if !require_root("rotating_the_trust_anchor_and_issuer_under_live_mtls_traffic_fails_no_request") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &["--cert-lifetime", "10s"]).unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let _apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();

    // The namespace's trust bundle, mounted into both proxies as the injector mounts it.
    control.cluster.apply_yaml("shop.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n").unwrap();
    let config_map = tempfile::Builder::new().prefix("cnimesh-trust-bundle").tempdir().unwrap();
    std::fs::set_permissions(config_map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mounted = Arc::new(AtomicBool::new(false));
    let kubelet = mount_bundle(&control, config_map.path(), mounted.clone());
    let anchors_file = config_map.path().join("ca.crt");
    let pem_at_start = std::fs::read_to_string(control.trust_anchors()).unwrap();
    eventually("the control plane wrote shop's trust bundle", Duration::from_secs(20), || anchors_file.exists());
    let env_for = |pod: &Pod<'_>| {
        let mut env = control.proxy_env("shop", &pod.name, &control.token("shop", &pod.name).unwrap());
        env.retain(|(var, _)| var != ANCHORS_VAR);
        env.push((ANCHORS_VAR.into(), anchors_file.display().to_string()));
        env.push(("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM".into(), pem_at_start.clone()));
        env.push(("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY".into(), identity("cnimesh", "cnimesh-control")));
        env
    };
    let server_proxy = Sidecar::start(&bins.proxy, &server.netns, &env_refs(&env_for(&server))).unwrap();
    let mut client_env = env_for(&client);
    client_env.push((
        "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
        format!("{}={}", server.ipv4(), identity("shop", &server.name)),
    ));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&client_env)).unwrap();
    let proxies = [&client_proxy, &server_proxy];

    // Live traffic: one request after the other, each on a new connection from the client app.
    let (ok, failed, stop) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let failures = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let traffic = {
        let (ok, failed, stop, failures) = (ok.clone(), failed.clone(), stop.clone(), failures.clone());
        let (netns, addr) = (client.netns.path(), format!("{}:{}", server.ipv4(), apps::HTTP_PORT));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match http_in(&netns, &addr, "POST", "/echo", "rotation") {
                    Ok((200, body)) if body.contains("rotation") => ok.fetch_add(1, Ordering::SeqCst),
                    other => {
                        failures.lock().push(format!("{other:?}"));
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
        })
    };
    let traffic_flows = |what: &str| {
        let from = ok.load(Ordering::SeqCst);
        eventually(&format!("requests succeed {what}"), Duration::from_secs(20), || {
            ok.load(Ordering::SeqCst) >= from + 20
        });
    };
    traffic_flows("before the rotation");

    let issuer_dir = control.issuer_dir();
    let start = read_stored(&issuer_dir);
    let old_serial = issuer_serial(&start.issuer_cert);
    for proxy in proxies {
        let held = identity_json(proxy);
        assert_eq!(held["certificate"]["issuer"]["serial"], json!(old_serial), "{held}");
    }
    let new_anchor = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
    let new_issuer = ca::new_issuer(&new_anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
    let new_serial = issuer_serial(&new_issuer.cert_pem);

    // 1. bundle: every proxy trusts old + new before anything is signed under the new anchor.
    let bundled = identity_rotate::bundle(&start, &new_anchor.cert_pem).unwrap();
    apply(&bundled, &issuer_dir);
    for proxy in proxies {
        eventually("every proxy trusts both anchors", Duration::from_secs(20), || {
            identity_json(proxy)["trust_anchors"] == json!(2)
        });
    }
    traffic_flows("with the bundle");

    // Whoever may write ConfigMaps in the namespace plants a third anchor beside the control
    // plane's endorsement: the proxies never take it.
    let attacker = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
    let mut planted = control.cluster.api.get("v1", "ConfigMap", "shop", BUNDLE).unwrap();
    let bundle = planted["data"]["ca.crt"].as_str().unwrap().to_string();
    planted["data"]["ca.crt"] = json!(format!("{bundle}{}", attacker.cert_pem));
    control.cluster.api.put(planted);
    eventually("the planted bundle is mounted", Duration::from_secs(10), || {
        std::fs::read_to_string(&anchors_file).is_ok_and(|b| b.contains(&attacker.cert_pem))
    });
    std::thread::sleep(Duration::from_secs(3)); // three of the proxies' re-reads
    for proxy in proxies {
        assert_eq!(identity_json(proxy)["trust_anchors"], json!(2), "the planted anchor is not trusted");
        let refused = proxy.metric("identity_trust_anchors_refused_total");
        assert!(refused >= 1.0, "the refusal is counted: {refused}");
    }

    // 2. switch-issuer: proxies renew their certificates under the new issuer.
    let switched = identity_rotate::switch_issuer(&bundled, &new_issuer.cert_pem, &new_issuer.key_pem).unwrap();
    apply(&switched, &issuer_dir);
    for proxy in proxies {
        eventually("every proxy holds a certificate from the new issuer", Duration::from_secs(40), || {
            identity_json(proxy)["certificate"]["issuer"]["serial"] == json!(new_serial)
        });
    }
    traffic_flows("under the new issuer");

    // 3. drop-old: only the new anchor is trusted.
    let done = identity_rotate::drop_old(&switched).unwrap();
    assert_eq!(done.anchors, std::slice::from_ref(&new_anchor.cert_pem));
    apply(&done, &issuer_dir);
    for proxy in proxies {
        eventually("every proxy trusts the new anchor only", Duration::from_secs(20), || {
            identity_json(proxy)["trust_anchors"] == json!(1)
        });
    }
    // A renewal under the new anchor alone, with traffic still flowing.
    let renewed_before = client_proxy.metric("identity_cert_refresh_total{result=\"success\"}");
    eventually("the client proxy renews its certificate after the old anchor is gone", Duration::from_secs(20), || {
        client_proxy.metric("identity_cert_refresh_total{result=\"success\"}") > renewed_before
    });
    traffic_flows("after the old anchor is dropped");

    stop.store(true, Ordering::SeqCst);
    traffic.join().unwrap();
    mounted.store(true, Ordering::SeqCst);
    kubelet.join().unwrap();
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("rotation: {ok} requests succeeded, {failed} failed, through bundle, switch-issuer and drop-old");
    assert_eq!(failed, 0, "failed requests during the rotation: {:?}", failures.lock());
    for proxy in proxies {
        let held = identity_json(proxy);
        assert_eq!(held["certificate"]["issuer"]["serial"], json!(new_serial), "{held}");
        assert_ne!(new_serial, old_serial);
    }
}
