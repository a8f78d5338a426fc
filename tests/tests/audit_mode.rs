//! Audit mode on a real kernel, as an attack: an intruder (not meshed, no
//! policy admits it) calls a Server whose `accessPolicy` is `audit` and gets through, counted as
//! a would-be denial (`inbound_http_authz_allow_total{authz_kind="audit"}`) while the allowed
//! client is counted under its own policy; the same Server switched to `deny` refuses the
//! intruder (so the mode is what let it through); an unknown accessPolicy value is refused and
//! the old mode kept (never widened to audit); a namespace default of `audit` covers a port no
//! Server names.

use std::net::Ipv4Addr;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, identity};
use cnimesh_e2e::sidecar::{http_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// Only guards against a hung step; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

/// The pod, its namespace (with a default policy when given), and, with `access_policy`, the
/// Server of its HTTP port with one AuthorizationPolicy per allowed ServiceAccount.
fn cluster_yaml(ip: Ipv4Addr, ns_default: Option<&str>, access_policy: Option<&str>, allowed: &[&str]) -> String {
    let annotations = ns_default
        .map(|p| format!(", annotations: {{config.cnimesh.io/default-inbound-policy: {p}}}"))
        .unwrap_or_default();
    let mut docs = vec![
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop{annotations}}}\n"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: api-0, namespace: shop, labels: {{app: api}}}}\nspec:\n  serviceAccountName: api\n  containers:\n    - name: app\n      image: api\n      ports: [{{name: http, containerPort: {}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n",
            apps::HTTP_PORT
        ),
    ];
    if let Some(mode) = access_policy {
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: api-http, namespace: shop}}\nspec:\n  podSelector: {{matchLabels: {{app: api}}}}\n  port: http\n  proxyProtocol: HTTP/1\n  accessPolicy: {mode}\n"
        ));
        for sa in allowed {
            docs.push(format!(
                "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: {sa}-to-api, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: api-http}}\n  requiredAuthenticationRefs: [{{kind: ServiceAccount, name: {sa}}}]\n"
            ));
        }
    }
    docs.join("---\n")
}

#[test]
fn audit_lets_an_intruder_through_counted_and_deny_refuses_it() {
    if !require_root("audit_lets_an_intruder_through_counted_and_deny_refuses_it") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let web = Pod::named(&net, "shop", "web").unwrap();
    let other = Pod::named(&net, "shop", "other").unwrap();
    let intruder = Pod::unmeshed(&net, "shop", "intruder").unwrap();
    let first = cluster_yaml(api.ipv4(), None, Some("audit"), &["web"]);
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("cluster.yaml", &first)]).unwrap();
    let write = |ns_default: Option<&str>, mode: Option<&str>, allowed: &[&str]| {
        control.cluster.apply_yaml("cluster.yaml", &cluster_yaml(api.ipv4(), ns_default, mode, allowed)).unwrap()
    };

    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let (api_proxy, _client_proxies) =
        control.api_and_clients(&bins.proxy, &api, &[(&web, "web"), (&other, "other")]).unwrap();
    let http = format!("{}:{}", api.ipv4(), apps::HTTP_PORT);
    let get = |client: &Pod<'_>| http_in(&client.netns.path(), &http, "GET", "/replica", "").map_or(0, |r| r.0);
    let allowed = |labels: &[&str]| metric_with(&api_proxy.metrics(), "inbound_http_authz_allow_total", labels);

    // Audit: the intruder gets through, counted as a would-be denial; web under its policy.
    assert_eq!(get(&intruder), 200, "audit lets the would-be denial through");
    assert_eq!(get(&web), 200);
    let audit = ["srv_name=\"api-http\"", "authz_kind=\"audit\"", "tls=\"false\""];
    assert_eq!(allowed(&audit), 1.0, "{}", api_proxy.metrics());
    let web_id = format!("client_id=\"{}\"", identity("shop", "web"));
    assert_eq!(allowed(&["authz_name=\"web-to-api\"", web_id.as_str()]), 1.0);
    assert_eq!(allowed(&["authz_kind=\"audit\"", web_id.as_str()]), 0.0, "an allowed client is no would-be denial");

    // The same Server in deny: the intruder is refused; the mode is what let it through.
    write(None, Some("deny"), &["web"]);
    eventually("deny applied", PATIENCE, || get(&intruder) == 403);
    assert_eq!(get(&web), 200);

    // An unknown mode is refused and deny stays: never widened to audit. The same write admits
    // `other`, which shows when the file has been read.
    write(None, Some("audti"), &["web", "other"]);
    eventually("the objects read", PATIENCE, || get(&other) == 200);
    for _ in 0..5 {
        assert_eq!(get(&intruder), 403, "fail closed: the bad mode did not open the Server");
    }

    // No Server, the namespace's default `audit`: the port is audited under the default.
    write(Some("audit"), None, &[]);
    eventually("the namespace default applied", PATIENCE, || {
        get(&intruder) == 200 && allowed(&["srv_kind=\"default\"", "srv_name=\"audit\"", "authz_kind=\"audit\""]) > 0.0
    });
}
