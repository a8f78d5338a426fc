//! Inbound authorization on a real kernel: `cnimesh-control` reads Servers, AuthorizationPolicies
//! and authentications from a directory of YAML (local mode's source); the `api` pod's proxy
//! discovers each port's policy and enforces it on mTLS clients (`web` allowed, `other` not) and
//! on a plaintext client allowed by its network. The policy changes under a live proxy, a `deny`
//! default keeps only the kubelet probe path open, and the last policy stays in force once the
//! control plane is gone.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// The `api-0` pod (probe path `/hello` on its HTTP port), optionally with a default policy.
fn pod_yaml(ip: Ipv4Addr, default_policy: Option<&str>) -> String {
    let annotations = default_policy
        .map(|p| format!("\n  annotations: {{config.cnimesh.io/default-inbound-policy: {p}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: api-0\n  namespace: shop\n  labels: {{app: api}}{annotations}\nspec:\n  serviceAccountName: api\n  containers:\n    - name: app\n      image: api\n      ports: [{{name: http, containerPort: {}}}, {{name: tcp, containerPort: {}}}]\n      readinessProbe: {{httpGet: {{port: http, path: /hello}}}}\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n",
        apps::HTTP_PORT,
        apps::HALF_CLOSE_PORT
    )
}

/// Servers for the HTTP and the opaque port; `web` may call both, and `office` (a network,
/// plaintext) the HTTP one. Without `web_allowed`, `web`'s policies are gone.
fn policy_yaml(office: Ipv4Addr, web_allowed: bool) -> String {
    let mut docs = vec![
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: api-http, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: api}}\n  port: http\n  proxyProtocol: HTTP/1\n".to_string(),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: api-tcp, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: api}}\n  port: tcp\n  proxyProtocol: opaque\n".to_string(),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: web, namespace: shop}\nspec:\n  identityRefs: [{kind: ServiceAccount, name: web}]\n".to_string(),
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {{name: office, namespace: shop}}\nspec:\n  networks: [{{cidr: {office}/32}}]\n"),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: office-to-api, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: api-http}\n  requiredAuthenticationRefs: [{group: policy.cnimesh.io, kind: NetworkAuthentication, name: office}]\n".to_string(),
    ];
    if web_allowed {
        for server in ["api-http", "api-tcp"] {
            docs.push(format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: web-to-{server}, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: {server}}}\n  requiredAuthenticationRefs: [{{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: web}}]\n"));
        }
    }
    docs.join("---\n")
}

/// An opaque exchange: send, half-close, read the answer (empty when the connection is closed
/// on us).
fn opaque(client: &Pod<'_>, to: SocketAddr) -> String {
    cnimesh_cni::netns::run_in(&client.netns.path(), move || {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"hello")?;
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        std::io::Result::Ok(answer)
    })
    .unwrap()
    .unwrap_or_default()
}

/// A GET from `client`'s app on a fresh connection: (status, body).
fn get(client: &Pod<'_>, to: &str, path: &str) -> (u16, String) {
    http_in(&client.netns.path(), to, "GET", path, "").unwrap_or((0, String::new()))
}

#[test]
fn inbound_policy_is_enforced_updated_live_and_kept_without_the_control_plane() {
    if !require_root("inbound_policy_is_enforced_updated_live_and_kept_without_the_control_plane") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let web = Pod::named(&net, "shop", "web").unwrap();
    let other = Pod::named(&net, "shop", "other").unwrap();
    let office = Pod::unmeshed(&net, "shop", "office").unwrap();
    let (pod, policy) = (pod_yaml(api.ipv4(), None), policy_yaml(office.ipv4(), true));
    let objects = [("pod.yaml", pod.as_str()), ("policy.yaml", policy.as_str())];
    let mut control = Control::start_with_objects(&bins.control, &control_pod, &[], &objects).unwrap();

    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let (api_proxy, _client_proxies) =
        control.api_and_clients(&bins.proxy, &api, &[(&web, "web"), (&other, "other")]).unwrap();
    let http = format!("{}:{}", api.ipv4(), apps::HTTP_PORT);
    let tcp = SocketAddr::new(api.ipv4().into(), apps::HALF_CLOSE_PORT);

    // The allowed identity passes on both ports; another identity gets 403 and a closed
    // connection; a plaintext client from the authorized network passes HTTP.
    assert_eq!(get(&web, &http, "/replica"), (200, "api-0".into()));
    assert_eq!(opaque(&web, tcp), "got 5");
    let (status, body) = get(&other, &http, "/replica");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("unauthorized request on route"), "{body}");
    assert_eq!(opaque(&other, tcp), "", "the unauthorized opaque connection is closed");
    assert_eq!(get(&office, &http, "/replica"), (200, "api-0".into()));
    assert_eq!(opaque(&office, tcp), "", "the office network is authorized on the HTTP port only");
    let metrics = api_proxy.metrics();
    let other_id = identity("shop", "other");
    for expected in [
        format!(
            "inbound_http_authz_deny_total{{target_addr=\"{http}\",srv_group=\"policy.cnimesh.io\",srv_kind=\"server\",srv_name=\"api-http\",route_group=\"\",route_kind=\"default\",route_name=\"default\",tls=\"true\",client_id=\"{other_id}\"}} 1"
        ),
        format!(
            "inbound_tcp_authz_deny_total{{target_addr=\"{tcp}\",srv_group=\"policy.cnimesh.io\",srv_kind=\"server\",srv_name=\"api-tcp\",tls=\"true\",client_id=\"{other_id}\"}} 1"
        ),
        "authz_name=\"web-to-api-http\"".to_string(),
        "authz_name=\"office-to-api\"".to_string(),
    ] {
        assert!(metrics.contains(&expected), "{expected} in\n{metrics}");
    }

    // A policy change reaches the running proxy: web loses its authorization.
    control.cluster.apply_yaml("policy.yaml", &policy_yaml(office.ipv4(), false)).unwrap();
    eventually("web's authorization removed", Duration::from_secs(30), || get(&web, &http, "/replica").0 == 403);
    assert_eq!(opaque(&web, tcp), "");
    assert_eq!(get(&office, &http, "/replica").0, 200);

    // A `deny` default with no Servers: only the kubelet probe path stays open, to anyone.
    control.cluster.delete_file("policy.yaml");
    control.cluster.apply_yaml("pod.yaml", &pod_yaml(api.ipv4(), Some("deny"))).unwrap();
    eventually("the deny default applied", Duration::from_secs(30), || get(&office, &http, "/replica").0 == 403);
    for client in [&web, &other, &office] {
        assert_eq!(get(client, &http, "/hello").0, 200, "the probe path stays reachable");
        assert_eq!(get(client, &http, "/replica").0, 403);
    }
    assert_eq!(opaque(&web, tcp), "");

    // The control plane goes away: new connections get the last policy, not the proxy's
    // all-unauthenticated default.
    let failures = api_proxy.streamed("failures", "inbound_policy");
    control.stop();
    api_proxy.wait_streamed("failures", "inbound_policy", failures);
    for client in [&web, &office] {
        assert_eq!(get(client, &http, "/hello").0, 200);
        assert_eq!(get(client, &http, "/replica").0, 403, "the last policy is kept");
    }
    assert_eq!(opaque(&web, tcp), "");
}

#[test]
fn a_port_the_control_plane_never_answers_for_gets_the_configured_default() {
    if !require_root("a_port_the_control_plane_never_answers_for_gets_the_configured_default") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let office = Pod::unmeshed(&net, "shop", "office").unwrap();
    // The pod is not in the cluster: every WatchPort answers NotFound.
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let mut env = control.proxy_env("shop", "api", &control.token("shop", "api").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:api-0".into()));
    env.push(("CNIMESH_PROXY_POLICY_DEFAULT".into(), "deny".into()));
    env.push(("CNIMESH_PROXY_DISCOVERY_WAIT_MS".into(), "200".into()));
    let _proxy = Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap();
    let http = format!("{}:{}", api.ipv4(), apps::HTTP_PORT);
    assert_eq!(get(&office, &http, "/hello").0, 403, "fail closed: the default is deny");
    assert_eq!(opaque(&office, SocketAddr::new(api.ipv4().into(), apps::HALF_CLOSE_PORT)), "");
}
