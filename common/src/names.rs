//! docs/architecture.md, "Names and numbers" in code: the numbers the plugin, the node agent, the proxy, the control plane and
//! the manifests must agree on. Change one here and every crate follows; the manifests under
//! `daemonset/` are checked against these by their tests.

/// The proxy runs as this UID; the capture rules let its own traffic out unredirected, so no
/// other container of a meshed pod may use it.
pub const PROXY_UID: u32 = 2102;
/// Inbound TCP is redirected here.
pub const PROXY_INBOUND_PORT: u16 = 4143;
/// Outbound TCP is redirected here (the proxy listens on loopback).
pub const PROXY_OUTBOUND_PORT: u16 = 4140;
/// The proxy's admin server: `/ready`, `/live`, `/metrics`.
pub const PROXY_ADMIN_PORT: u16 = 4191;
/// The control plane's gRPC port (Identity, Destination), on its Service too.
pub const CONTROL_PORT: u16 = 4190;
/// After SIGTERM the proxy keeps accepting (not ready) this long by default, ms: its clients
/// learn only a moment later that the endpoint is gone. The injector shortens it for a pod with
/// a short `terminationGracePeriodSeconds`.
pub const PROXY_SHUTDOWN_DELAY_MS: u64 = 5_000;
/// Then in-flight work drains for up to this long by default, ms. Delay and drain stay inside
/// Kubernetes' default `terminationGracePeriodSeconds` (30).
pub const PROXY_SHUTDOWN_GRACE_MS: u64 = 20_000;
/// Inbound ports never captured: the control plane's and the proxy's own, and the ports of other
/// meshes' agents a pod may run beside (4567, 4568).
pub const DEFAULT_SKIP_INBOUND_PORTS: &[u16] = &[CONTROL_PORT, PROXY_ADMIN_PORT, 4567, 4568];
/// Outbound ports never captured: TLS to the world and the Kubernetes API.
pub const DEFAULT_SKIP_OUTBOUND_PORTS: &[u16] = &[443, 6443];

/// The sidecar's container name: its presence is what marks a pod as meshed.
pub const PROXY_CONTAINER: &str = "cnimesh-proxy";
/// The control plane's namespace, Deployment, Service and ServiceAccount name.
pub const CONTROL_NAMESPACE: &str = "cnimesh";
pub const CONTROL_NAME: &str = "cnimesh-control";
/// The multicluster mirror's Deployment and ServiceAccount (in [`CONTROL_NAMESPACE`]): apart from
/// the control plane, so the process holding the identity issuer's key holds no linked cluster's
/// credentials and cannot write Services or EndpointSlices.
pub const MIRROR_NAME: &str = "cnimesh-mirror";
/// The control plane's admin listener (`/metrics`, `/ready`, `/live`, `/tap`), port name `admin`.
pub const CONTROL_ADMIN_PORT: u16 = 9990;
/// The ServiceAccount (in [`CONTROL_NAMESPACE`]) whose token the control plane's tap relay
/// requires: permission to mint a token for it is what an operator is given to tap.
pub const TAP_SERVICE_ACCOUNT: &str = "cnimesh-tap";
/// The audience of those tokens: not the Identity service's, so a tap token cannot ask for a
/// certificate and no workload's token can tap.
pub const TAP_TOKEN_AUDIENCE: &str = "tap.cnimesh.io";
/// The node agents' namespace and DaemonSet name.
pub const AGENT_NAMESPACE: &str = "cnimesh-system";
pub const AGENT_NAME: &str = "cnimesh-node";
/// The agent's health listener (hostNetwork): `/ready`, `/live` and `/status`, which
/// `cnimesh check` reads through the API server's pod proxy.
pub const AGENT_HEALTH_PORT: u16 = 4192;
/// Namespaces whose pods are never captured: the cluster's own and ours, so they start while
/// the node agent is down (it decides every other pod).
pub const DEFAULT_EXCLUDED_NAMESPACES: &[&str] = &["kube-system", CONTROL_NAMESPACE, AGENT_NAMESPACE];

/// `enabled` / `disabled` on a namespace (label) or a pod (annotation).
pub const INJECT_ANNOTATION: &str = "cnimesh.io/inject";
/// Per-pod configuration annotations.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.cnimesh.io/skip-inbound-ports";
pub const SKIP_OUTBOUND_PORTS_ANNOTATION: &str = "config.cnimesh.io/skip-outbound-ports";
pub const SKIP_SUBNETS_ANNOTATION: &str = "config.cnimesh.io/skip-subnets";
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.cnimesh.io/opaque-ports";
pub const LOG_LEVEL_ANNOTATION: &str = "config.cnimesh.io/proxy-log-level";
/// On an ingress controller's pod: the namespaces whose Services its proxy routes to by name
/// (`*` or a comma-separated list).
pub const INGRESS_NAMESPACES_ANNOTATION: &str = "config.cnimesh.io/ingress-namespaces";
/// Labels the injector puts on meshed pods, for operators to aggregate by workload (Linkerd's
/// `linkerd.io/proxy-<kind>`): `cnimesh.io/proxy-deployment: web`, and the workload's namespace.
pub const OWNER_LABEL_PREFIX: &str = "cnimesh.io/proxy-";
pub const WORKLOAD_NAMESPACE_LABEL: &str = "cnimesh.io/workload-ns";
/// The workload kinds an owner label names, lower case as in the label keys.
pub const OWNER_KINDS: &[&str] = &["deployment", "statefulset", "daemonset", "replicaset", "job", "cronjob"];
/// On a namespace or pod: the inbound policy of ports no Server names (`all-unauthenticated`,
/// `all-authenticated`, `cluster-authenticated`, `deny`); the control plane's flag is the default.
pub const DEFAULT_INBOUND_POLICY_ANNOTATION: &str = "config.cnimesh.io/default-inbound-policy";

/// The agent's state directory and decision socket on every node.
pub const STATE_DIR: &str = "/var/lib/cnimesh";
pub const AGENT_SOCKET: &str = "/var/run/cnimesh/node.sock";

// Failure accrual and declared protocols (A)
/// On a Service (Linkerd's `balancer.linkerd.io/…`): `consecutive` turns on failure accrual for
/// its endpoints in every client's balancer; the others tune it (docs/tasks/circuit-breaking.md).
pub const FAILURE_ACCRUAL_ANNOTATION: &str = "balancer.cnimesh.io/failure-accrual";
pub const FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION: &str =
    "balancer.cnimesh.io/failure-accrual-consecutive-max-failures";
pub const FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION: &str = "balancer.cnimesh.io/failure-accrual-consecutive-min-penalty";
pub const FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION: &str = "balancer.cnimesh.io/failure-accrual-consecutive-max-penalty";
pub const FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION: &str =
    "balancer.cnimesh.io/failure-accrual-consecutive-jitter-ratio";
/// Linkerd's defaults for those: 7 failures, penalties from 1 s to 1 min, half of each jittered.
pub const FAILURE_ACCRUAL_DEFAULT_MAX_FAILURES: u32 = 7;
pub const FAILURE_ACCRUAL_DEFAULT_MIN_PENALTY: std::time::Duration = std::time::Duration::from_secs(1);
pub const FAILURE_ACCRUAL_DEFAULT_MAX_PENALTY: std::time::Duration = std::time::Duration::from_secs(60);
pub const FAILURE_ACCRUAL_DEFAULT_JITTER_RATIO: f64 = 0.5;
/// A Service port's `appProtocol` values that declare its protocol (no detection): HTTP/1,
/// HTTP/2 with prior knowledge, HTTP/1 with upgrades (WebSocket), opaque TCP (ours and Linkerd's).
pub const APP_PROTOCOL_HTTP: &str = "http";
pub const APP_PROTOCOL_H2C: &str = "kubernetes.io/h2c";
pub const APP_PROTOCOL_WS: &str = "kubernetes.io/ws";
pub const APP_PROTOCOL_OPAQUE: &str = "cnimesh.io/opaque";
pub const APP_PROTOCOL_LINKERD_OPAQUE: &str = "linkerd.io/opaque";

// Multicluster (the contract between the mirror controller, Destination, the proxy's
// gateway mode, the CLI and local mode; docs/tasks/multicluster.md)
/// On a Service in a linked cluster: `true` mirrors it through that cluster's gateway,
/// `remote-discovery` mirrors it straight to its pods (flat network).
pub const MIRROR_EXPORTED_LABEL: &str = "mirror.cnimesh.io/exported";
pub const MIRROR_EXPORTED_GATEWAY: &str = "true";
pub const MIRROR_EXPORTED_REMOTE_DISCOVERY: &str = "remote-discovery";
/// On a Service in several clusters: `member` joins it to `<name>-federated` in every linked
/// cluster (endpoints: the union of the members' pods, by remote discovery).
pub const MIRROR_FEDERATED_LABEL: &str = "mirror.cnimesh.io/federated";
pub const MIRROR_FEDERATED_MEMBER: &str = "member";
/// On every mirror Service and EndpointSlice: `true`; and the target cluster's name (for a
/// federated Service: the label is absent, the annotation below lists the members).
pub const MIRRORED_SERVICE_LABEL: &str = "mirror.cnimesh.io/mirrored-service";
pub const MIRROR_CLUSTER_NAME_LABEL: &str = "mirror.cnimesh.io/cluster-name";
/// On a mirror Service: `<name>.<namespace>.svc.<target cluster domain>`, the remote Service.
pub const MIRROR_REMOTE_SERVICE_ANNOTATION: &str = "mirror.cnimesh.io/remote-svc-fq-name";
/// On a mirror Service: the remote Service's resourceVersion last mirrored.
pub const MIRROR_REMOTE_RESOURCE_VERSION_ANNOTATION: &str = "mirror.cnimesh.io/remote-resource-version";
/// On a mirror Service: `lost` while its link is lost (its endpoints are the last ones seen).
pub const MIRROR_LINK_STATE_ANNOTATION: &str = "mirror.cnimesh.io/link-state";
/// On a federated Service: the member clusters, comma separated (`local` is this cluster).
pub const MIRROR_FEDERATED_MEMBERS_ANNOTATION: &str = "mirror.cnimesh.io/federated-members";
/// On a mirror EndpointSlice of a gateway export: the gateway's identity. Its one endpoint is the
/// gateway, its ports the gateway port under each Service port's name; Destination serves it with
/// this identity, the remote FQDN:port as authority override and opaque transport to that port.
pub const MIRROR_GATEWAY_IDENTITY_ANNOTATION: &str = "mirror.cnimesh.io/remote-gateway-identity";
/// On a mirror EndpointSlice of a remote-discovery or federated Service: the identity every
/// endpoint of the slice proves (slices are grouped by identity); its endpoints are remote pods.
pub const MIRROR_REMOTE_IDENTITY_ANNOTATION: &str = "mirror.cnimesh.io/remote-identity";
/// On a mirror EndpointSlice: the remote pods' opaque ports (as [`OPAQUE_PORTS_ANNOTATION`]).
pub const MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION: &str = "mirror.cnimesh.io/remote-opaque-ports";
/// The `target_cluster_name` metric label Destination puts on a mirror's endpoints, which the
/// proxy adds to the series of traffic to them.
pub const TARGET_CLUSTER_METRIC_LABEL: &str = "target_cluster_name";
/// The `target_cluster_name` Destination gives a federated Service's members in
/// the cluster's own (the mirror controller's name for it); the proxy leaves such endpoints
/// unlabelled, like every other local endpoint.
pub const MIRROR_LOCAL_CLUSTER: &str = "local";
/// The gateway's namespace, name (Deployment, Service, ServiceAccount) and the ServiceAccount a
/// linked cluster's mirror reads this cluster as.
pub const MULTICLUSTER_NAMESPACE: &str = "cnimesh-multicluster";
pub const GATEWAY_NAME: &str = "cnimesh-gateway";
pub const MIRROR_READER_SERVICE_ACCOUNT: &str = "cnimesh-mirror-reader";
/// The Secret type and key of a Link's credentials.
pub const LINK_CREDENTIALS_SECRET_TYPE: &str = "mirror.cnimesh.io/remote-kubeconfig";
pub const LINK_CREDENTIALS_KEY: &str = "kubeconfig";
// The gateway's view of Destination
/// In the `context_token` of a Destination request (a JSON object, as Linkerd's tokens are):
/// `{"cnimesh.io/caller": "gateway"}` is sent by a proxy in gateway mode, and Destination then
/// answers it as if only Services labelled `exported=true` existed. The marker only ever
/// restricts what its sender sees, so it needs no authentication.
pub const CONTEXT_TOKEN_CALLER_KEY: &str = "cnimesh.io/caller";
pub const CONTEXT_TOKEN_GATEWAY: &str = "gateway";
