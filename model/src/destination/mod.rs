//! Destination: service discovery for proxies, as `io.linkerd.proxy.destination.Destination`
//! (linkerd2-proxy-api), so a stock linkerd2-proxy can use it as well as ours (docs/architecture.md, "Control plane protocol").
//!
//! Cluster state flows one way: a `cnimesh_control::sources::Source` turns Services,
//! EndpointSlices (discovery.k8s.io/v1) and Pods into [`Change`]s on an [`Index`]; the
//! `cnimesh_control::grpc::destination::DestinationService` streams answers from that
//! index. The source is `KubeSource` (in `cnimesh_control::sources`): kube-rs watchers (list, then
//! watch with resume; a 410 Gone re-lists), all namespaces, never polling. Needs list/watch on
//! services, pods and endpointslices. Tests and local mode run it against the in-process API
//! server (cnimesh-apiserver); an object that does not read as its kind is logged and its last
//! good version stays in force.
//!
//! Wiring (what `cnimesh_control::serve` does):
//! The wiring, with the servers, is in `cnimesh_control::sources`' documentation.
//!
//! Answers:
//! - `Get("<svc>.<ns>.svc.<cluster-domain>:<port>")` (also `<svc>.<ns>.svc:<port>` and
//!   `<svc>.<ns>:<port>`) streams `add`/`remove` as ready endpoints change. The first message comes
//!   at once: an `add` if the service has endpoints, else `no_endpoints{exists: true}`; unknown
//!   services get `no_endpoints{exists: false}` (not NotFound: the stream stays open and turns into
//!   adds if the service appears, and meanwhile the client may use DNS). Malformed paths and IP
//!   paths get InvalidArgument naming the expected form.
//! - Endpoints of meshed pods (a `cnimesh-proxy` container, or native-sidecar init container)
//!   carry the pod's service-account identity and an H2 hint, or the Opaque hint on ports listed in
//!   the pod's `config.cnimesh.io/opaque-ports`. Named targetPorts resolve through the slice's
//!   ports, else the pod's container ports.
//! - `GetProfile("<ip>:<port>")`: a ClusterIP gives the service's FQDN (the proxy then calls
//!   `Get`), a pod IP gives that endpoint (`endpoint`, with identity and hint), anything else a
//!   passthrough profile; `GetProfile("<service name>:<port>")` gives the FQDN if the service
//!   exists. `opaque_protocol` follows the opaque-ports annotation of the Service or Pod. Profiles
//!   are live streams too.
//!
//! A multicluster gateway marks its requests (`context_token`) and is answered as if only the
//! Services exported through it existed ([`caller`]).
//!
//! Until the source has loaded every kind once (the first list, or the first read of the
//! directory), requests wait: answering earlier could tell a proxy that a service does not exist
//! when it has merely not been listed yet. [`Index::is_ready`] is meant for the readiness probe.
//!
//! Streams share per-service (and per-IP) watch channels holding one snapshot. The updates of a
//! `Get` stream are worked out and encoded once per service port and change, and shared by every
//! stream that stood at the same state ([`updates`]); an idle stream has no task or timer of our own.
//!
//! Layer: model/index (pure): this module and its children use neither the kube client nor tonic;
//! the sources are `cnimesh_control::sources`, the gRPC service `cnimesh_control::grpc::destination`.

pub mod accrual;
pub mod app_protocol;
pub mod caller;
pub mod follower;
pub mod index;
mod model;
pub mod path;
pub mod read;
pub mod resolve;
/// Objects as the tests write them (`object(kind, yaml)`), for this crate's tests and, behind
/// `test-util`, the servers'.
#[cfg(any(test, feature = "test-util"))]
pub mod test_objects;
pub mod updates;

pub use caller::Caller;
pub use index::{Change, Index, IndexStats};
pub use model::{
    Conflict, Declaration, KINDS, Kind, Object, PodRecord, PortSet, ServiceRecord, SliceRecord, declared_for_pod_port,
};
#[doc(hidden)]
pub use path::parse_for_fuzzing as parse_path_for_fuzzing;

/// What the answers depend on besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Suffix of service names after `.svc.`; Kubernetes' `--cluster-domain`.
    pub cluster_domain: String,
    /// The trust domain identities are issued in (docs/architecture.md, "Names and numbers").
    pub trust_domain: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".to_string(),
            trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string(),
        }
    }
}
