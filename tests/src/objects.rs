//! Kubernetes objects as YAML for the tests' cluster ([`crate::cluster::Cluster::apply_yaml`]),
//! shared by the tests and benchmarks that build a small cluster.

use std::net::Ipv4Addr;

/// Service `name` of namespace `shop` (port 80 → the apps' HTTP port) and its one meshed
/// replica `pod` at `ip`, labelled `app: <name>` and running as service account `sa`.
pub fn service_yaml(name: &str, cluster_ip: &str, pod: &str, ip: Ipv4Addr, sa: &str) -> String {
    let port = crate::apps::HTTP_PORT;
    [
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n  selector: {{app: {name}}}\n"
        ),
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {pod}, namespace: shop}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: shop\n  labels: {{app: {name}}}\nspec:\n  serviceAccountName: {sa}\n  containers:\n    - name: app\n      image: app\n      ports: [{{name: http, containerPort: {port}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ),
    ]
    .join("---\n")
}
