//! The mirror controller: the real [`MirrorController`],
//! in-process, against two mocked API servers ([`ClusterApi`]). East (this
//! cluster: Links, Secrets, the mirrors it writes, the Lease) is reached in-process; west (the
//! linked cluster) only through the kubeconfig in the Link's Secret, over HTTPS on 127.0.0.1 with
//! its CA inline and a bearer token, as a real remote API server would be. The tests change either
//! side and read what east was asked: watches, server-side applies, deletes, the Link's status
//! subresource.
//!
//! Attacks on the Link's credentials (a Secret is whatever whoever handed the operator the Link
//! wrote): an `exec` stanza never runs, neither in the control plane nor under `cnimesh
//! multicluster check`, and a `tokenFile` is never read nor sent; each is refused by name.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_common::names::{
    CONTROL_NAMESPACE, LINK_CREDENTIALS_KEY, LINK_CREDENTIALS_SECRET_TYPE, MIRROR_CLUSTER_NAME_LABEL,
    MIRROR_EXPORTED_GATEWAY, MIRROR_EXPORTED_LABEL, MIRROR_EXPORTED_REMOTE_DISCOVERY,
    MIRROR_GATEWAY_IDENTITY_ANNOTATION, MIRROR_LINK_STATE_ANNOTATION, MIRROR_REMOTE_IDENTITY_ANNOTATION,
    MIRROR_REMOTE_SERVICE_ANNOTATION, MIRRORED_SERVICE_LABEL, PROXY_CONTAINER,
};
use cnimesh_e2e::kube_api::{Call, ClusterApi, Served};
use cnimesh_mirror::controller::{MIRROR_WRITE, MirrorController};
use cnimesh_mirror::crd::{self, LinkState, LinkStatus};
use cnimesh_mirror::metrics::Metrics;
use cnimesh_mirror::plan::{LINK_STATE_LOST, SERVICE_NAME_LABEL};
use cnimesh_mirror::write::FIELD_MANAGER;
use cnimesh_runtime::leader::{self, ElectionConfig, Leadership};
use http::Method;
use serde_json::{Value, json};
use tokio::sync::watch;

const NS: &str = CONTROL_NAMESPACE;
const TOKEN: &str = "west-mirror-reader-token";
const GATEWAY_IDENTITY: &str = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";
const GATEWAY_ADDRESS: &str = "192.0.2.10";
const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const PODS: &str = "/api/v1/pods";
const SLICE_API: &str = "discovery.k8s.io/v1";

fn links_path() -> String {
    format!("/apis/{}/namespaces/{NS}/links", crd::API_VERSION)
}

fn secrets_path() -> String {
    format!("/api/v1/namespaces/{NS}/secrets")
}

/// The Link to `cluster`; with a gateway (west's, at [`GATEWAY_ADDRESS`]) or remote discovery only.
fn link(cluster: &str, gateway: bool) -> Value {
    let mut spec = json!({"targetClusterName": cluster, "targetTrustDomain": format!("{cluster}.local"),
        "clusterCredentialsSecret": format!("cluster-credentials-{cluster}"), "probe": {"period": "1s"}});
    if gateway {
        spec["gatewayAddress"] = json!(GATEWAY_ADDRESS);
        spec["gatewayIdentity"] = json!(GATEWAY_IDENTITY);
    }
    json!({"apiVersion": crd::API_VERSION, "kind": crd::KIND, "metadata": {"name": cluster, "namespace": NS}, "spec": spec})
}

/// The Link's credentials Secret, as `cnimesh multicluster link` prints it (`stringData`; the
/// API server stores it as base64 `data`).
fn credentials(cluster: &str, kubeconfig: String) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("cluster-credentials-{cluster}"), "namespace": NS},
        "type": LINK_CREDENTIALS_SECRET_TYPE, "stringData": {LINK_CREDENTIALS_KEY: kubeconfig}})
}

/// A Service of namespace `shop` (port 80 `http` → 8080), exported as `export` (if any).
fn service(name: &str, export: Option<&str>) -> Value {
    let labels = match export {
        Some(export) => json!({MIRROR_EXPORTED_LABEL: export}),
        None => json!({"app": name}),
    };
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}], "selector": {"app": name}}})
}

/// `name`'s EndpointSlice with its ready `pods` (name, IP).
fn slice(name: &str, pods: &[(&str, &str)]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, ip)| {
            json!({"addresses": [ip], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "namespace": "shop", "name": pod}})
        })
        .collect();
    json!({"apiVersion": SLICE_API, "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-abc"), "namespace": "shop", "labels": {SERVICE_NAME_LABEL: name}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints})
}

/// A running meshed pod of ServiceAccount `account`.
fn pod(name: &str, ip: &str, account: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop"},
        "spec": {"serviceAccountName": account, "containers": [{"name": "app"}, {"name": PROXY_CONTAINER}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// West: `web` exported through the gateway, `db` by remote discovery (one meshed pod,
/// 10.2.0.5), served over HTTP and answering only [`TOKEN`].
async fn west() -> (Arc<ClusterApi>, Served) {
    let west = ClusterApi::new();
    west.put(service("web", Some(MIRROR_EXPORTED_GATEWAY)));
    west.put(slice("web", &[("web-0", "10.2.0.4")]));
    west.put(pod("web-0", "10.2.0.4", "web"));
    west.put(service("db", Some(MIRROR_EXPORTED_REMOTE_DISCOVERY)));
    west.put(slice("db", &[("db-0", "10.2.0.5")]));
    west.put(pod("db-0", "10.2.0.5", "db"));
    west.require_token(TOKEN);
    let served = west.serve().await;
    (west, served)
}

/// The mirror controller of east, running until dropped.
struct Mirror {
    stop: watch::Sender<bool>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn run_mirror(east: &Arc<ClusterApi>, leadership: Leadership) -> Mirror {
    let (stop, stopped) = watch::channel(false);
    let controller = MirrorController {
        client: east.client(),
        namespace: NS.to_string(),
        trust_domain: "east.local".to_string(),
        cluster_domain: "cluster.local".to_string(),
        metrics: Arc::new(Metrics::default()),
        leadership,
    };
    tokio::spawn(controller.run(stopped));
    Mirror { stop }
}

/// East with the Link to west (and its Secret) and its mirror controller running.
async fn linked(gateway: bool) -> (Arc<ClusterApi>, Arc<ClusterApi>, Served, Mirror) {
    let (west, served) = west().await;
    let east = ClusterApi::new();
    east.put(link("west", gateway));
    east.put(credentials("west", served.kubeconfig("west", TOKEN)));
    let mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));
    (east, west, served, mirror)
}

fn watched(api: &ClusterApi, path: &str) -> bool {
    api.calls().iter().any(|c| c.path == path && c.is_watch())
}

/// The Link's status as east holds it.
fn status(east: &ClusterApi, link: &str) -> Option<LinkStatus> {
    let link = east.get(crd::API_VERSION, crd::KIND, NS, link)?;
    serde_json::from_value(link.get("status")?.clone()).ok()
}

fn mirror_service(east: &ClusterApi, name: &str) -> Option<Value> {
    east.get("v1", "Service", "shop", name)
}

/// The mirror `name`'s slices as east holds them.
fn mirror_slices(east: &ClusterApi, name: &str) -> Vec<Value> {
    east.list(SLICE_API, "EndpointSlice")
        .into_iter()
        .filter(|s| s["metadata"]["labels"][SERVICE_NAME_LABEL].as_str() == Some(name))
        .collect()
}

fn addresses(slices: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    out.sort();
    out
}

/// Calls writing `plural` (a server-side apply, or `method`) whose path ends in a name starting
/// with `name`, with their position among all calls.
fn writes(calls: &[Call], method: &Method, plural: &str, name: &str) -> Vec<(usize, Call)> {
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.method == *method)
        .filter(|(_, c)| {
            c.path.rsplit('/').nth(1) == Some(plural) && c.path.rsplit('/').next().is_some_and(|n| n.starts_with(name))
        })
        .map(|(i, c)| (i, c.clone()))
        .collect()
}

fn label<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object["metadata"]["labels"][key].as_str()
}

fn annotation<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object["metadata"]["annotations"][key].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn east_with_no_link_watches_only_links_until_a_link_appears_and_then_its_one_secret_by_name() {
    let (_west, served) = west().await;
    let east = ClusterApi::new();
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));
    east.until("the Links watch", |api| watched(api, &links_path()).then_some(())).await;
    // (A list of the mirrors, by label, is fine: it is how mirrors of a Link deleted meanwhile go.)
    let early: Vec<String> = east.calls().iter().filter(|c| c.is_watch()).map(|c| c.path.clone()).collect();
    for path in [SERVICES, SLICES, PODS, secrets_path().as_str()] {
        assert!(!early.iter().any(|p| p == path), "{path} watched before any Link: {early:?}");
    }

    east.put(link("west", true));
    east.put(credentials("west", served.kubeconfig("west", TOKEN)));
    east.until("watches of this cluster's Services, EndpointSlices and Pods", |api| {
        [SERVICES, SLICES, PODS].iter().all(|p| watched(api, p)).then_some(())
    })
    .await;
    // The Secrets are watched for the Link's one Secret only: the mirror may read no other.
    east.until("the Link's Secret is followed", |api| {
        api.calls().iter().any(|c| c.is_watch() && c.path == secrets_path()).then_some(())
    })
    .await;
    let secret_watches: Vec<Option<String>> = east
        .calls()
        .iter()
        .filter(|c| c.is_watch() && c.path == secrets_path())
        .map(|c| c.param("fieldSelector").map(String::from))
        .collect();
    assert!(
        secret_watches.iter().all(|f| f.as_deref() == Some("metadata.name=cluster-credentials-west")),
        "{secret_watches:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_mirrors_west_by_server_side_apply_slices_before_the_service_and_reports_them_in_its_status() {
    let (east, _west, _served, _mirror) = linked(true).await;
    let up = east
        .until("the Link's status: up with both mirrors", |api| {
            status(api, "west").filter(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 2)
        })
        .await;
    assert_eq!(up.reason, None, "{up:?}");
    let mut mirrors: Vec<(String, String, String, usize)> =
        up.mirrors.iter().map(|m| (m.mirror.clone(), m.remote.clone(), m.mode.clone(), m.endpoints)).collect();
    mirrors.sort();
    assert_eq!(
        mirrors,
        [
            ("shop/db-west".into(), "shop/db".into(), "remote-discovery".into(), 1),
            ("shop/web-west".into(), "shop/web".into(), "gateway".into(), 1),
        ]
    );
    let calls = east.calls();
    // The status subresource, applied whole by the mirror's field manager.
    let status_write = calls.iter().find(|c| c.path.ends_with("/links/west/status")).expect("a status write");
    assert!(status_write.is_apply(), "{} {}", status_write.method, status_write.content_type);
    assert_eq!(status_write.param("fieldManager"), Some(FIELD_MANAGER));
    assert_eq!(status_write.body["kind"], crd::KIND);

    for name in ["web-west", "db-west"] {
        let services = writes(&calls, &Method::PATCH, "services", name);
        let slices = writes(&calls, &Method::PATCH, "endpointslices", name);
        assert!(!services.is_empty() && !slices.is_empty(), "{name}: {}", east.describe_calls());
        assert!(slices[0].0 < services[0].0, "{name}: the slices are applied before the Service");
        for (_, call) in services.iter().chain(&slices) {
            assert!(call.is_apply(), "{} {}", call.path, call.content_type);
            assert_eq!(call.param("fieldManager"), Some(FIELD_MANAGER), "{}", call.path);
            assert_eq!(call.param("force"), Some("true"), "{}", call.path);
        }
        let service = &services[0].1.body;
        assert_eq!((service["apiVersion"].as_str(), service["kind"].as_str()), (Some("v1"), Some("Service")));
        assert_eq!(label(service, MIRRORED_SERVICE_LABEL), Some("true"));
        assert_eq!(label(service, MIRROR_CLUSTER_NAME_LABEL), Some("west"));
        let remote = name.trim_end_matches("-west");
        assert_eq!(
            annotation(service, MIRROR_REMOTE_SERVICE_ANNOTATION),
            Some(format!("{remote}.shop.svc.cluster.local").as_str())
        );
        assert_eq!(annotation(service, MIRROR_LINK_STATE_ANNOTATION), None);
        assert_eq!(service["spec"]["ports"][0]["name"], "http");
        assert_eq!(service["spec"]["ports"][0]["port"], 80);
        assert!(service["spec"]["selector"].is_null(), "a mirror selects no pods: {service}");
        let slice = &slices[0].1.body;
        assert_eq!((slice["apiVersion"].as_str(), slice["kind"].as_str()), (Some(SLICE_API), Some("EndpointSlice")));
        assert_eq!(label(slice, SERVICE_NAME_LABEL), Some(name));
        assert_eq!(label(slice, MIRRORED_SERVICE_LABEL), Some("true"));
        assert_eq!(label(slice, MIRROR_CLUSTER_NAME_LABEL), Some("west"));
        assert_eq!(slice["ports"][0]["name"], "http");
    }
    let web = &writes(&calls, &Method::PATCH, "endpointslices", "web-west")[0].1.body;
    assert_eq!(annotation(web, MIRROR_GATEWAY_IDENTITY_ANNOTATION), Some(GATEWAY_IDENTITY));
    assert_eq!(web["endpoints"][0]["addresses"], json!([GATEWAY_ADDRESS]));
    assert_eq!(web["ports"][0]["port"], 4143);
    let db = &writes(&calls, &Method::PATCH, "endpointslices", "db-west")[0].1.body;
    assert_eq!(
        annotation(db, MIRROR_REMOTE_IDENTITY_ANNOTATION),
        Some("db.shop.serviceaccount.identity.cnimesh.west.local")
    );
    assert_eq!(db["endpoints"][0]["addresses"], json!(["10.2.0.5"]));
    assert_eq!(db["ports"][0]["port"], 8080);
    // What east holds is what was applied, with the ClusterIP east's API server allocated.
    let held = mirror_service(&east, "db-west").expect("db-west in east");
    assert!(held["spec"]["clusterIP"].is_string(), "{held}");
    assert_eq!(addresses(&mirror_slices(&east, "db-west")), ["10.2.0.5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_endpoints_follow_an_unexport_deletes_the_service_first_and_a_deleted_link_takes_its_mirrors() {
    let (east, west, _served, _mirror) = linked(true).await;
    east.until("both mirrors", |api| {
        (mirror_service(api, "web-west").is_some() && addresses(&mirror_slices(api, "db-west")).len() == 1)
            .then_some(())
    })
    .await;

    // A remote endpoint added: a new apply of the slice.
    west.put(pod("db-1", "10.2.0.6", "db"));
    west.put(slice("db", &[("db-0", "10.2.0.5"), ("db-1", "10.2.0.6")]));
    east.until("the new endpoint applied", |api| {
        writes(&api.calls(), &Method::PATCH, "endpointslices", "db-west")
            .iter()
            .any(|(_, c)| addresses(std::slice::from_ref(&c.body)) == ["10.2.0.5", "10.2.0.6"])
            .then_some(())
    })
    .await;
    assert_eq!(addresses(&mirror_slices(&east, "db-west")), ["10.2.0.5", "10.2.0.6"]);

    // Unexported: the Service goes first, then its slices.
    west.put(service("db", None));
    east.until("db-west gone", |api| {
        (mirror_service(api, "db-west").is_none() && mirror_slices(api, "db-west").is_empty()).then_some(())
    })
    .await;
    let calls = east.calls();
    let service_deleted = writes(&calls, &Method::DELETE, "services", "db-west");
    let slices_deleted = writes(&calls, &Method::DELETE, "endpointslices", "db-west");
    assert!(!service_deleted.is_empty() && !slices_deleted.is_empty(), "{}", east.describe_calls());
    assert!(service_deleted[0].0 < slices_deleted[0].0, "the Service is deleted before its slices");
    assert!(mirror_service(&east, "web-west").is_some(), "the other mirror stays");

    // The Link deleted: every mirror it made goes.
    east.remove(crd::API_VERSION, crd::KIND, NS, "west");
    east.until("web-west gone", |api| {
        let west_objects = api
            .list("v1", "Service")
            .into_iter()
            .chain(api.list(SLICE_API, "EndpointSlice"))
            .filter(|o| label(o, MIRROR_CLUSTER_NAME_LABEL) == Some("west"))
            .count();
        (west_objects == 0).then_some(())
    })
    .await;
    assert!(!writes(&east.calls(), &Method::DELETE, "services", "web-west").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_west_keeps_its_mirrors_and_their_endpoints_marked_lost_and_the_mark_goes_when_west_is_back() {
    let (east, west, _served, _mirror) = linked(true).await;
    east.until("the link up with both mirrors", |api| {
        status(api, "west").filter(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 2)
    })
    .await;

    west.refuse(true);
    let lost = east
        .until("the Link's status: lost", |api| status(api, "west").filter(|s| s.state == Some(LinkState::Lost)))
        .await;
    assert!(lost.reason.as_deref().is_some_and(|r| !r.is_empty()), "{lost:?}");
    east.until("both mirrors marked lost", |api| {
        ["web-west", "db-west"]
            .iter()
            .all(|m| {
                mirror_service(api, m)
                    .is_some_and(|s| annotation(&s, MIRROR_LINK_STATE_ANNOTATION) == Some(LINK_STATE_LOST))
            })
            .then_some(())
    })
    .await;
    assert_eq!(addresses(&mirror_slices(&east, "db-west")), ["10.2.0.5"], "the last endpoints are kept");
    assert_eq!(addresses(&mirror_slices(&east, "web-west")), [GATEWAY_ADDRESS]);
    let marked = writes(&east.calls(), &Method::PATCH, "services", "db-west");
    assert!(
        marked
            .iter()
            .any(|(_, c)| c.is_apply() && annotation(&c.body, MIRROR_LINK_STATE_ANNOTATION) == Some(LINK_STATE_LOST)),
        "the mark is applied like any mirror write"
    );

    west.refuse(false);
    east.until("the mark gone from both mirrors, the status up", |api| {
        let unmarked = ["web-west", "db-west"]
            .iter()
            .all(|m| mirror_service(api, m).is_some_and(|s| annotation(&s, MIRROR_LINK_STATE_ANNOTATION).is_none()));
        (unmarked && status(api, "west").is_some_and(|s| s.state == Some(LinkState::Up))).then_some(())
    })
    .await;
    let back = status(&east, "west").unwrap();
    assert_eq!(back.reason, None, "the lost reason goes with the loss: {back:?}");
    assert_eq!(addresses(&mirror_slices(&east, "db-west")), ["10.2.0.5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_whose_secret_carries_a_wrong_token_is_named_unauthorized_and_its_mirrors_are_left_alone() {
    let (_west, served) = west().await;
    let east = ClusterApi::new();
    // A mirror this Link made earlier, when its credentials were good.
    let mut made = service("db-north", None);
    made["metadata"]["labels"] = json!({MIRRORED_SERVICE_LABEL: "true", MIRROR_CLUSTER_NAME_LABEL: "north"});
    made["spec"].as_object_mut().unwrap().remove("selector");
    let made = east.put(made);
    east.put(link("north", true));
    east.put(credentials("north", served.kubeconfig("north", "not-the-token")));
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));

    let refused = east
        .until("the Link's status names the refusal", |api| {
            status(api, "north").and_then(|s| s.reason).filter(|r| r.contains("401") || r.contains("Unauthorized"))
        })
        .await;
    assert!(refused.contains("Unauthorized"), "{refused}");
    assert_ne!(status(&east, "north").unwrap().state, Some(LinkState::Up));
    let writes: Vec<String> = east
        .calls()
        .iter()
        .filter(|c| (c.is_apply() || c.method == Method::DELETE) && !c.path.ends_with("/status"))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(writes.is_empty(), "nothing is written or deleted for a refused Link: {writes:?}");
    assert_eq!(mirror_service(&east, "db-north"), Some(made), "the mirror it made stays as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_of_the_mirror_write_lease_writes_mirrors() {
    let (west, served) = west().await;
    let east = ClusterApi::new();
    let lease_name = leader::lease_name(MIRROR_WRITE);
    let lease = |holder: Option<&str>| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": lease_name, "namespace": NS},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 300, "renewTime": "2026-01-01T00:00:00.000000Z"}})
    };
    east.put(lease(Some("another-replica")));
    // Remote discovery only: no gateway probe wakes the controller up.
    east.put(link("west", false));
    east.put(credentials("west", served.kubeconfig("west", TOKEN)));
    let (stop, stopped) = watch::channel(false);
    let election = ElectionConfig {
        namespace: NS.to_string(),
        identity: "this-replica".to_string(),
        lease_duration: Duration::from_secs(300),
        renew_interval: Duration::from_millis(500),
    };
    let (leadership, _elector) =
        leader::spawn(east.client(), MIRROR_WRITE, election, Arc::new(Metrics::default()), stopped);
    let _mirror = run_mirror(&east, leadership);

    // The controller follows west (all of it listed and watched) while another replica leads.
    west.until("west's Services, EndpointSlices and Pods watched", |api| {
        [SERVICES, SLICES, PODS].iter().all(|p| watched(api, p)).then_some(())
    })
    .await;
    let lease_path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease_name}");
    east.until("two looks at the Lease", |api| {
        (api.calls().iter().filter(|c| c.path == lease_path && c.method == Method::GET).count() >= 2).then_some(())
    })
    .await;

    // The other replica lets go: this one takes the Lease, then writes.
    east.put(lease(None));
    east.until("db-west written", |api| (!mirror_slices(api, "db-west").is_empty()).then_some(())).await;
    let calls = east.calls();
    let taken = calls
        .iter()
        .position(|c| {
            c.path == lease_path && c.method == Method::PUT && c.body["spec"]["holderIdentity"] == "this-replica"
        })
        .expect("the Lease taken");
    let before: Vec<String> = calls[..taken]
        .iter()
        .filter(|c| matches!(c.method, Method::PATCH | Method::DELETE | Method::POST | Method::PUT))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(before.is_empty(), "writes before holding the Lease: {before:?}");
    let _ = stop.send(true);
}

/// A user stanza whose `exec` plugin would create `marker`.
fn exec_user(marker: &Path) -> String {
    format!(
        "exec:\n  apiVersion: client.authentication.k8s.io/v1beta1\n  command: /bin/sh\n  args: [\"-c\", \"touch {}\"]\n  interactiveMode: Never\n",
        marker.display()
    )
}

/// The Link's status once the controller is done with connecting: up, or a reason why not.
async fn settled(east: &ClusterApi, link: &str) -> String {
    east.until("the Link's status: up, or a reason other than connecting", |api| {
        let status = status(api, link)?;
        match (status.state, status.reason) {
            (Some(LinkState::Up), reason) => Some(format!("up ({})", reason.unwrap_or_default())),
            (_, Some(reason)) if reason != "connecting" => Some(reason),
            _ => None,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_stanza_in_a_links_secret_never_runs_in_the_control_plane_and_the_status_names_it() {
    let (west, served) = west().await;
    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("exec-ran");
    let east = ClusterApi::new();
    east.put(link("west", true));
    east.put(credentials("west", served.kubeconfig_with_user("west", &exec_user(&marker))));
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));

    let reason = settled(&east, "west").await;
    assert!(!marker.exists(), "the Link's exec stanza ran inside the control plane (reason: {reason})");
    assert!(reason.contains("users[0].user.exec"), "the status names the field: {reason}");
    assert_ne!(status(&east, "west").unwrap().state, Some(LinkState::Up));
    assert!(west.calls().is_empty(), "nothing was sent to the Link's server: {}", west.describe_calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_in_a_links_secret_is_never_read_nor_sent_and_the_status_names_it() {
    let (west, served) = west().await;
    // A file only the control plane's user can read, which the Link's server would accept.
    let scratch = tempfile::tempdir().unwrap();
    let secret_file = scratch.path().join("issuer-secret");
    std::fs::write(&secret_file, "root-only-secret").unwrap();
    west.require_token("root-only-secret");
    let east = ClusterApi::new();
    east.put(link("west", false));
    east.put(credentials(
        "west",
        served.kubeconfig_with_user("west", &format!("tokenFile: {}", secret_file.display())),
    ));
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));

    let reason = settled(&east, "west").await;
    let sent: Vec<String> = west.calls().iter().filter_map(|c| c.authorization.clone()).collect();
    assert!(
        !sent.iter().any(|a| a.contains("root-only-secret")),
        "the file's content was sent to the Link's server as a token: {sent:?} (reason: {reason})"
    );
    assert!(reason.contains("users[0].user.tokenFile"), "the status names the field: {reason}");
    assert!(west.calls().is_empty(), "nothing was sent to the Link's server: {}", west.describe_calls());
    assert!(mirror_service(&east, "db-west").is_none(), "nothing was mirrored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multicluster_check_never_runs_an_exec_stanza_in_a_links_secret_and_names_the_field() {
    let (west, served) = west().await;
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("exec-ran");
    // East's API server holds the Link and its Secret (base64 `data`, as the API server stores it);
    // the operator's check reads them through east's kubeconfig.
    let kubeconfig = served.kubeconfig_with_user("west", &exec_user(&marker));
    let mut secret = credentials("west", String::new());
    secret.as_object_mut().unwrap().remove("stringData");
    secret["data"] = json!({LINK_CREDENTIALS_KEY: base64_of(&kubeconfig)});
    let east = ClusterApi::new();
    east.put(link("west", false));
    east.put(secret);
    let east_served = east.serve().await;
    let east_kubeconfig = root.path().join("east.kubeconfig");
    east_served.write_kubeconfig(&east_kubeconfig, "east", "operator").unwrap();

    let cli = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(cli)
            .args(["multicluster", "check", "-o", "json", "--kubeconfig"])
            .arg(east_kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!marker.exists(), "`cnimesh multicluster check` ran the Link's exec stanza:\n{text}");
    assert_eq!(out.status.code(), Some(1), "check fails: {text}");
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("check's JSON: {e}\n{text}"));
    let credentials = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == "link west" && c["name"] == "credentials")
        .unwrap_or_else(|| panic!("a credentials check: {report:#}"));
    assert_eq!(credentials["status"], "fail", "{credentials}");
    assert!(credentials["message"].as_str().unwrap().contains("users[0].user.exec"), "{credentials}");
    assert!(west.calls().is_empty(), "nothing was sent to the Link's server: {}", west.describe_calls());
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A linked cluster exporting `name` by remote discovery (one meshed pod at `ip`), answering
/// [`TOKEN`].
async fn exporting(name: &str, ip: &str) -> (Arc<ClusterApi>, Served) {
    let api = ClusterApi::new();
    let pod_name = format!("{name}-0");
    api.put(service(name, Some(MIRROR_EXPORTED_REMOTE_DISCOVERY)));
    api.put(slice(name, &[(&pod_name, ip)]));
    api.put(pod(&pod_name, ip, name));
    api.require_token(TOKEN);
    let served = api.serve().await;
    (api, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_whose_export_has_another_links_mirror_name_is_refused_and_the_owner_keeps_the_mirror() {
    // us-west's `web` and west's `web-us` are both mirrored as `web-us-west`.
    let (_us_west, us_west_served) = exporting("web", "10.3.0.7").await;
    let (_west, west_served) = exporting("web-us", "10.2.0.66").await;
    let east = ClusterApi::new();
    east.put(link_created("us-west", "2026-01-01T00:00:00Z"));
    east.put(credentials("us-west", us_west_served.kubeconfig("us-west", TOKEN)));
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));
    east.until("us-west's web mirrored as web-us-west", |api| {
        (addresses(&mirror_slices(api, "web-us-west")) == ["10.3.0.7"]).then_some(())
    })
    .await;

    // A tenant of west exports `web-us`, and west is linked later: the pair's cluster names
    // overlap, so west is refused as a whole and names us-west.
    east.put(link_created("west", "2026-01-01T00:05:00Z"));
    east.put(credentials("west", west_served.kubeconfig("west", TOKEN)));
    let refused = east
        .until("west's status names the conflict", |api| {
            status(api, "west").filter(|s| !s.cluster_name_conflicts.is_empty())
        })
        .await;
    assert_eq!(
        refused.cluster_name_conflicts.iter().map(|c| (c.link.as_str(), c.refused)).collect::<Vec<_>>(),
        [("us-west", true)]
    );
    assert!(refused.mirrors.is_empty(), "west made no mirror: {refused:?}");
    let mirror = mirror_service(&east, "web-us-west").expect("the mirror stays");
    assert_eq!(
        (label(&mirror, MIRROR_CLUSTER_NAME_LABEL), annotation(&mirror, MIRROR_REMOTE_SERVICE_ANNOTATION)),
        (Some("us-west"), Some("web.shop.svc.cluster.local")),
        "west's export took over us-west's mirror"
    );
    assert_eq!(addresses(&mirror_slices(&east, "web-us-west")), ["10.3.0.7"], "the endpoints stay us-west's");
    let west_writes = writes(&east.calls(), &Method::PATCH, "endpointslices", "web-us-west")
        .into_iter()
        .filter(|(_, c)| label(&c.body, MIRROR_CLUSTER_NAME_LABEL) == Some("west"))
        .count();
    assert_eq!(west_writes, 0, "no write of west's endpoints under us-west's mirror");
}

/// [`link`] to `cluster`, created at `created` (RFC 3339).
fn link_created(cluster: &str, created: &str) -> Value {
    let mut link = link(cluster, false);
    link["metadata"]["creationTimestamp"] = json!(created);
    link
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_mirrored_before_a_link_whose_cluster_name_ends_its_mirror_name_is_withdrawn_and_the_later_link_is_refused()
 {
    // A tenant of west exports `web-us` (mirrored as `web-us-west`) before us-west is linked.
    let (us_west_api, us_west_served) = exporting("web", "10.3.0.7").await;
    let (west_api, west_served) = exporting("web-us", "10.2.0.66").await;
    west_api.put(service("api", Some(MIRROR_EXPORTED_REMOTE_DISCOVERY)));
    west_api.put(slice("api", &[("web-us-0", "10.2.0.66")]));
    let east = ClusterApi::new();
    east.put(link_created("west", "2026-01-01T00:00:00Z"));
    east.put(credentials("west", west_served.kubeconfig("west", TOKEN)));
    let _mirror = run_mirror(&east, Leadership::always(MIRROR_WRITE));
    east.until("west's web-us mirrored as web-us-west", |api| {
        (addresses(&mirror_slices(api, "web-us-west")) == ["10.2.0.66"]).then_some(())
    })
    .await;

    // us-west is linked later: its mirrors would be named like west's `*-us` exports.
    east.put(link_created("us-west", "2026-01-01T00:05:00Z"));
    east.put(credentials("us-west", us_west_served.kubeconfig("us-west", TOKEN)));
    east.until("web-us-west no longer served from west", |api| {
        (mirror_service(api, "web-us-west").is_none() && mirror_slices(api, "web-us-west").is_empty()).then_some(())
    })
    .await;
    // us-west is refused as a whole, naming west; west names us-west and keeps its other mirror.
    let refused = east
        .until("us-west's status names the conflict", |api| {
            status(api, "us-west").filter(|s| !s.cluster_name_conflicts.is_empty())
        })
        .await;
    assert!(refused.mirrors.is_empty(), "{refused:?}");
    assert!(refused.reason.as_deref().is_some_and(|r| r.contains("west")), "{refused:?}");
    assert_eq!(
        refused.cluster_name_conflicts.iter().map(|c| (c.link.as_str(), c.refused)).collect::<Vec<_>>(),
        [("west", true)]
    );
    let kept = east
        .until("west's status names the conflict", |api| {
            status(api, "west").filter(|s| !s.cluster_name_conflicts.is_empty())
        })
        .await;
    assert_eq!(
        kept.cluster_name_conflicts.iter().map(|c| (c.link.as_str(), c.refused)).collect::<Vec<_>>(),
        [("us-west", false)]
    );
    assert_eq!(kept.mirrors.iter().map(|m| m.mirror.as_str()).collect::<Vec<_>>(), ["shop/api-west"]);
    assert!(kept.collisions.iter().any(|c| c.mirror == "shop/web-us-west" && !c.holder), "{kept:?}");
    // Nothing of us-west's was ever written either, and west's endpoints never under its names.
    assert!(mirror_service(&east, "web-us-west").is_none());
    let us_west_writes = writes(&east.calls(), &Method::PATCH, "services", "web-us-west")
        .into_iter()
        .filter(|(_, c)| label(&c.body, MIRROR_CLUSTER_NAME_LABEL) == Some("us-west"))
        .count();
    assert_eq!(us_west_writes, 0, "no mirror of the refused Link");
    drop(us_west_api);
}

/// A kube client for `served` that trusts its CA and sends `token`: a component with its own
/// ServiceAccount.
fn client_with_token(served: &Served, token: &str) -> kube::Client {
    let mut config = kube::Config::new(served.server().parse().unwrap());
    let ca = cnimesh_identity::pem::certs(served.ca_pem.as_bytes(), "east's CA").unwrap();
    config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
    config.auth_info.token = Some(token.to_string().into());
    kube::Client::try_from(config).unwrap()
}

/// The mirror as it is installed: east holds what `cnimesh multicluster install` and `cnimesh
/// multicluster link` print, enforces RBAC, and the mirror runs with its own ServiceAccount's
/// token (elector included). It mirrors west and reports the Link up: its RBAC is enough, and it
/// read no Secret but the Link's, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_with_only_its_own_service_accounts_rbac_mirrors_west_and_holds_its_lease() {
    let (_west, served_west) = west().await;
    let east = ClusterApi::new();
    let anchor = cnimesh_identity::ca::new_trust_anchor("east.local", Duration::from_secs(86400)).unwrap();
    let install = cnimesh_cli::multicluster::install::InstallArgs::default();
    let target = cnimesh_cli::multicluster::link::Target {
        cluster_name: "west".into(),
        cluster_domain: "cluster.local".into(),
        trust_domain: "west.local".into(),
        gateway: Some((GATEWAY_ADDRESS.into(), 4143)),
        server: served_west.server(),
        ca_pem: Some(served_west.ca_pem.clone().into_bytes()),
        token: Some(TOKEN.into()),
    };
    let docs = cnimesh_cli::multicluster::install::render(&install, &anchor.cert_pem, "east.local")
        .unwrap()
        .into_iter()
        .chain(cnimesh_cli::multicluster::link::render(&target).unwrap());
    for doc in docs {
        east.put(doc);
    }
    east.require_token("east-admin");
    east.enforce_rbac(true);
    let served_east = east.serve().await;
    let token = east.issue_token(NS, cnimesh_common::names::MIRROR_NAME, &[]).unwrap();
    let client = client_with_token(&served_east, &token);

    let (stop, stopped) = watch::channel(false);
    let election = ElectionConfig {
        namespace: NS.into(),
        identity: "mirror-0".into(),
        lease_duration: Duration::from_secs(3),
        renew_interval: Duration::from_millis(500),
    };
    let metrics = Arc::new(Metrics::default());
    let (leadership, _elector) =
        leader::spawn(client.clone(), MIRROR_WRITE, election, metrics.clone(), stopped.clone());
    let controller = MirrorController {
        client,
        namespace: NS.to_string(),
        trust_domain: "east.local".to_string(),
        cluster_domain: "cluster.local".to_string(),
        metrics,
        leadership,
    };
    tokio::spawn(controller.run(stopped));
    let _stop = Mirror { stop };
    let up = east
        .until("the Link's status: up with both mirrors, written as the mirror", |api| {
            status(api, "west").filter(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 2)
        })
        .await;
    assert_eq!(up.reason, None, "{up:?}");
    assert!(east.get("v1", "Service", "shop", "web-west").is_some(), "the gateway mirror");
    assert!(east.get("v1", "Service", "shop", "db-west").is_some(), "the remote-discovery mirror");
    let lease = east.get("coordination.k8s.io/v1", "Lease", NS, &leader::lease_name(MIRROR_WRITE)).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "mirror-0", "{lease}");
    let bearer = format!("Bearer {token}");
    let secret_reads: Vec<String> = east
        .calls()
        .iter()
        .filter(|c| c.authorization.as_deref() == Some(bearer.as_str()) && c.path.contains("/secrets"))
        .map(|c| format!("{} {}?{:?}", c.method, c.path, c.param("fieldSelector")))
        .collect();
    assert!(!secret_reads.is_empty());
    assert!(secret_reads.iter().all(|r| r.contains("metadata.name=cluster-credentials-west")), "{secret_reads:#?}");
}
