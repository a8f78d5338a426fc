//! The cluster the attacks run against: a `shop` namespace, the `api-0` pod described in YAML for
//! the control plane's local mode, its Servers and authorizations, and the attacker's tools (a
//! plaintext pod that is not authorized anywhere).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use cnimesh_e2e::Pod;
use cnimesh_e2e::control::Control;
use cnimesh_e2e::sidecar::http_in;

/// `api-0` with `ports` (name, number) on its app container, an HTTP readiness probe on
/// `probe` (port name, path) when given, and pod annotations.
pub fn pod_yaml(
    ip: Ipv4Addr,
    ports: &[(String, u16)],
    probe: Option<(&str, &str)>,
    annotations: &[(&str, &str)],
) -> String {
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = annotations.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        format!("\n  annotations: {{{}}}", list.join(", "))
    };
    let ports: Vec<String> =
        ports.iter().map(|(name, port)| format!("{{name: {name}, containerPort: {port}}}")).collect();
    let probe = probe
        .map(|(port, path)| format!("\n      readinessProbe: {{httpGet: {{port: {port}, path: {path}}}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: api-0\n  namespace: shop\n  labels: {{app: api}}{annotations}\nspec:\n  serviceAccountName: api\n  containers:\n    - name: app\n      image: api\n      ports: [{}]{probe}\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n",
        ports.join(", ")
    )
}

/// A Server on `api-0`'s port named `port` that only the `office` network (`cidr`) may use.
pub fn office_only_server(name: &str, port: &str, protocol: &str, office: Ipv4Addr) -> String {
    [
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  podSelector: {{matchLabels: {{app: api}}}}\n  port: {port}\n  proxyProtocol: {protocol}\n"),
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {{name: office-{name}, namespace: shop}}\nspec:\n  networks: [{{cidr: {office}/32}}]\n"),
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: office-to-{name}, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: {name}}}\n  requiredAuthenticationRefs: [{{group: policy.cnimesh.io, kind: NetworkAuthentication, name: office-{name}}}]\n"),
    ]
    .join("---\n")
}

/// The environment of `api-0`'s proxy: its identity, the control plane for discovery and policy,
/// and `extra`.
pub fn api_proxy_env(control: &Control, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = control.proxy_env("shop", "api", &control.token("shop", "api").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:api-0".into()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// A GET from `client` on a fresh connection: the status, 0 when the connection was closed
/// without an answer.
pub fn status(client: &Pod<'_>, to: SocketAddr, path: &str) -> u16 {
    http_in(&client.netns.path(), &to.to_string(), "GET", path, "").map_or(0, |(status, _)| status)
}

/// Touches `ports` of `ip` one after the other, each with one request on a connection of its
/// own that ends before the next starts (what a port scan looks like to the proxy).
pub fn touch(client: &Pod<'_>, ip: Ipv4Addr, ports: impl IntoIterator<Item = u16>) {
    for port in ports {
        status(client, SocketAddr::new(ip.into(), port), "/");
    }
}

/// An opaque connection from `client`, open: the server's greeting read.
pub fn open_opaque(client: &Pod<'_>, to: SocketAddr, greeting: &str) -> TcpStream {
    let greeting = greeting.to_string();
    cnimesh_cni::netns::run_in(&client.netns.path(), move || {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut got = vec![0; greeting.len()];
        s.read_exact(&mut got)?;
        assert_eq!(String::from_utf8_lossy(&got), greeting);
        std::io::Result::Ok(s)
    })
    .unwrap()
    .unwrap()
}

/// Whether an echoing connection still echoes (false: closed or reset).
pub fn echoes(s: &mut TcpStream) -> bool {
    let mut got = [0u8; 4];
    s.write_all(b"ping").is_ok() && s.read_exact(&mut got).is_ok() && &got == b"ping"
}
