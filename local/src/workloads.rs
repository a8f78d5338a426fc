//! The workloads file (`demo.yaml` beside this module): a few services and clients, validated as a whole before
//! local mode creates anything, then rendered as the Kubernetes objects a cluster would hold.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::Path;

use cnimesh_common::names::{
    CONTROL_PORT, INJECT_ANNOTATION, OWNER_LABEL_PREFIX, PROXY_ADMIN_PORT, PROXY_CONTAINER, WORKLOAD_NAMESPACE_LABEL,
};
use ipnet::Ipv4Net;
use serde::Deserialize;
use serde_json::{Value, json};

/// The range every pod routes to its `eth0`, as a node's routes would send it; ClusterIPs must
/// lie inside it so the connect reaches the capture rules.
pub const SERVICE_RANGE: &str = "10.96.0.0/12";
/// The port each server pod's app listens on (the Services' named target port `http`).
pub const APP_PORT: u16 = 8080;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadsError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: not a valid workloads file: {why}")]
    Parse { path: String, why: String },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workloads {
    /// The Kubernetes namespace of every pod and service.
    pub namespace: String,
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    #[serde(default)]
    pub clients: Vec<ClientSpec>,
    /// An ingress controller in front of the services; unset = none (and nginx not needed).
    #[serde(default)]
    pub ingress: Option<IngressSpec>,
}

/// An ingress controller: Debian's nginx in a meshed pod of its own, annotated
/// `cnimesh.io/inject: ingress` (its proxy in ingress mode, routing each request by the Service
/// its `Host` names), under a ServiceAccount of its own, reachable from the host on `port`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressSpec {
    /// Its pod's and ServiceAccount's name (the identity `allow` lists).
    #[serde(default = "default_ingress_name")]
    pub name: String,
    /// Where nginx listens on the pod's address.
    #[serde(default = "default_ingress_port")]
    pub port: u16,
    /// Which Service answers which `Host`.
    pub routes: Vec<IngressRoute>,
}

/// A request whose `Host` is `host` goes to Service `service`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressRoute {
    pub host: String,
    pub service: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    pub name: String,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Ipv4Addr,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "one")]
    pub replicas: u32,
    pub meshed: bool,
    /// Clients (by name) authorized to call it; unset = no policy, every client may.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// A traffic split (canary): requests to this service go to these services by weight,
    /// through an HTTPRoute with this service as parent; unset = its own replicas only.
    #[serde(default)]
    pub split: Option<Vec<Backend>>,
    /// Exported to linked clusters: `true` through the gateway, `remote-discovery`
    /// straight to the pods (the label `mirror.cnimesh.io/exported`).
    #[serde(default)]
    pub export: Option<String>,
}

/// One service of a split and its weight.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub service: String,
    pub weight: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    pub name: String,
    pub meshed: bool,
    /// Services this client sends traffic to.
    #[serde(default)]
    pub calls: Vec<String>,
}

fn default_port() -> u16 {
    80
}

fn one() -> u32 {
    1
}

fn default_ingress_name() -> String {
    "ingress".into()
}

fn default_ingress_port() -> u16 {
    APP_PORT
}

/// What a pod runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A replica of a service: runs the app.
    Server { service: String },
    /// Sends the traffic.
    Client,
    /// The ingress controller (nginx), its proxy in ingress mode.
    Ingress,
}

/// One pod to create.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub service_account: String,
    pub meshed: bool,
    pub role: Role,
}

fn dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl Workloads {
    /// Reads and validates a workloads file; nothing is created when this fails.
    pub fn load(path: &Path) -> Result<Self, WorkloadsError> {
        let shown = path.display().to_string();
        let body =
            std::fs::read_to_string(path).map_err(|source| WorkloadsError::Read { path: shown.clone(), source })?;
        Self::parse(&body, &shown)
    }

    /// Parses and validates `body`; `origin` names it in errors.
    pub fn parse(body: &str, origin: &str) -> Result<Self, WorkloadsError> {
        let parsed: Self = serde_saphyr::from_str(body)
            .map_err(|e| WorkloadsError::Parse { path: origin.into(), why: e.to_string() })?;
        parsed.validate().map_err(|why| WorkloadsError::Invalid { path: origin.into(), why })?;
        Ok(parsed)
    }

    fn validate(&self) -> Result<(), String> {
        let range: Ipv4Net = SERVICE_RANGE.parse().expect("valid constant");
        if !dns_label(&self.namespace) {
            return Err(format!("namespace {:?} is not a DNS label (a-z, 0-9, -)", self.namespace));
        }
        let mut ips = HashSet::new();
        for s in &self.services {
            if !dns_label(&s.name) {
                return Err(format!("service name {:?} is not a DNS label (a-z, 0-9, -; at most 40)", s.name));
            }
            if !range.contains(&s.cluster_ip) {
                return Err(format!("service {}: clusterIP {} is outside {SERVICE_RANGE}", s.name, s.cluster_ip));
            }
            if !ips.insert(s.cluster_ip) {
                return Err(format!("service {}: clusterIP {} is used twice", s.name, s.cluster_ip));
            }
            if s.port == 0 {
                return Err(format!("service {}: port 0", s.name));
            }
            if !(1..=20).contains(&s.replicas) {
                return Err(format!("service {}: replicas must be 1 to 20, not {}", s.name, s.replicas));
            }
            use cnimesh_common::names::{MIRROR_EXPORTED_GATEWAY, MIRROR_EXPORTED_REMOTE_DISCOVERY};
            if let Some(export) = &s.export
                && ![MIRROR_EXPORTED_GATEWAY, MIRROR_EXPORTED_REMOTE_DISCOVERY].contains(&export.as_str())
            {
                return Err(format!(
                    "service {}: export {export:?}: expected \"true\" or \"remote-discovery\"",
                    s.name
                ));
            }
        }
        if self.clients.is_empty() && self.ingress.is_none() {
            return Err("no clients and no ingress: nothing would send traffic".into());
        }
        for c in &self.clients {
            if !dns_label(&c.name) {
                return Err(format!("client name {:?} is not a DNS label (a-z, 0-9, -; at most 40)", c.name));
            }
            if let Some(unknown) = c.calls.iter().find(|t| !self.services.iter().any(|s| &s.name == *t)) {
                return Err(format!("client {} calls {unknown:?}, which is not a service of this file", c.name));
            }
        }
        for s in &self.services {
            let Some(allow) = &s.allow else { continue };
            if !s.meshed {
                return Err(format!("service {}: `allow` needs a meshed service (its proxies enforce it)", s.name));
            }
            let ingress = self.ingress.as_ref().map(|g| g.name.as_str());
            if let Some(unknown) = allow
                .iter()
                .find(|c| ingress != Some(c.as_str()) && !self.clients.iter().any(|k| &k.name == *c && k.meshed))
            {
                return Err(format!(
                    "service {}: allows {unknown:?}, which is neither a meshed client nor the ingress of this file",
                    s.name
                ));
            }
        }
        for s in &self.services {
            let Some(split) = &s.split else { continue };
            if let Some(unknown) = split.iter().find(|b| self.service(&b.service).is_none()) {
                return Err(format!(
                    "service {}: splits to {:?}, which is not a service of this file",
                    s.name, unknown.service
                ));
            }
            if split.iter().all(|b| b.weight == 0) {
                return Err(format!("service {}: a split needs a weight above 0", s.name));
            }
            if let Some(client) = self.clients.iter().find(|c| !c.meshed && c.calls.contains(&s.name)) {
                return Err(format!(
                    "service {}: client {} is not meshed, and only a client's proxy splits traffic",
                    s.name, client.name
                ));
            }
        }
        if let Some(ingress) = &self.ingress {
            self.validate_ingress(ingress)?;
        }
        let mut names = HashSet::new();
        for pod in self.pods() {
            if !names.insert(pod.name.clone()) {
                return Err(format!("two pods would be named {:?}", pod.name));
            }
        }
        Ok(())
    }

    fn validate_ingress(&self, ingress: &IngressSpec) -> Result<(), String> {
        use cnimesh_common::names::{PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT};
        if !dns_label(&ingress.name) {
            return Err(format!("ingress.name {:?} is not a DNS label (a-z, 0-9, -; at most 40)", ingress.name));
        }
        let proxy_ports = [PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT, PROXY_ADMIN_PORT, CONTROL_PORT];
        if ingress.port == 0 || proxy_ports.contains(&ingress.port) {
            return Err(format!("ingress.port {}: 0 or one of the proxy's ports {proxy_ports:?}", ingress.port));
        }
        if ingress.routes.is_empty() {
            return Err("ingress.routes is empty: the ingress would route nothing".into());
        }
        let mut hosts = HashSet::new();
        for route in &ingress.routes {
            let valid = route.host.split('.').all(dns_label) && route.host.len() <= 253;
            if !valid {
                return Err(format!(
                    "ingress.routes: host {:?} is not a host name (DNS labels joined by dots)",
                    route.host
                ));
            }
            if !hosts.insert(route.host.as_str()) {
                return Err(format!("ingress.routes: host {:?} is routed twice", route.host));
            }
            if self.service(&route.service).is_none() {
                return Err(format!(
                    "ingress.routes: host {:?} goes to {:?}, which is not a service of this file",
                    route.host, route.service
                ));
            }
        }
        Ok(())
    }

    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.iter().find(|s| s.name == name)
    }

    /// Every pod: each service's replicas (`<service>` when there is one, else `<service>-<i>`),
    /// then the clients, then the ingress. A pod's service account is named after its service or client.
    pub fn pods(&self) -> Vec<PodSpec> {
        let servers = self.services.iter().flat_map(|s| {
            (0..s.replicas).map(move |i| PodSpec {
                name: if s.replicas == 1 { s.name.clone() } else { format!("{}-{i}", s.name) },
                service_account: s.name.clone(),
                meshed: s.meshed,
                role: Role::Server { service: s.name.clone() },
            })
        });
        let clients = self.clients.iter().map(|c| PodSpec {
            name: c.name.clone(),
            service_account: c.name.clone(),
            meshed: c.meshed,
            role: Role::Client,
        });
        let ingress = self.ingress.iter().map(|g| PodSpec {
            name: g.name.clone(),
            service_account: g.name.clone(),
            meshed: true,
            role: Role::Ingress,
        });
        servers.chain(clients).chain(ingress).collect()
    }
}

/// The Pod object as `up` creates it on `node` (its status comes from [`pod_status`]); the
/// ingress's pod is annotated for ingress mode, as its Deployment would be.
pub fn pod_object(ns: &str, pod: &PodSpec, node: &str, ingress: Option<&IngressSpec>) -> Value {
    let app = match &pod.role {
        Role::Server { service } => service.as_str(),
        Role::Client | Role::Ingress => pod.name.as_str(),
    };
    let (container, port) = match (&pod.role, ingress) {
        (Role::Ingress, Some(ingress)) => (("nginx", "nginx"), ingress.port),
        _ => (("app", "cnimesh/local-app"), APP_PORT),
    };
    let mut containers = vec![json!({
        "name": container.0, "image": container.1,
        "ports": [{"name": "http", "containerPort": port}],
    })];
    if pod.meshed {
        containers.push(json!({"name": PROXY_CONTAINER, "image": "cnimesh/proxy"}));
    }
    let mut labels = json!({"app": app});
    if pod.meshed {
        // As the injector labels a Deployment's meshed pods: each service or client is one.
        labels[format!("{OWNER_LABEL_PREFIX}deployment")] = json!(app);
        labels[WORKLOAD_NAMESPACE_LABEL] = json!(ns);
    }
    let annotations = match pod.role {
        Role::Ingress => json!({ INJECT_ANNOTATION: "ingress" }),
        _ => json!({}),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {"serviceAccountName": pod.service_account, "nodeName": node, "containers": containers},
    })
}

/// A pod's status at `phase`, as its kubelet reports it; with `ip` once the CNI assigned one
/// (and then Ready).
pub fn pod_status(phase: &str, ip: Option<Ipv4Addr>) -> Value {
    let mut status = json!({"phase": phase});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip.to_string());
        status["podIPs"] = json!([{"ip": ip.to_string()}]);
        status["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    }
    status
}

/// The Service and its EndpointSlice, with every replica in `endpoints` (name, IP) ready.
/// The export label of a service exported to linked clusters (none otherwise).
fn export_labels(s: &ServiceSpec) -> Value {
    match &s.export {
        Some(export) => json!({ cnimesh_common::names::MIRROR_EXPORTED_LABEL: export }),
        None => json!({}),
    }
}

pub fn service_objects(ns: &str, s: &ServiceSpec, endpoints: &[(String, Ipv4Addr)]) -> [Value; 2] {
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": s.name, "namespace": ns, "labels": export_labels(s)},
        "spec": {
            "clusterIP": s.cluster_ip.to_string(),
            "ports": [{"name": "http", "port": s.port, "targetPort": "http"}],
            "selector": {"app": s.name},
        },
    });
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(pod, ip)| {
            json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": ns},
            })
        })
        .collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{}-local", s.name), "namespace": ns, "labels": {"kubernetes.io/service-name": s.name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": APP_PORT, "protocol": "TCP"}],
        "endpoints": endpoints,
    });
    [service, slice]
}

/// The policy objects of a service with `allow`: a Server on its pods' `http` port, and an
/// AuthorizationPolicy requiring one of the allowed clients' identities (their service accounts).
pub fn policy_objects(ns: &str, s: &ServiceSpec) -> Vec<Value> {
    let Some(allow) = &s.allow else { return Vec::new() };
    let group = "policy.cnimesh.io";
    let api_version = "policy.cnimesh.io/v1alpha1";
    let refs: Vec<Value> = allow.iter().map(|c| json!({"kind": "ServiceAccount", "name": c})).collect();
    vec![
        json!({
            "apiVersion": api_version, "kind": "Server",
            "metadata": {"name": s.name, "namespace": ns},
            "spec": {"podSelector": {"matchLabels": {"app": s.name}}, "port": "http", "proxyProtocol": "HTTP/1"},
        }),
        json!({
            "apiVersion": api_version, "kind": "MeshTLSAuthentication",
            "metadata": {"name": format!("{}-clients", s.name), "namespace": ns},
            "spec": {"identityRefs": refs},
        }),
        json!({
            "apiVersion": api_version, "kind": "AuthorizationPolicy",
            "metadata": {"name": format!("{}-clients", s.name), "namespace": ns},
            "spec": {
                "targetRef": {"group": group, "kind": "Server", "name": s.name},
                "requiredAuthenticationRefs": [{"group": group, "kind": "MeshTLSAuthentication", "name": format!("{}-clients", s.name)}],
            },
        }),
    ]
}

/// The HTTPRoute of a service with `split` (the GAMMA profile: the Service as parent), whose one
/// rule sends its requests to the split's services by weight.
pub fn route_objects(ns: &str, s: &ServiceSpec) -> Vec<Value> {
    let Some(split) = &s.split else { return Vec::new() };
    let backends: Vec<Value> =
        split.iter().map(|b| json!({"name": b.service, "port": s.port, "weight": b.weight})).collect();
    vec![json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": format!("{}-split", s.name), "namespace": ns},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": s.name, "port": s.port}],
            "rules": [{"backendRefs": backends}],
        },
    })]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Workloads, WorkloadsError> {
        Workloads::parse(body, "test.yaml")
    }

    #[test]
    fn the_shipped_demo_is_valid() {
        let demo = Workloads::parse(crate::DEMO, "demo.yaml").unwrap();
        let names: Vec<String> = demo.pods().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["web-0", "web-1", "web-2", "web-canary", "legacy", "client", "intruder"]);
        let web = demo.service("web").unwrap();
        let objects = policy_objects("demo", web);
        let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Server", "MeshTLSAuthentication", "AuthorizationPolicy"]);
        let route = &route_objects("demo", web)[0];
        assert_eq!(route["spec"]["parentRefs"][0]["name"], "web");
        let weights: Vec<(&str, u64)> = route["spec"]["rules"][0]["backendRefs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["name"].as_str().unwrap(), b["weight"].as_u64().unwrap()))
            .collect();
        assert_eq!(weights, [("web", 90), ("web-canary", 10)]);
        assert!(route_objects("demo", demo.service("legacy").unwrap()).is_empty());
    }

    #[test]
    fn mistakes_are_named() {
        let base = "namespace: demo\nclients: [{name: client, meshed: true, calls: [web]}]\n";
        let cases = [
            ("namespace: demo\n", "no clients and no ingress"),
            (base, "not a service"),
            ("namespace: Demo\nclients: [{name: c, meshed: true}]\n", "DNS label"),
            ("namespace: demo\nclients: [{name: c, meshed: true, extra: 1}]\n", "unknown field"),
            (
                "namespace: demo\nservices: [{name: web, clusterIP: 10.0.0.1, meshed: true}]\nclients: [{name: c, meshed: true}]\n",
                "outside",
            ),
            (
                "namespace: demo\nservices: [{name: client, clusterIP: 10.96.0.1, meshed: true}]\nclients: [{name: client, meshed: true}]\n",
                "two pods",
            ),
            (
                "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.1, meshed: true, allow: [nobody]}]\nclients: [{name: c, meshed: true}]\n",
                "neither a meshed client nor the ingress",
            ),
            (
                "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.1, meshed: true, split: [{service: nope, weight: 1}]}]\nclients: [{name: c, meshed: true, calls: [web]}]\n",
                "splits to \"nope\"",
            ),
            (
                "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.1, meshed: true, split: [{service: web, weight: 0}]}]\nclients: [{name: c, meshed: true, calls: [web]}]\n",
                "weight above 0",
            ),
            (
                "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.1, meshed: true, split: [{service: web, weight: 1}]}]\nclients: [{name: c, meshed: false, calls: [web]}]\n",
                "not meshed",
            ),
        ];
        let web = "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.1, meshed: true}]\n";
        let ingress_cases = [
            (
                "ingress: {routes: [{host: web.demo, service: nope}]}",
                "ingress.routes: host \"web.demo\" goes to \"nope\"",
            ),
            ("ingress: {routes: []}", "ingress.routes is empty"),
            ("ingress: {routes: [{host: Web.demo, service: web}]}", "host \"Web.demo\" is not a host name"),
            ("ingress: {routes: [{host: a, service: web}, {host: a, service: web}]}", "routed twice"),
            ("ingress: {port: 4143, routes: [{host: a, service: web}]}", "ingress.port 4143"),
            ("ingress: {name: web, routes: [{host: a, service: web}]}", "two pods would be named \"web\""),
            ("ingress: {name: In, routes: [{host: a, service: web}]}", "ingress.name \"In\""),
            ("ingress: {routes: [{host: a, service: web}], tls: true}", "unknown field"),
        ];
        let ingress_cases: Vec<(String, &str)> =
            ingress_cases.into_iter().map(|(i, expected)| (format!("{web}{i}\n"), expected)).collect();
        let cases = cases.into_iter().map(|(b, e)| (b.to_string(), e)).chain(ingress_cases);
        for (body, expected) in cases {
            let e = parse(&body).unwrap_err().to_string();
            assert!(e.contains(expected), "{body:?}: {e}");
        }
    }

    #[test]
    fn an_ingress_is_a_meshed_pod_annotated_for_ingress_mode_that_allow_may_name() {
        let body = "namespace: shop\nservices:\n- {name: web, clusterIP: 10.96.0.1, meshed: true, allow: [edge]}\n\
                    ingress: {name: edge, routes: [{host: web.shop, service: web}]}\n";
        let w = parse(body).unwrap();
        let ingress = w.ingress.as_ref().unwrap();
        assert_eq!(ingress.port, APP_PORT);
        let pod = w.pods().into_iter().find(|p| p.role == Role::Ingress).unwrap();
        assert_eq!((pod.name.as_str(), pod.service_account.as_str(), pod.meshed), ("edge", "edge", true));
        let object = pod_object("shop", &pod, "node", Some(ingress));
        assert_eq!(object["metadata"]["annotations"][INJECT_ANNOTATION], "ingress");
        assert_eq!(object["spec"]["containers"][0]["name"], "nginx");
        assert_eq!(object["spec"]["containers"][1]["name"], PROXY_CONTAINER);
        let web = w.pods().into_iter().find(|p| p.name == "web").unwrap();
        assert_eq!(pod_object("shop", &web, "node", Some(ingress))["metadata"]["annotations"], json!({}));
    }
}
