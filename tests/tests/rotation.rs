//! Trust anchor and issuer rotation under live mTLS traffic: a client pod calls a
//! server pod through their proxies without pause while the three steps of
//! `cnimesh identity rotate` (the same functions, applied to the files the kubelet would update)
//! run: bundle old + new anchors, switch the issuer, drop the old anchor. Not one request may
//! fail, and the proxies must end up holding certificates from the new issuer and trusting only
//! the new anchor.
//!
//! The control plane reads its issuer Secret as a directory (it reloads it); the proxies read
//! the trust-anchors ConfigMap as a file (they follow it). Certificates live 10 s so that proxies
//! renew theirs under the new issuer within the test.

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

/// The issuer directory as the Secret's files.
fn read_stored(issuer_dir: &Path) -> Stored {
    let read = |f: &str| std::fs::read_to_string(issuer_dir.join(f)).unwrap();
    Stored {
        anchors: cnimesh_control::webhook_certs::split_pem(&read("ca.crt")),
        issuer_cert: read("tls.crt"),
        issuer_key: read("tls.key"),
    }
}

/// `kubectl apply` of the step's Secret and ConfigMap, as the kubelet then updates the volumes:
/// each file replaced whole. The key before the certificate: the control plane rejects the
/// mismatched pair in between and keeps the last good issuer.
fn apply(next: &Stored, issuer_dir: &Path, anchors_file: &Path) {
    write_atomically(&issuer_dir.join("tls.key"), &next.issuer_key);
    write_atomically(&issuer_dir.join("tls.crt"), &next.issuer_cert);
    write_atomically(&issuer_dir.join("ca.crt"), &next.anchors_pem());
    write_atomically(anchors_file, &next.anchors_pem());
    std::fs::set_permissions(anchors_file, std::fs::Permissions::from_mode(0o644)).unwrap();
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

    // The trust-anchors ConfigMap, mounted into both proxies.
    let config_map = tempfile::Builder::new().prefix("cnimesh-anchors").tempdir().unwrap();
    std::fs::set_permissions(config_map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let anchors_file = config_map.path().join("ca.crt");
    std::fs::copy(control.trust_anchors(), &anchors_file).unwrap();
    std::fs::set_permissions(&anchors_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let env_for = |pod: &Pod<'_>| {
        let mut env = control.proxy_env("shop", &pod.name, &control.token("shop", &pod.name).unwrap());
        for (var, value) in &mut env {
            if var == ANCHORS_VAR {
                *value = anchors_file.display().to_string();
            }
        }
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
    apply(&bundled, &issuer_dir, &anchors_file);
    for proxy in proxies {
        eventually("every proxy trusts both anchors", Duration::from_secs(20), || {
            identity_json(proxy)["trust_anchors"] == json!(2)
        });
    }
    traffic_flows("with the bundle");

    // 2. switch-issuer: proxies renew their certificates under the new issuer.
    let switched = identity_rotate::switch_issuer(&bundled, &new_issuer.cert_pem, &new_issuer.key_pem).unwrap();
    apply(&switched, &issuer_dir, &anchors_file);
    for proxy in proxies {
        eventually("every proxy holds a certificate from the new issuer", Duration::from_secs(40), || {
            identity_json(proxy)["certificate"]["issuer"]["serial"] == json!(new_serial)
        });
    }
    traffic_flows("under the new issuer");

    // 3. drop-old: only the new anchor is trusted.
    let done = identity_rotate::drop_old(&switched).unwrap();
    assert_eq!(done.anchors, std::slice::from_ref(&new_anchor.cert_pem));
    apply(&done, &issuer_dir, &anchors_file);
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
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("rotation: {ok} requests succeeded, {failed} failed, through bundle, switch-issuer and drop-old");
    assert_eq!(failed, 0, "failed requests during the rotation: {:?}", failures.lock());
    for proxy in proxies {
        let held = identity_json(proxy);
        assert_eq!(held["certificate"]["issuer"]["serial"], json!(new_serial), "{held}");
        assert_ne!(new_serial, old_serial);
    }
}
