//! Attacks on a meshed pod's inbound authorization from an ordinary pod (`mallory`: plaintext,
//! authorized nowhere), on a real kernel with the real proxy and control plane binaries.
//! `office` is the one client the Servers authorize, to show the app still
//! serves who it should. Each test says what the unfixed proxy let through.

#[path = "attack_inbound/cluster.rs"]
mod cluster;
#[path = "attack_inbound/tunnel_app.rs"]
mod tunnel_app;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use cluster::{api_proxy_env, echoes, office_only_server, open_opaque, pod_yaml, status, touch};
use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::{Sidecar, http_reply_in};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Bins, Network, Pod, bins, require_root};
use serde_json::json;
use tunnel_app::{H2cAttempt, TUNNEL_PORT, TunnelApp, h2c_smuggle, open_tunnel};

/// The proxy under test: `CNIMESH_ATTACK_PROXY` names another build (to measure an older proxy
/// against the same attacks), else the one built from these sources.
fn bins() -> Bins {
    let mut bins = bins!();
    if let Some(proxy) = std::env::var_os("CNIMESH_ATTACK_PROXY") {
        bins.proxy = proxy.into();
    }
    bins
}

/// A control plane serving a cluster holding `objects` (name, YAML), in a pod of its own.
fn control<'n>(bins: &Bins, net: &'n Network, objects: &[(&str, &str)]) -> (Pod<'n>, Control) {
    let pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let control = Control::start_with_objects(&bins.control, &pod, &[], objects).unwrap();
    (pod, control)
}

fn named_ports(list: &[(&str, u16)]) -> Vec<(String, u16)> {
    list.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

fn http_port(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::new(ip.into(), apps::HTTP_PORT)
}

/// `api-0` serving HTTP on its `http` port behind a Server that only `office` may use, declaring
/// `ports`, its proxy started with `extra` in its environment; `mallory` is authorized nowhere.
struct Protected<'n> {
    proxy: Sidecar,
    _apps: Apps,
    control: (Pod<'n>, Control),
    api: Pod<'n>,
    office: Pod<'n>,
    mallory: Pod<'n>,
}

impl<'n> Protected<'n> {
    fn start(bins: &Bins, net: &'n Network, ports: &[(String, u16)], extra: &[(&str, &str)]) -> Self {
        let api = Pod::named(net, "shop", "api-0").unwrap();
        let office = Pod::unmeshed(net, "shop", "office").unwrap();
        let mallory = Pod::unmeshed(net, "shop", "mallory").unwrap();
        let pod = pod_yaml(api.ipv4(), ports, None, &[]);
        let policy = office_only_server("api-http", "http", "HTTP/1", office.ipv4());
        let control = control(bins, net, &[("pod.yaml", &pod), ("policy.yaml", &policy)]);
        let apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
        let proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&api_proxy_env(&control.1, extra))).unwrap();
        Self { proxy, _apps: apps, control, api, office, mallory }
    }

    /// A GET of `/hello` on the protected port from `client`.
    fn hello(&self, client: &Pod<'_>) -> u16 {
        status(client, http_port(self.api.ipv4()), "/hello")
    }
}

/// Finding 1, as reported: a scan of 128 ports used up the proxy's watches, and the protected
/// port then got the proxy's local `all-unauthenticated` default. Unfixed: 200.
#[test]
fn a_client_that_touches_128_unused_ports_still_gets_403_on_the_protected_one() {
    if !require_root("a_client_that_touches_128_unused_ports_still_gets_403_on_the_protected_one") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let t = Protected::start(&bins, &net, &named_ports(&[("http", apps::HTTP_PORT)]), &[]);

    touch(&t.mallory, t.api.ipv4(), 20000..20128);
    assert_eq!(t.hello(&t.mallory), 403, "the protected port, after the scan");
    assert_eq!(t.hello(&t.office), 200, "the authorized client still gets in");
    assert_eq!(t.proxy.metric("inbound_tcp_accept_errors_total{error=\"policy_watch_limit\"}"), 0.0);
}

/// Finding 1 under churn: a thousand distinct ports, one after the other. Unfixed: 200.
#[test]
fn a_thousand_ports_churned_leave_the_protected_port_protected() {
    if !require_root("a_thousand_ports_churned_leave_the_protected_port_protected") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let t = Protected::start(&bins, &net, &named_ports(&[("http", apps::HTTP_PORT)]), &[]);

    touch(&t.mallory, t.api.ipv4(), 20000..21000);
    assert_eq!(t.hello(&t.mallory), 403, "the protected port, after 1000 others");
    assert_eq!(t.hello(&t.office), 200);
}

/// Finding 1 for a pod with more ports than the bound: every declared port keeps its own
/// policy, however many undeclared ones are touched. Unfixed: 200.
#[test]
fn a_pod_declaring_200_ports_has_every_declared_port_enforced() {
    if !require_root("a_pod_declaring_200_ports_has_every_declared_port_enforced") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mut ports = named_ports(&[("http", apps::HTTP_PORT)]);
    ports.extend((30000..30199).map(|p| (format!("p{p}"), p)));
    assert_eq!(ports.len(), 200);
    let declared: Vec<String> = ports.iter().map(|(_, p)| p.to_string()).collect();
    let declared = declared.join(",");
    let t = Protected::start(&bins, &net, &ports, &[("CNIMESH_PROXY_INBOUND_PORTS", &declared)]);

    touch(&t.mallory, t.api.ipv4(), (30000..30199).chain(20000..20200));
    assert_eq!(t.hello(&t.mallory), 403, "a declared port, after 400 others");
    assert_eq!(t.hello(&t.office), 200);
}

/// Finding 2: the injected default was stale (`all-unauthenticated`), the pod's annotation says
/// `deny`; the control plane said so for one port, then died. A port contacted for the first
/// time after that gets `deny`. Unfixed: 200 (the proxy's local default).
#[test]
fn a_first_contact_port_gets_the_default_the_control_plane_stated_before_it_died() {
    if !require_root("a_first_contact_port_gets_the_default_the_control_plane_stated_before_it_died") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let mallory = Pod::unmeshed(&net, "shop", "mallory").unwrap();
    let ports = named_ports(&[("http", apps::HTTP_PORT), ("db", apps::BANNER_PORT)]);
    let deny = [("config.cnimesh.io/default-inbound-policy", "deny")];
    let (_control_pod, mut control) = control(&bins, &net, &[("pod.yaml", &pod_yaml(api.ipv4(), &ports, None, &deny))]);
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let env = api_proxy_env(&control, &[("CNIMESH_PROXY_DISCOVERY_WAIT_MS", "200")]);
    let proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap();

    // One port answered (the database port: `deny`, so closed on mallory).
    touch(&mallory, api.ipv4(), [apps::BANNER_PORT]);
    eventually("the deny answer for the db port", Duration::from_secs(20), || {
        proxy.metric("inbound_tcp_authz_deny_total{") >= 1.0 || {
            touch(&mallory, api.ipv4(), [apps::BANNER_PORT]);
            false
        }
    });
    control.stop();
    assert_eq!(status(&mallory, http_port(api.ipv4()), "/replica"), 403, "first contact, control plane gone");
}

/// Finding 2 with the control plane unreachable from the start: the injected default (`deny`)
/// holds from the first byte, for HTTP and opaque alike, and `/ready` does not wait for ever.
#[test]
fn a_deny_default_pod_refuses_a_first_contact_port_while_the_control_plane_is_unreachable() {
    if !require_root("a_deny_default_pod_refuses_a_first_contact_port_while_the_control_plane_is_unreachable") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let mallory = Pod::unmeshed(&net, "shop", "mallory").unwrap();
    let (_control_pod, control) = control(&bins, &net, &[]);
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    // Identity answers; policy and discovery go to a port where nothing listens.
    let nowhere = SocketAddr::new(control.addr.ip(), 4999).to_string();
    let mut env = api_proxy_env(&control, &[]);
    env.retain(|(k, _)| k != "CNIMESH_PROXY_DESTINATION_ADDR");
    for (k, v) in [
        ("CNIMESH_PROXY_DESTINATION_ADDR", nowhere.as_str()),
        ("CNIMESH_PROXY_POLICY_DEFAULT", "deny"),
        ("CNIMESH_PROXY_INBOUND_PORTS", "8080,9000"),
        ("CNIMESH_PROXY_POLICY_READY_TIMEOUT_MS", "1000"),
        ("CNIMESH_PROXY_DISCOVERY_WAIT_MS", "200"),
    ] {
        env.push((k.into(), v.into()));
    }
    let _proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap();
    assert_eq!(status(&mallory, http_port(api.ipv4()), "/replica"), 403);
    assert_eq!(status(&mallory, SocketAddr::new(api.ipv4().into(), 9001), "/"), 403, "an undeclared port too");
    let opaque = SocketAddr::new(api.ipv4().into(), apps::BANNER_PORT);
    let banner = cnimesh_cni::netns::run_in(&mallory.netns.path(), move || {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(opaque)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        std::io::Result::Ok(got)
    })
    .unwrap()
    .unwrap_or_default();
    assert_eq!(banner, "", "the opaque port is closed on mallory");
}

/// Finding 2: an opaque connection allowed under the default keeps no verdict for its life; the
/// control plane's `deny` closes it. Unfixed: it kept echoing.
#[test]
fn an_opaque_connection_allowed_by_the_default_is_closed_when_a_deny_answer_arrives() {
    if !require_root("an_opaque_connection_allowed_by_the_default_is_closed_when_a_deny_answer_arrives") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let mallory = Pod::unmeshed(&net, "shop", "mallory").unwrap();
    let ports = named_ports(&[("db", apps::BANNER_PORT)]);
    let (_control_pod, control) = control(&bins, &net, &[("pod.yaml", &pod_yaml(api.ipv4(), &ports, None, &[]))]);
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let env = api_proxy_env(&control, &[("CNIMESH_PROXY_INBOUND_PORTS", "5432")]);
    let proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap();
    let db = SocketAddr::new(api.ipv4().into(), apps::BANNER_PORT);

    let mut open = open_opaque(&mallory, db, apps::BANNER);
    assert!(echoes(&mut open), "allowed under all-unauthenticated");
    let deny = [("config.cnimesh.io/default-inbound-policy", "deny")];
    control.cluster.apply_yaml("pod.yaml", &pod_yaml(api.ipv4(), &ports, None, &deny)).unwrap();
    eventually("new connections refused under deny", Duration::from_secs(30), || {
        proxy.metric("inbound_tcp_authz_deny_total{") >= 1.0 || {
            touch(&mallory, api.ipv4(), [apps::BANNER_PORT]);
            false
        }
    });
    eventually("the open connection closed", Duration::from_secs(10), || !echoes(&mut open));
    assert!(proxy.metric("inbound_tcp_authz_revoked_total") >= 1.0, "counted");
}

/// The tunnel app's pod: a Server on its port that only `office` may use, and a kubelet probe
/// on `/ready` there (which the control plane opens to everyone, as probes come from the node).
struct Tunnels<'n> {
    _control: (Pod<'n>, Control),
    _app: TunnelApp,
    _proxy: Sidecar,
    api: Pod<'n>,
    office: Pod<'n>,
    mallory: Pod<'n>,
}

impl<'n> Tunnels<'n> {
    fn start(bins: &Bins, net: &'n Network) -> Self {
        let api = Pod::named(net, "shop", "api-0").unwrap();
        let office = Pod::unmeshed(net, "shop", "office").unwrap();
        let mallory = Pod::unmeshed(net, "shop", "mallory").unwrap();
        let ports = named_ports(&[("web", TUNNEL_PORT)]);
        let probe = Some(("web", "/ready"));
        let pod = pod_yaml(api.ipv4(), &ports, probe, &[]);
        let policy = office_only_server("api-web", "web", "HTTP/1", office.ipv4());
        let control = control(bins, net, &[("pod.yaml", &pod), ("policy.yaml", &policy)]);
        let app = TunnelApp::start(&api.netns.path(), api.ipv4().into());
        let env = api_proxy_env(&control.1, &[("CNIMESH_PROXY_INBOUND_PORTS", "8090")]);
        let proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap();
        Self { _control: control, _app: app, _proxy: proxy, api, office, mallory }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.api.ipv4().into(), TUNNEL_PORT)
    }
}

/// Finding 4: `GET /ready` (the open probe route) offering `Upgrade: h2c`; the app switched,
/// the proxy spliced, and `/admin` went over HTTP/2 unchecked. Unfixed: 101, then 200 on /admin.
#[test]
fn a_probe_route_cannot_open_an_h2c_tunnel_past_policy() {
    if !require_root("a_probe_route_cannot_open_an_h2c_tunnel_past_policy") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let t = Tunnels::start(&bins, &net);
    assert_eq!(status(&t.mallory, t.addr(), "/admin"), 403, "mallory is not authorized");
    let attempt = h2c_smuggle(&t.mallory.netns.path(), t.addr(), "/ready");
    assert_eq!(attempt, H2cAttempt { upgrade: 200, admin: 403 }, "served as plain HTTP/1, then checked");
    let attempt = h2c_smuggle(&t.office.netns.path(), t.addr(), "/ready");
    assert_eq!(attempt, H2cAttempt { upgrade: 200, admin: 200 }, "never h2c, even for an authorized client");
}

/// Finding 4: WebSocket and CONNECT are tunnels; they need the Server's authorization, which
/// the probe route's exemption does not give. Unfixed: mallory's WebSocket on /ready opened.
#[test]
fn tunnels_need_the_servers_authorization_not_a_route_exemption() {
    if !require_root("tunnels_need_the_servers_authorization_not_a_route_exemption") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let t = Tunnels::start(&bins, &net);
    let ws = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    let connect = "CONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\n\r\n";
    assert_eq!(open_tunnel(&t.mallory.netns.path(), t.addr(), &ws("/ready")), (403, false), "via the probe route");
    assert_eq!(open_tunnel(&t.mallory.netns.path(), t.addr(), &ws("/chat")), (403, false));
    assert_eq!(open_tunnel(&t.mallory.netns.path(), t.addr(), connect), (403, false));
    assert_eq!(open_tunnel(&t.office.netns.path(), t.addr(), &ws("/chat")), (101, true), "authorized: tunnels work");
    assert_eq!(open_tunnel(&t.office.netns.path(), t.addr(), connect), (200, true));
}

/// Finding 8: the probe route matches on the path alone, authorization sees the path the app
/// will read (and forwards exactly that), and clients cannot claim an identity in headers.
#[test]
fn the_app_reads_the_path_policy_matched_and_no_identity_a_client_claimed() {
    if !require_root("the_app_reads_the_path_policy_matched_and_no_identity_a_client_claimed") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let t = Tunnels::start(&bins, &net);
    let get = |path: &str| {
        let r = http_reply_in(&t.mallory.netns.path(), &t.addr().to_string(), "GET", path, "").unwrap();
        (r.status, r.body)
    };
    assert_eq!(get("/ready?verbose=1"), (200, "/ready?verbose=1".into()), "a probe with a query string");
    assert_eq!(get("/re%61dy"), (200, "/ready".into()), "normalized, and forwarded as matched");
    assert_eq!(get("/ready/../admin").0, 403, "the app would read /admin");
    assert_eq!(get("/ready/..%2fadmin").0, 400, "servers disagree on %2f: refused");
    let claimed = cnimesh_cni::netns::run_in(&t.office.netns.path(), {
        let addr = t.addr();
        move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(b"GET /headers HTTP/1.1\r\nHost: api\r\nl5d-client-id: admin.cnimesh.serviceaccount.identity.cnimesh.cluster.local\r\nL5d-Server-Id: x\r\nConnection: close\r\n\r\n")?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            std::io::Result::Ok(answer)
        }
    })
    .unwrap()
    .unwrap();
    assert!(claimed.starts_with("HTTP/1.1 200"), "{claimed}");
    assert!(!claimed.to_ascii_lowercase().contains("l5d-client-id"), "the claimed identity reached the app: {claimed}");
    assert!(!claimed.to_ascii_lowercase().contains("l5d-server-id"), "{claimed}");

    // A meshed client's identity, proved by its certificate, is what the app reads.
    let web = Pod::named(&net, "shop", "web").unwrap();
    let authz = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: web, namespace: shop}\nspec:\n  identityRefs: [{kind: ServiceAccount, name: web}]\n---\napiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: web-to-api-web, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: api-web}\n  requiredAuthenticationRefs: [{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: web}]\n";
    let control = &t._control.1;
    control.cluster.apply_yaml("web.yaml", authz).unwrap();
    let mut env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    env.push(("CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(), format!("{}={}", t.api.ipv4(), identity("shop", "api"))));
    let _web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&env)).unwrap();
    let headers = || http_reply_in(&web.netns.path(), &t.addr().to_string(), "GET", "/headers", "").unwrap();
    eventually("web authorized", Duration::from_secs(30), || headers().status == 200);
    let seen = headers().body.to_ascii_lowercase();
    assert!(seen.contains(&format!("l5d-client-id: {}", identity("shop", "web"))), "{seen}");
}

/// Finding 2 with the answer arriving late: the proxy has its certificate, then the control plane
/// goes away before the port's first contact, so the injected `deny` holds for everyone; when the
/// control plane is back, its answer (a Server only `office` may use) takes over without a
/// restart of the proxy, and never admits more than it says.
#[test]
fn a_policy_answer_arriving_late_takes_over_from_the_default_and_admits_only_what_it_says() {
    if !require_root("a_policy_answer_arriving_late_takes_over_from_the_default_and_admits_only_what_it_says") {
        return;
    }
    let bins = bins();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let extra = [("CNIMESH_PROXY_POLICY_DEFAULT", "deny"), ("CNIMESH_PROXY_DISCOVERY_WAIT_MS", "200")];
    let mut t = Protected::start(&bins, &net, &named_ports(&[("http", apps::HTTP_PORT)]), &extra);

    t.control.1.stop();
    assert_eq!(t.hello(&t.office), 403, "no answer yet: the injected deny");
    assert_eq!(t.hello(&t.mallory), 403, "no answer yet: the injected deny");
    t.control.1.restart().unwrap();
    eventually("office admitted once the late answer arrives", Duration::from_secs(60), || t.hello(&t.office) == 200);
    assert_eq!(t.hello(&t.mallory), 403, "the answer admits office only");
}
