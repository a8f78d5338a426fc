//! The mirror as a cluster runs it: the real `cnimesh-mirror serve` in a pod (network namespace)
//! of its own, with a kubeconfig for its own ServiceAccount on east's API server (served in
//! east's pod, RBAC enforced, holding what `cnimesh multicluster install` and `link` print), and
//! reaching west's API server (served in west's pod, RBAC enforced too) only through the Link's
//! kubeconfig, as west's mirror reader. No control plane runs: the mirror needs none.

use std::time::Duration;

use cnimesh_e2e::cluster::Cluster;
use cnimesh_e2e::mirror_process::MirrorProcess;
use cnimesh_e2e::multicluster::{install, link};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_mirror::crd::{self, LinkState, LinkStatus};
use serde_json::json;

const WEST_WEB: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop, labels: {mirror.cnimesh.io/exported: 'true'}}\nspec: {ports: [{name: http, port: 80, targetPort: 8080}], selector: {app: web}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints: [{addresses: [10.2.0.4], conditions: {ready: true}}]\n";

#[test]
fn the_mirror_process_in_its_own_pod_mirrors_west_into_east_as_its_own_service_account() {
    if !require_root("the_mirror_process_in_its_own_pod_mirrors_west_into_east_as_its_own_service_account") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let east_pod = Pod::unmeshed(&net, "kube-system", "apiserver-east").unwrap();
    let west_pod = Pod::unmeshed(&net, "kube-system", "apiserver-west").unwrap();
    let mirror_pod = Pod::unmeshed(&net, "cnimesh", "cnimesh-mirror").unwrap();
    let east = Cluster::serve_in(&east_pod.netns.path(), east_pod.ipv4().into()).unwrap();
    let west = Cluster::serve_in(&west_pod.netns.path(), west_pod.ipv4().into()).unwrap();

    // Both clusters as `cnimesh multicluster install` leaves them; west serves `web`.
    let anchor = cnimesh_identity::ca::new_trust_anchor("east.local", Duration::from_secs(86400)).unwrap();
    install(&west, &anchor.cert_pem, "west.local");
    west.apply_yaml("web.yaml", WEST_WEB).unwrap();
    west.api.enforce_rbac(true);
    install(&east, &anchor.cert_pem, "east.local");
    // What `cnimesh multicluster link`, run against west, prints for east.
    link(&east, "west", &west, "west.local", Some("192.0.2.10:4143".parse().unwrap()));
    east.api.enforce_rbac(true);

    let kubeconfig = east.kubeconfig_for("cnimesh", "cnimesh-mirror").unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_cnimesh-mirror-e2e"));
    let _mirror = MirrorProcess::start(bin, &mirror_pod, &kubeconfig, "east.local").unwrap();

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status = runtime.block_on(east.api.until("west's Link up with its mirror", |api| {
        let link = api.get(crd::API_VERSION, crd::KIND, "cnimesh", "west")?;
        let status: LinkStatus = serde_json::from_value(link["status"].clone()).ok()?;
        (status.state == Some(LinkState::Up) && status.mirrors.len() == 1).then_some(status)
    }));
    assert_eq!(status.reason, None, "{status:?}");
    let mirrored = east.api.get("v1", "Service", "shop", "web-west").expect("the mirror Service");
    assert_eq!(mirrored["metadata"]["labels"]["mirror.cnimesh.io/mirrored-service"], "true", "{mirrored}");
    let lease = east.api.get("coordination.k8s.io/v1", "Lease", "cnimesh", "cnimesh-control-mirror-write").unwrap();
    assert!(lease["spec"]["holderIdentity"].as_str().unwrap_or_default().starts_with("cnimesh-mirror"), "{lease}");
}
