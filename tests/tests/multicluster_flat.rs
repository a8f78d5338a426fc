//! The flat network (pods of both clusters routable to each other, here one bridge)
//! with real pods, proxies and two control planes, each on its own API server: east
//! (cluster.local) and west (west.local, its issuer signed by east's anchor).
//! - A federated Service: `api` is a member in both clusters, the Link is what `cnimesh
//!   multicluster link` prints, and east's mirror (`cnimesh-mirror`, in its own pod) makes
//!   `api-federated`; east's client balances real requests over both members with mTLS.
//! - West's policy allows or denies east's client by its own identity (the flat counterpart of
//!   the gateway test's policy step, where west sees the gateway's identity instead).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cnimesh_common::names::TARGET_CLUSTER_METRIC_LABEL;
use cnimesh_e2e::apps::Apps;
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::multicluster::{Clusters, FLAT_IP, Meshed, destination_endpoints, service_yaml, west_policy_yaml};
use cnimesh_e2e::sidecar::{Reply, Sidecar, http_reply_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, apps, bins, require_root};
use serde_json::json;

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const MIRROR: &str = env!("CARGO_BIN_EXE_cnimesh-mirror-e2e");
const MEMBER: &str = "mirror.cnimesh.io/federated: member";

fn get(pod: &Pod<'_>, to: &str) -> Reply {
    http_reply_in(&pod.netns.path(), to, "GET", "/replica", "").unwrap_or_default()
}

/// A meshed replica of `api` in `pod`: the apps answering with the pod's name, and its proxy
/// with `control`'s identity for service account `api`.
fn api_replica(proxy: &std::path::Path, control: &Control, pod: &Pod<'_>) -> (Apps, Sidecar) {
    let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
    let mut env = control.proxy_env("shop", "api", &control.token("shop", "api").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    (apps, Sidecar::start(proxy, &pod.netns, &env_refs(&env)).unwrap())
}

#[test]
fn a_federated_service_balances_real_requests_across_both_clusters_with_the_clients_identity_and_drops_a_member_that_goes()
 {
    if !require_root(
        "a_federated_service_balances_real_requests_across_both_clusters_with_the_clients_identity_and_drops_a_member_that_goes",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let clusters = Clusters::start(&bins, &net);
    let (east, west) = (&clusters.east, &clusters.west);
    let client = Pod::named(&net, "shop", "client").unwrap();
    // ClusterIPs are routed out of the pod, where capture takes them (as kube-proxy's range).
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let api_east = Pod::named(&net, "shop", "api-east").unwrap();
    let api_west = Pod::named(&net, "shop", "api-west").unwrap();
    // `api` is a member in each cluster, one meshed replica each (east's ClusterIP apart from
    // the ones east's API server hands out).
    east.cluster
        .apply_yaml("api.yaml", &service_yaml("api", MEMBER, "10.100.0.10", &[("api-east", api_east.ipv4())]))
        .unwrap();
    west.cluster
        .apply_yaml("api.yaml", &service_yaml("api", MEMBER, "10.97.0.10", &[("api-west", api_west.ipv4())]))
        .unwrap();
    let (_east_apps, east_proxy) = api_replica(&bins.proxy, east, &api_east);
    let (_west_apps, west_proxy) = api_replica(&bins.proxy, west, &api_west);
    let mut client_env = east.proxy_env("shop", "client", &east.token("shop", "client").unwrap());
    client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), east.addr.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&client_env)).unwrap();

    // The Link, made once both control planes run; east's mirror unites the members.
    clusters.link(None);
    let _mirror = clusters.start_mirror(MIRROR.as_ref());
    let both = BTreeSet::from([api_east.ipv4().to_string(), api_west.ipv4().to_string()]);
    eventually("east's mirror makes api-federated with both members", PATIENCE, || {
        clusters.mirror_addresses("api-federated") == both
    });
    let (service, _) = clusters.mirror("api-federated").unwrap();
    let ip = service.spec.and_then(|s| s.cluster_ip).unwrap();
    let federated = format!("{ip}:80");

    // East's Destination serves each member with its own identity and cluster label; the
    // client proxy labels each request with its member's cluster (checked below).
    let http = apps::HTTP_PORT;
    let (east_addr, west_addr) = (format!("{}:{http}", api_east.ipv4()), format!("{}:{http}", api_west.ipv4()));
    let served =
        destination_endpoints(east, &client.netns.path(), "api-federated.shop.svc.cluster.local:80", PATIENCE, |s| {
            s.len() == 2
        });
    let member = |addr: &str| {
        let s = served.get(addr).unwrap_or_else(|| panic!("{addr} is served: {served:#?}"));
        (s.identity.clone().unwrap_or_default(), s.labels.get(TARGET_CLUSTER_METRIC_LABEL).cloned().unwrap_or_default())
    };
    assert_eq!(member(&east_addr), (east.identity("shop", "api"), "local".to_string()), "{served:#?}");
    assert_eq!(member(&west_addr), (west.identity("shop", "api"), "west".to_string()), "{served:#?}");

    // Real requests: once the client proxy knows both members, every request succeeds and both
    // answer.
    eventually("the client reaches both members", PATIENCE, || {
        let mut names = BTreeSet::new();
        for _ in 0..10 {
            names.insert(get(&client, &federated).body);
        }
        names.contains("api-east") && names.contains("api-west")
    });
    // The client's outbound requests to api-federated: to west's member, and unlabelled (to
    // east's own member, which carries no `target_cluster_name`, as any local endpoint).
    let outbound_to = |metrics: &str| {
        let to_federated = format!("target_addr=\"{federated}\"");
        let west = metric_with(
            metrics,
            "request_total",
            &["direction=\"outbound\"", &to_federated, "target_cluster_name=\"west\""],
        );
        let all = metric_with(metrics, "request_total", &["direction=\"outbound\"", &to_federated]);
        (all - west, west)
    };
    let before = outbound_to(&client_proxy.metrics());
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..40 {
        let reply = get(&client, &federated);
        assert_eq!(reply.status, 200, "request {i}: {reply:?}");
        *answered.entry(reply.body).or_default() += 1;
    }
    assert_eq!(answered.keys().map(String::as_str).collect::<Vec<_>>(), ["api-east", "api-west"], "{answered:?}");
    // Both servers saw east's client itself over mTLS (no gateway in between).
    let client_id = east.identity("shop", "client");
    for (name, proxy) in [("api-east", &east_proxy), ("api-west", &west_proxy)] {
        let metrics = proxy.metrics();
        let seen =
            metric_with(&metrics, "request_total", &["direction=\"inbound\"", &format!("client_id=\"{client_id}\"")]);
        assert!(seen >= 1.0, "{name} saw the east client's own identity:\n{metrics}");
    }
    let client_metrics = client_proxy.metrics();
    let sent = metric_with(&client_metrics, "request_total", &["direction=\"outbound\"", "tls=\"true\""]);
    assert!(sent >= 40.0, "the client's requests to api-federated are mTLS:\n{client_metrics}");
    // Each request is counted under the cluster it went to: west's replies under
    // `target_cluster_name="west"`, east's without the label (never `local`).
    let after = outbound_to(&client_metrics);
    let counted = ((after.0 - before.0) as usize, (after.1 - before.1) as usize);
    assert_eq!(counted, (answered["api-east"], answered["api-west"]), "(east, west):\n{client_metrics}");
    assert!(!client_metrics.contains("target_cluster_name=\"local\""), "{client_metrics}");

    // West's member goes (its replica leaves west's API server): every reply comes from east's
    // replica within a bounded wait, and none fails on the way or after.
    west.cluster.apply_yaml("api.yaml", &service_yaml("api", MEMBER, "10.97.0.10", &[])).unwrap();
    eventually("api-federated keeps east's member only", PATIENCE, || {
        clusters.mirror_addresses("api-federated") == BTreeSet::from([api_east.ipv4().to_string()])
    });
    let mut in_a_row = 0;
    eventually("every reply comes from east's replica", PATIENCE, || {
        let reply = get(&client, &federated);
        assert_eq!(reply.status, 200, "no request fails while west's member goes: {reply:?}");
        in_a_row = if reply.body == "api-east" { in_a_row + 1 } else { 0 };
        in_a_row >= 10
    });
    for i in 0..20 {
        let reply = get(&client, &federated);
        assert_eq!((reply.status, reply.body.as_str()), (200, "api-east"), "request {i} after west's member went");
    }
}

#[test]
fn in_flat_mode_west_policy_allows_or_denies_the_east_client_by_its_own_identity() {
    if !require_root("in_flat_mode_west_policy_allows_or_denies_the_east_client_by_its_own_identity") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let flat = format!("{FLAT_IP}:80");
    // An unmeshed pod calling web's pod directly: refused by a policy that names identities,
    // served by the default policy (all-unauthenticated): it tells the two apart.
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let direct = format!("{}:{}", c.web.ipv4(), apps::HTTP_PORT);
    let reply = get(&c.client, &flat);
    assert_eq!((reply.status, reply.body.as_str()), (200, "web-0"), "{reply:?}");
    let policy = "policy.yaml";

    // Another identity authorized: east's client is denied.
    c.west.cluster.apply_yaml(policy, &west_policy_yaml(&c.west.identity("shop", "other"))).unwrap();
    eventually("east's client is denied by west's policy", PATIENCE, || get(&c.client, &flat).status == 403);

    // East's client's own identity authorized (not the gateway's: flat, no gateway between).
    let client_id = c.east.identity("shop", "client");
    c.west.cluster.apply_yaml(policy, &west_policy_yaml(&client_id)).unwrap();
    eventually("east's client is allowed by its own identity", PATIENCE, || {
        let reply = get(&c.client, &flat);
        (reply.status, reply.body.as_str()) == (200, "web-0")
    });
    assert_eq!(get(&outsider, &direct).status, 403, "the policy admits east's client only");
    let web_metrics = c.web_proxy.metrics();
    let seen =
        metric_with(&web_metrics, "request_total", &["direction=\"inbound\"", &format!("client_id=\"{client_id}\"")]);
    assert!(seen >= 1.0, "web saw the east client's own identity:\n{web_metrics}");

    // The policy removed: the default again, east's client still served.
    c.west.cluster.delete_file(policy);
    eventually("the default policy is back", PATIENCE, || get(&outsider, &direct).status == 200);
    let reply = get(&c.client, &flat);
    assert_eq!((reply.status, reply.body.as_str()), (200, "web-0"), "{reply:?}");
}
