//! The cost of inbound authorization: two mTLS proxy pairs in the same run, one whose server pod
//! has a Server with 10 AuthorizationPolicies (each requiring a different MeshTLSAuthentication,
//! the client's identity in the last one, so every request's connection scans all ten) and one
//! without policy discovery. Rounds interleave the two rows; medians are printed with the added
//! p50/p99 and the CPU ratio (the target: under 3 % more CPU).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_policy` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use cnimesh_e2e::apps;
use cnimesh_e2e::bench::{interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::Control;
use cnimesh_e2e::mesh::Pair;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const POLICIES: usize = 10;

/// The server pod, its Server, and [`POLICIES`] AuthorizationPolicies; the last admits `client`.
fn cluster_yaml(server: &Pod<'_>, client_sa: &str) -> String {
    let ip = server.ipv4();
    let mut docs = vec![
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n".to_string(),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: shop, labels: {{app: bench}}}}\nspec:\n  serviceAccountName: {}\n  containers: [{{name: app, image: app, ports: [{{name: http, containerPort: {}}}]}}]\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n",
            server.name,
            server.name,
            apps::HTTP_PORT
        ),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: bench, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: bench}}\n  port: http\n  proxyProtocol: HTTP/1\n".to_string(),
    ];
    for i in 0..POLICIES {
        let sa = if i == POLICIES - 1 { client_sa.to_string() } else { format!("caller-{i}") };
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {{name: authn-{i:02}, namespace: shop}}\nspec:\n  identityRefs: [{{kind: ServiceAccount, name: {sa}}}]\n"
        ));
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: authz-{i:02}, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: bench}}\n  requiredAuthenticationRefs: [{{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: authn-{i:02}}}]\n"
        ));
    }
    docs.join("---\n")
}

fn main() {
    if !require_root("proxy policy benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let policed = (Pod::named(&net, "shop", "pol-client").unwrap(), Pod::named(&net, "shop", "pol-server").unwrap());
    let objects = cluster_yaml(&policed.1, "pol-client");
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("cluster.yaml", &objects)]).unwrap();
    let with = Pair::policed(&control, &bins.proxy, policed.0, policed.1, true);
    let none = (Pod::named(&net, "shop", "none-client").unwrap(), Pod::named(&net, "shop", "none-server").unwrap());
    let without = Pair::policed(&control, &bins.proxy, none.0, none.1, false);

    // The policy is in force before measuring: the client's requests are allowed by the tenth.
    with.wait_for_server_metric("authz_name=\"authz-09\"");

    let rows = [without.row("mTLS pair, no policy"), with.row("mTLS pair, 10 AuthorizationPolicies")];
    let samples = interleaved_rounds(&rows, rounds);
    let denied = with.server_proxy.metric("inbound_http_authz_deny_total");
    assert_eq!(denied, 0.0, "the benchmark's requests are all authorized");

    print_comparison("Inbound authorization cost", &rows, &samples, "policy", 3.0);
}
