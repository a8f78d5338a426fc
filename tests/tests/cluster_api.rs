//! The tests' cluster API server where a cluster's processes reach theirs: served in a pod at the
//! pod's address, it answers `kubectl` run in another pod with the admin kubeconfig, sees what
//! the test wrote in memory, and refuses a client without the token.

use cnimesh_e2e::cluster::Cluster;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

#[test]
fn kubectl_in_another_pod_reaches_the_api_server_served_in_a_pod_and_only_with_its_token() {
    if !require_root("kubectl_in_another_pod_reaches_the_api_server_served_in_a_pod_and_only_with_its_token") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let server_pod = Pod::unmeshed(&net, "kube-system", "apiserver").unwrap();
    let client_pod = Pod::unmeshed(&net, "shop", "client").unwrap();
    let cluster = Cluster::serve_in(&server_pod.netns.path(), server_pod.ipv4().into()).unwrap();
    cluster
        .apply_yaml(
            "web.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: shop}\ndata: {greeting: hello}\n",
        )
        .unwrap();
    let kubeconfig = cluster.kubeconfig();
    let kubectl = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", client_pod.netns.name(), "kubectl", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(args)
            .output()
            .unwrap()
    };
    let got = kubectl(&["get", "configmap", "web", "-n", "shop", "-o", "jsonpath={.data.greeting}"]);
    assert!(got.status.success(), "{}", String::from_utf8_lossy(&got.stderr));
    assert_eq!(String::from_utf8_lossy(&got.stdout), "hello");

    let no_token = kubectl(&["get", "configmaps", "-A", "--token", "guessed"]);
    assert!(!no_token.status.success(), "a wrong token is refused");
    assert!(
        String::from_utf8_lossy(&no_token.stderr).contains("Unauthorized"),
        "{}",
        String::from_utf8_lossy(&no_token.stderr)
    );

    cluster.delete_file("web.yaml");
    assert!(cluster.api.get("v1", "ConfigMap", "shop", "web").is_none(), "deleting the file deletes its objects");
}
