//! Linked clusters share one trust anchor, each with its own issuer and trust domain: one
//! cluster's issuer must not mint another cluster's identities. On a real kernel, with the real
//! `cnimesh-control` and `cnimesh-proxy` binaries: `east` (trust domain cluster.local) runs `web`
//! under a policy that admits east's `client` only; `west` (trust domain west.local) has an issuer
//! signed by east's anchor. The attacker holds west's issuer key and presents a certificate for
//! east's `client` signed by it, over real mTLS, to web's proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, Issuer, env_refs};
use cnimesh_e2e::multicluster::{west_policy_yaml, west_web_yaml};
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(30);

/// East with `web` under its policy, and west sharing east's anchor.
struct Linked<'n> {
    east: Control,
    west: Control,
    web: Pod<'n>,
    _web_proxy: Sidecar,
    _apps: Apps,
    _control_pods: (Pod<'n>, Pod<'n>),
}

fn linked<'n>(net: &'n Network, west_issuer: Issuer) -> Linked<'n> {
    let bins = bins!();
    let east_pod = Pod::unmeshed(net, "cnimesh", "control-east").unwrap();
    let west_pod = Pod::unmeshed(net, "cnimesh", "control-west").unwrap();
    let web = Pod::named(net, "shop", "web-0").unwrap();
    let web_yaml = west_web_yaml(web.ipv4());
    let east = Control::start_with_objects(&bins.control, &east_pod, &[], &[("web.yaml", &web_yaml)]).unwrap();
    let west = Control::start_with_ca(&bins.control, &west_pod, &[], Some((&east, "west.local", west_issuer))).unwrap();
    // Web's policy: east's `client`, and nobody else.
    east.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&east.identity("shop", "client"))).unwrap();
    let apps = Apps::start(&web.netns.path(), web.ipv4().into(), "web-0").unwrap();
    let mut env = east.proxy_env("shop", "web", &east.token("shop", "web").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), east.addr.to_string()));
    env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:web-0".into()));
    let web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&env)).unwrap();
    Linked { east, west, web, _web_proxy: web_proxy, _apps: apps, _control_pods: (east_pod, west_pod) }
}

/// mTLS from `pod` to web's proxy as `identity`, with a certificate signed by the issuer of
/// `issuer` (whichever cluster that is), then `GET /replica`: the status (0 when refused).
fn get_as(pod: &Pod<'_>, l: &Linked<'_>, issuer: &Control, identity: &str) -> u16 {
    // Both issuers' trust anchors are east's: the clusters share them.
    let mut config = (*cnimesh_e2e::tap_client::client_tls(issuer, identity).unwrap()).clone();
    config.alpn_protocols.clear();
    let config = Arc::new(config);
    let to = SocketAddr::new(l.web.ipv4().into(), apps::HTTP_PORT);
    let server = l.east.identity("shop", "web");
    cnimesh_cni::netns::run_in(&pod.netns.path(), move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let exchange = async {
                let tcp = tokio::net::TcpStream::connect(to).await?;
                let name = tokio_rustls::rustls::pki_types::ServerName::try_from(server)?;
                let mut tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                tls.write_all(b"GET /replica HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n").await?;
                let mut answer = Vec::new();
                let _ = tls.read_to_end(&mut answer).await;
                anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
            };
            let answer = tokio::time::timeout(Duration::from_secs(15), exchange).await;
            let answer = answer.ok().and_then(Result::ok).unwrap_or_default();
            answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
        })
    })
    .unwrap()
}

/// What web's proxy answers, with west's issuer of kind `west_issuer`: east's `client` signed by
/// west's issuer (the attack), and west's own `client` signed by it. Checks first that east's own
/// certificate for `client` is admitted and another east identity is not: the policy is in force.
fn forged_and_wests_own(west_issuer: Issuer) -> (u16, u16) {
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let l = linked(&net, west_issuer);
    let attacker = Pod::unmeshed(&net, "shop", "attacker").unwrap();
    let client = l.east.identity("shop", "client");
    eventually("web's policy admits east's client", PATIENCE, || get_as(&attacker, &l, &l.east, &client) == 200);
    assert_eq!(get_as(&attacker, &l, &l.east, &l.east.identity("shop", "other")), 403, "and nobody else");
    let forged = get_as(&attacker, &l, &l.west, &client);
    eprintln!("east's client signed by west's {west_issuer:?} issuer: {forged}");
    (forged, get_as(&attacker, &l, &l.west, &l.west.identity("shop", "client")))
}

#[test]
fn a_certificate_for_easts_client_signed_by_wests_issuer_is_refused_at_the_handshake_by_easts_proxy() {
    if !require_root("a_certificate_for_easts_client_signed_by_wests_issuer_is_refused_at_the_handshake_by_easts_proxy")
    {
        return;
    }
    let (forged, wests_own) = forged_and_wests_own(Issuer::Constrained);
    assert_eq!(forged, 0, "refused at the handshake (got HTTP {forged})");
    assert_eq!(wests_own, 403, "west's issuer still vouches for west's own workloads: verified, then not authorized");
}

#[test]
fn an_issuer_without_name_constraints_of_a_linked_cluster_cannot_speak_for_easts_identities() {
    if !require_root("an_issuer_without_name_constraints_of_a_linked_cluster_cannot_speak_for_easts_identities") {
        return;
    }
    // West's issuer predates name constraints: it could sign anything, and east refuses it.
    let (forged, wests_own) = forged_and_wests_own(Issuer::Unconstrained);
    assert_eq!(forged, 0, "refused at the handshake (got HTTP {forged})");
    assert_eq!(wests_own, 0, "west's own workloads too, until its issuer is re-issued");
}
