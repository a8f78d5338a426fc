//! The pure core: an admission request in, a JSON patch (or a reason not to inject) out. Nothing
//! here does I/O, so every decision is testable with plain JSON.
//!
//! The patch is computed against the raw object the API server sent, never against a typed
//! round trip of it: k8s-openapi drops fields it does not know (a newer API server's), and a
//! patch built from the typed view could not be applied to the real object. Typed structs are
//! used only to read the pod and to build what we add.
//!
//! Layer: model (pure).

use std::collections::BTreeMap;

use cnimesh_identity::{Name, TOKEN_AUDIENCE};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, MoveOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use super::config::InjectConfig;
use super::policy_env::{
    CLUSTER_NETWORKS_ENV, INBOUND_PORTS_ENV, NamespaceDefault, POLICY_DEFAULT_ENV, effective_default, inbound_ports,
    skipped_port_warnings,
};
use super::shutdown_env::shutdown_env;
use super::trace_env::{TraceSettings, append_env};
use super::validate::{check_log_level, check_ports};
use crate::workload::{Workload, owner_labels};

/// docs/architecture.md, "Names and numbers", shared with the node agent (which captures pods by the proxy container's
/// name) and the proxy: one declaration in `cnimesh_common::names`.
pub use cnimesh_common::names::{
    INGRESS_NAMESPACES_ANNOTATION, INJECT_ANNOTATION, LOG_LEVEL_ANNOTATION, OPAQUE_PORTS_ANNOTATION, PROXY_ADMIN_PORT,
    PROXY_CONTAINER,
};
/// Set on injected pods; the value is the webhook's version.
pub const INJECTED_ANNOTATION: &str = "cnimesh.io/injected";

pub const TOKEN_VOLUME: &str = "cnimesh-identity-token";
pub const TOKEN_DIR: &str = "/var/run/secrets/tokens";
/// Must equal the proxy's `DEFAULT_TOKEN_FILE` (`proxy/src/app/config.rs`; a test checks).
pub const TOKEN_FILE: &str = "/var/run/secrets/tokens/cnimesh-identity-token";
/// The projected token lives a day; the kubelet refreshes it at 80% and the proxy re-reads it.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 86400;
/// The proxy reads its trust anchors (PEM) from this variable (`proxy/src/app/config.rs`).
pub const TRUST_ANCHORS_ENV: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM";
/// The ConfigMap the control plane keeps in every namespace (`cnimesh_control::trust_bundle`), and the
/// injected volume that mounts it (optional: a namespace it has not reached yet costs nothing but
/// the re-read until it has).
pub const TRUST_BUNDLE_CONFIG_MAP: &str = "cnimesh-trust-bundle";
pub const TRUST_BUNDLE_DIR: &str = "/var/run/cnimesh/trust-bundle";
/// The bundle's key; its endorsement is this plus `cnimesh_identity::endorsement::ENDORSEMENT_SUFFIX`.
pub const TRUST_BUNDLE_KEY: &str = "ca.crt";
/// The proxy follows this file, taking it only when the identity in the next variable endorses it.
pub const TRUST_ANCHORS_FILE_ENV: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS";
pub const TRUST_ANCHORS_ENDORSED_BY_ENV: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY";
/// When the pod was given its anchors (Unix seconds, less the clock skew endorsements may have):
/// the proxy passes over a bundle endorsed earlier, so a ConfigMap writer cannot replay a bundle
/// holding an anchor a rotation dropped before the pod was admitted.
pub const TRUST_ANCHORS_ENDORSED_SINCE_ENV: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_SINCE";

/// Namespaces whose pods are never injected, whatever they say: the control plane's own (see
/// [`InjectConfig::control_namespace`]) is added to these.
pub const NEVER_INJECTED: &[&str] = &["kube-system"];

/// Whether the pod's namespace is labelled `cnimesh.io/inject=enabled`. The webhook does not read
/// namespaces: the MutatingWebhookConfiguration has one entry per case, selected by
/// `namespaceSelector`, and each calls its own path (see `server`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceInjection {
    /// Inject every pod unless it is annotated `cnimesh.io/inject: disabled`.
    Enabled,
    /// Inject only pods annotated `cnimesh.io/inject: enabled`.
    NotEnabled,
}

impl NamespaceInjection {
    /// For callers that do have the namespace's labels (local mode, tests).
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        match labels.get(INJECT_ANNOTATION).map(String::as_str) {
            Some("enabled") => Self::Enabled,
            _ => Self::NotEnabled,
        }
    }
}

/// Why a pod is admitted without the proxy, or refused.
///
/// A pod that asked for the mesh is never admitted without it because of something its owner
/// can fix (a bad annotation, a UID or volume clash): that is `Refuse`. An admission warning is
/// not enough there, because for a Deployment's pods nobody reads it (the ReplicaSet controller
/// creates them); a refusal shows as a `FailedCreate` event with the reason, and the controller
/// retries once the template is fixed. `Warn` is left for pods the mesh can never carry (host
/// network, excluded namespaces) and for objects that cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Nobody asked for injection, or the pod already has its proxy: nothing to say.
    Quietly,
    /// The pod cannot be meshed by design: admitted without the proxy, and the API client sees
    /// this warning.
    Warn(String),
    /// The pod must be meshed and cannot be as it is (or right now): it is refused (fail closed),
    /// and its controller tries again.
    Refuse(String),
}

/// The values that differ from pod to pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProxySettings {
    pub identity: Name,
    /// Validated `config.cnimesh.io/opaque-ports`; `None` keeps the proxy's defaults.
    pub opaque_ports: Option<String>,
    pub log_level: String,
}

/// A planned injection: the patch, and what the API client should be told about the result
/// (ports the proxy does not protect, a default that had to fail closed).
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    pub patch: Patch,
    pub warnings: Vec<String>,
}

impl Injection {
    fn nothing() -> Self {
        Self { patch: Patch(Vec::new()), warnings: Vec::new() }
    }
}

/// Answers one admission request. A pod the mesh can never carry is admitted unchanged with a
/// warning; a pod that asked for the mesh and cannot have it as written is refused with the
/// reason (see [`Skip`]; the failure policy discussion is in `daemonset/README.md`).
/// `ns_default` is the namespace's default-inbound-policy annotation as the caller could read it.
pub fn mutate(
    request: &AdmissionRequest<DynamicObject>,
    namespace: NamespaceInjection,
    ns_default: &NamespaceDefault,
    config: &InjectConfig,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
    if !is_pod || request.operation != Operation::Create || request.sub_resource.is_some() {
        return response;
    }
    let result = match &request.object {
        None => Err(Skip::Warn("the request carries no pod".into())),
        Some(object) => serde_json::to_value(object)
            .map_err(|e| Skip::Warn(format!("cannot read the pod: {e}")))
            .and_then(|pod| plan(&pod, request.namespace.as_deref(), namespace, ns_default, None, config)),
    };
    let pod = || format!("{}/{}", request.namespace.as_deref().unwrap_or("?"), pod_name(request));
    match result {
        Ok(injection) if injection.patch.0.is_empty() => response,
        Ok(Injection { patch, warnings }) => match response.clone().with_patch(patch) {
            Ok(mut patched) => {
                tracing::info!(pod = %pod(), uid = %request.uid, "injecting the proxy");
                // kubectl prints these; the log keeps them for whoever did not run kubectl.
                for warning in &warnings {
                    tracing::warn!(pod = %pod(), "{warning}");
                }
                patched.warnings = (!warnings.is_empty()).then_some(warnings);
                patched
            }
            Err(error) => warn(response, &pod(), &format!("cannot encode the patch: {error}")),
        },
        Err(Skip::Quietly) => response,
        Err(Skip::Warn(why)) => warn(response, &pod(), &why),
        Err(Skip::Refuse(why)) => {
            tracing::warn!(pod = %pod(), "refusing the pod: {why}");
            response.deny(format!("cnimesh: {PROXY_CONTAINER} cannot be injected: {why}"))
        }
    }
}

fn warn(mut response: AdmissionResponse, pod: &str, why: &str) -> AdmissionResponse {
    tracing::warn!(%pod, "not injecting the proxy: {why}");
    response.warnings = Some(vec![format!("cnimesh: {PROXY_CONTAINER} not injected: {why}")]);
    response
}

/// Pods of a Deployment have no name yet, only `generateName`.
fn pod_name(request: &AdmissionRequest<DynamicObject>) -> String {
    let meta = request.object.as_ref().map(|o| &o.metadata);
    let name = meta.and_then(|m| m.name.clone()).filter(|n| !n.is_empty());
    let generated = || meta.and_then(|m| m.generate_name.clone()).map(|g| format!("{g}*"));
    name.or_else(generated).unwrap_or_else(|| request.name.clone())
}

/// The patch that injects the proxy into `pod` (the raw JSON object), an empty patch when there
/// is nothing to do, or why not. `request_namespace` is the request's: a pod from a Deployment's
/// template has no namespace of its own yet. `ns_default` is the namespace's default inbound
/// policy as the caller could read it. `workload` is the pod's owner when the caller knows it
/// (`cnimesh inject` on a Deployment); `None` reads it from the pod's owner references.
pub fn plan(
    pod: &Value,
    request_namespace: Option<&str>,
    namespace: NamespaceInjection,
    ns_default: &NamespaceDefault,
    workload: Option<&Workload>,
    config: &InjectConfig,
) -> Result<Injection, Skip> {
    let typed: Pod =
        serde_json::from_value(pod.clone()).map_err(|e| Skip::Warn(format!("cannot read the pod: {e}")))?;
    let annotation = |key: &str| typed.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str);
    // `ingress`, as Linkerd's: an ingress controller's pod, whose proxy routes each request by
    // the Service it names (the proxy's ingress mode).
    let (wanted, ingress) = match annotation(INJECT_ANNOTATION) {
        Some("enabled") => (true, false),
        Some(INJECT_INGRESS) => (true, true),
        Some("disabled") => (false, false),
        None => (namespace == NamespaceInjection::Enabled, false),
        Some(other) => {
            // Someone meant to say something about the mesh: guessing "no" would start it unmeshed.
            return Err(Skip::Refuse(format!(
                "annotation {INJECT_ANNOTATION}: {other:?} is neither enabled, ingress nor disabled"
            )));
        }
    };
    if !wanted {
        return Err(Skip::Quietly);
    }
    let ns = typed
        .metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .or(request_namespace)
        .ok_or_else(|| Skip::Warn("the pod has no namespace".into()))?;
    if NEVER_INJECTED.contains(&ns) || ns == config.control_namespace {
        return Err(Skip::Warn(format!("pods in namespace {ns} are never meshed")));
    }
    let spec = typed.spec.as_ref().ok_or_else(|| Skip::Warn("the pod has no spec".into()))?;
    let injected_before = annotation(INJECTED_ANNOTATION).is_some();
    if let Some(patch) = already_injected(spec, injected_before)? {
        return Ok(Injection { patch, ..Injection::nothing() });
    }
    if spec.host_network == Some(true) {
        return Err(Skip::Warn("it uses the host network, where traffic cannot be captured".into()));
    }
    check_uids(spec, config.proxy_uid).map_err(Skip::Refuse)?;
    let taken: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    if let Some(ours) = [TOKEN_VOLUME, TRUST_BUNDLE_CONFIG_MAP].into_iter().find(|v| taken.contains(v)) {
        return Err(Skip::Refuse(format!("the pod already has a volume named {ours}")));
    }

    if !config.trust_anchors_pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(Skip::Refuse("the control plane has no trust anchors loaded yet; try again".into()));
    }
    // Opaque ports change how the app's traffic is carried: a bad list is refused, not guessed at.
    let opaque_ports = annotation(OPAQUE_PORTS_ANNOTATION)
        .map(|v| check_ports(v).map_err(|why| Skip::Refuse(format!("annotation {OPAQUE_PORTS_ANNOTATION}: {why}"))))
        .transpose()?;
    // Logs and traces are observability only: a bad value costs the setting, never the mesh.
    let mut warnings = Vec::new();
    let log_level = match annotation(LOG_LEVEL_ANNOTATION).map(|level| (level, check_log_level(level))) {
        Some((level, Ok(()))) => level,
        Some((_, Err(why))) => {
            warnings.push(format!(
                "cnimesh: annotation {LOG_LEVEL_ANNOTATION}: {why}; ignored, the proxy logs at {:?}",
                config.log_level
            ));
            &config.log_level
        }
        None => &config.log_level,
    };
    // The config's settings already carry the namespace's annotations (the caller read them).
    let trace_env = config
        .tracing
        .overridden_by(&TraceSettings::annotated(typed.metadata.annotations.as_ref(), "the pod"))
        .env()
        .unwrap_or_else(|why| {
            warnings.push(format!("cnimesh: {why}; ignored, the proxy does not trace"));
            Vec::new()
        });
    let settings =
        PodProxySettings { identity: pod_identity(spec, ns, config)?, opaque_ports, log_level: log_level.into() };
    let mut container = proxy_container(config, &settings).map_err(Skip::Refuse)?;
    let pod_key =
        format!("{ns}/{}", typed.metadata.name.as_deref().or(typed.metadata.generate_name.as_deref()).unwrap_or("?"));
    let (default_policy, fail_closed) =
        effective_default(&typed.metadata, &pod_key, ns_default, config.default_inbound_policy);
    add_policy_env(&mut container, config, default_policy.as_str(), inbound_ports(spec));
    append_env(&mut container, trace_env);
    append_env(&mut container, shutdown_env(spec.termination_grace_period_seconds));
    if ingress {
        append_env(&mut container, ingress_env(config, annotation(INGRESS_NAMESPACES_ANNOTATION)));
    }
    warnings.extend(fail_closed.map(|w| format!("cnimesh: {w}")));
    warnings.extend(skipped_port_warnings(&typed.metadata, spec));
    let owner = workload.cloned().or_else(|| Workload::of_pod(&typed.metadata));
    Ok(Injection { patch: injection_patch(pod, config, container, owner_labels(owner.as_ref(), ns)), warnings })
}

/// `cnimesh.io/inject: ingress`: the pod is an ingress controller's.
pub const INJECT_INGRESS: &str = "ingress";

/// The proxy of an ingress controller's pod: ingress mode, resolving Service names of the
/// cluster's domain, in the namespaces the pod's annotation lists (the proxy checks the list and
/// refuses to start on a bad one, naming the variable).
fn ingress_env(config: &InjectConfig, namespaces: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("CNIMESH_PROXY_MODE", INJECT_INGRESS.into()),
        ("CNIMESH_PROXY_CLUSTER_DOMAIN", config.cluster_domain.clone()),
    ];
    if let Some(namespaces) = namespaces {
        env.push(("CNIMESH_PROXY_INGRESS_NAMESPACES", namespaces.to_string()));
    }
    env
}

/// What the proxy needs to enforce inbound policy from its first connection, before the control
/// plane answers: the effective default, the ports to ask about at once, and the cluster
/// networks `cluster-authenticated` admits.
fn add_policy_env(container: &mut Container, config: &InjectConfig, default_policy: &str, ports: Option<String>) {
    let mut vars = vec![(POLICY_DEFAULT_ENV, default_policy.to_string())];
    if let Some(ports) = ports {
        vars.push((INBOUND_PORTS_ENV, ports));
    }
    if !config.cluster_networks.is_empty() {
        let networks: Vec<String> = config.cluster_networks.iter().map(ToString::to_string).collect();
        vars.push((CLUSTER_NETWORKS_ENV, networks.join(",")));
    }
    let env = container.env.get_or_insert_with(Vec::new);
    env.extend(vars.into_iter().map(|(name, value)| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }));
}

/// `Some(patch)` when the pod has its proxy already. A second pass is then a no-op, except that
/// a native sidecar which another webhook pushed down the init containers is moved back to the
/// front (`reinvocationPolicy: IfNeeded`): init containers before it would have no network.
/// `injected_before`: the pod carries our annotation, so a proxy init container without
/// `restartPolicy: Always` is ours, stripped by an API server without native sidecars.
fn already_injected(spec: &k8s_openapi::api::core::v1::PodSpec, injected_before: bool) -> Result<Option<Patch>, Skip> {
    if spec.containers.iter().any(|c| c.name == PROXY_CONTAINER) {
        return Ok(Some(Patch(Vec::new())));
    }
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let Some(index) = init.iter().position(|c| c.name == PROXY_CONTAINER) else { return Ok(None) };
    if init[index].restart_policy.as_deref() != Some("Always") {
        if injected_before {
            return Err(Skip::Warn(format!(
                "the API server dropped `restartPolicy: Always` from the {PROXY_CONTAINER} native sidecar this \
                 webhook injected: it does not support native sidecars (Kubernetes < 1.29, or the \
                 SidecarContainers feature gate is off), and it will reject the pod because init containers \
                 may not have probes. Set CNIMESH_CONTROL_NATIVE_SIDECARS=auto (the default) or false"
            )));
        }
        return Err(Skip::Warn(format!(
            "it has an init container named {PROXY_CONTAINER} that is not a sidecar (restartPolicy: Always)"
        )));
    }
    if index == 0 {
        return Ok(Some(Patch(Vec::new())));
    }
    let path = |i: usize| pointer(&["spec", "initContainers", &i.to_string()]);
    Ok(Some(Patch(vec![PatchOperation::Move(MoveOperation { from: path(index), path: path(0) })])))
}

/// The node agent refuses to capture a pod where another container runs as the proxy's UID (its
/// traffic would bypass the proxy): better a warning now than a pod stuck in ContainerCreating.
fn check_uids(spec: &k8s_openapi::api::core::v1::PodSpec, proxy_uid: i64) -> Result<(), String> {
    let pod_uid = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for c in containers {
        if c.security_context.as_ref().and_then(|s| s.run_as_user).or(pod_uid) == Some(proxy_uid) {
            return Err(format!(
                "container {} runs as the proxy's UID {proxy_uid}, so its traffic would bypass the proxy",
                c.name
            ));
        }
    }
    Ok(())
}

/// `<sa>.<ns>.serviceaccount.identity.cnimesh.<trust-domain>`; the service account defaults to
/// `default` as the API server would set it.
fn pod_identity(spec: &k8s_openapi::api::core::v1::PodSpec, ns: &str, config: &InjectConfig) -> Result<Name, Skip> {
    #[allow(deprecated)] // `serviceAccount` is the old spelling some manifests still use.
    let sa = spec.service_account_name.as_deref().or(spec.service_account.as_deref()).filter(|s| !s.is_empty());
    let sa = sa.unwrap_or("default");
    // A dot would make the name ambiguous: Certify splits it back into service account and namespace.
    if sa.contains('.') {
        return Err(Skip::Refuse(format!("service account {sa:?} contains a dot and cannot be an identity name")));
    }
    Name::for_service_account(sa, ns, &config.trust_domain).map_err(|e| Skip::Refuse(format!("identity: {e}")))
}

/// The pod as the control plane's InboundServerPolicies knows it (`namespace:name`), for the
/// proxy's policy discovery. A pod's name is often only known once it exists (`generateName`),
/// so the kubelet fills it in from the downward API and expands the reference.
fn policy_workload_env() -> [EnvVar; 3] {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), api_version: None }),
            ..Default::default()
        }),
    };
    [
        field("CNIMESH_POD_NAMESPACE", "metadata.namespace"),
        field("CNIMESH_POD_NAME", "metadata.name"),
        EnvVar {
            name: "CNIMESH_PROXY_POLICY_WORKLOAD".into(),
            value: Some("$(CNIMESH_POD_NAMESPACE):$(CNIMESH_POD_NAME)".into()),
            value_from: None,
        },
    ]
}

/// [`TRUST_ANCHORS_ENDORSED_SINCE_ENV`] for a pod admitted at `now`.
fn endorsed_since(now: std::time::SystemTime) -> u64 {
    let now = now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    now.saturating_sub(cnimesh_identity::endorsement::MAX_SKEW.as_secs())
}

/// The sidecar. As a native sidecar (`config.native_sidecars`) it carries `restartPolicy: Always`
/// and a startup probe, so the kubelet starts the app containers only once the proxy is ready.
pub fn proxy_container(config: &InjectConfig, pod: &PodProxySettings) -> Result<Container, String> {
    let control = config.control_identity().map_err(|e| format!("the control plane's identity: {e}"))?;

    let mut env = vec![
        ("CNIMESH_PROXY_LOG", pod.log_level.clone()),
        ("CNIMESH_PROXY_IDENTITY_NAME", pod.identity.to_string()),
        (TRUST_ANCHORS_ENV, config.trust_anchors_pem.clone()),
        // Then the namespace's bundle, once the control plane endorses it: rotations reach the
        // proxy without a restart.
        (TRUST_ANCHORS_FILE_ENV, format!("{TRUST_BUNDLE_DIR}/{TRUST_BUNDLE_KEY}")),
        (TRUST_ANCHORS_ENDORSED_BY_ENV, control.to_string()),
        (TRUST_ANCHORS_ENDORSED_SINCE_ENV, endorsed_since(std::time::SystemTime::now()).to_string()),
        ("CNIMESH_PROXY_IDENTITY_TOKEN_FILE", TOKEN_FILE.into()),
        ("CNIMESH_PROXY_IDENTITY_ADDR", config.control_addr()),
        ("CNIMESH_PROXY_IDENTITY_SVC_NAME", control.to_string()),
        ("CNIMESH_PROXY_DESTINATION_ADDR", config.control_addr()),
    ];
    if let Some(ports) = &pod.opaque_ports {
        env.push(("CNIMESH_PROXY_OPAQUE_PORTS", ports.clone()));
    }
    if config.json_logs {
        env.push(("CNIMESH_LOG_FORMAT", "json".into()));
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(PROXY_ADMIN_PORT)),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(1),
        ..Default::default()
    };
    let native = config.native_sidecars;
    Ok(Container {
        name: PROXY_CONTAINER.into(),
        image: Some(config.proxy_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        restart_policy: native.then(|| "Always".into()),
        env: Some(
            env.into_iter()
                .map(|(name, value)| EnvVar { name: name.into(), value: Some(value), value_from: None })
                .chain(policy_workload_env())
                .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("cnimesh-admin".into()),
            container_port: i32::from(PROXY_ADMIN_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // Up to two minutes to obtain a first certificate; the liveness probe waits for it.
        startup_probe: native.then(|| probe("/ready", 1, 120)),
        readiness_probe: Some(probe("/ready", 5, 3)),
        liveness_probe: Some(Probe { initial_delay_seconds: (!native).then_some(10), ..probe("/live", 10, 3) }),
        resources: Some(resources(config)),
        security_context: Some(SecurityContext {
            run_as_user: Some(config.proxy_uid),
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: TOKEN_VOLUME.into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: TRUST_BUNDLE_CONFIG_MAP.into(),
                mount_path: TRUST_BUNDLE_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    })
}

fn resources(config: &InjectConfig) -> ResourceRequirements {
    let r = &config.resources;
    let map = |cpu: &Option<String>, memory: &Option<String>| {
        let entries = [("cpu", cpu), ("memory", memory)];
        let map: BTreeMap<String, Quantity> =
            entries.into_iter().filter_map(|(k, v)| Some((k.to_string(), Quantity(v.clone()?)))).collect();
        (!map.is_empty()).then_some(map)
    };
    ResourceRequirements {
        requests: map(&r.cpu_request, &r.memory_request),
        limits: map(&r.cpu_limit, &r.memory_limit),
        ..Default::default()
    }
}

/// The projected token (audience `identity.cnimesh.io`, which only Certify accepts), and the
/// namespace's trust bundle (the anchors the proxy starts with travel in the environment).
pub fn proxy_volumes() -> Vec<Volume> {
    let token = ServiceAccountTokenProjection {
        audience: Some(TOKEN_AUDIENCE.into()),
        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
        path: TOKEN_VOLUME.into(),
    };
    let bundle =
        ConfigMapVolumeSource { name: TRUST_BUNDLE_CONFIG_MAP.into(), optional: Some(true), ..Default::default() };
    vec![
        Volume {
            name: TOKEN_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection { service_account_token: Some(token), ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume { name: TRUST_BUNDLE_CONFIG_MAP.into(), config_map: Some(bundle), ..Default::default() },
    ]
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn to_value(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("k8s-openapi types serialise")
}

/// Adds `items` to the array at `path`: at its front or its end. A missing (or null) array is
/// created whole, because JSON patch cannot add an element to an array that is not there.
fn extend_array(ops: &mut Vec<PatchOperation>, pod: &Value, path: &[&str], front: bool, items: Vec<Value>) {
    let exists = pod.pointer(pointer(path).as_str()).is_some_and(Value::is_array);
    if !exists {
        ops.push(add(pointer(path), Value::Array(items)));
        return;
    }
    for (i, item) in items.into_iter().enumerate() {
        let index = if front { i.to_string() } else { "-".to_string() };
        let mut tokens = path.to_vec();
        tokens.push(&index);
        ops.push(add(pointer(&tokens), item));
    }
}

fn injection_patch(
    pod: &Value,
    config: &InjectConfig,
    container: Container,
    labels: BTreeMap<String, String>,
) -> Patch {
    let mut ops = Vec::new();
    let volumes = proxy_volumes().into_iter().map(to_value).collect();
    extend_array(&mut ops, pod, &["spec", "volumes"], false, volumes);
    let list = if config.native_sidecars { "initContainers" } else { "containers" };
    extend_array(&mut ops, pod, &["spec", list], true, vec![to_value(container)]);
    let version = Value::String(env!("CARGO_PKG_VERSION").into());
    let annotations = serde_json::Map::from_iter([(INJECTED_ANNOTATION.to_string(), version)]);
    let labels = labels.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    add_metadata(&mut ops, pod, [("annotations", annotations), ("labels", labels)]);
    Patch(ops)
}

/// Adds entries to the pod's metadata maps, creating a missing map (or metadata) whole: JSON patch
/// cannot add a key to a map that is not there. An existing key gets the new value.
fn add_metadata(ops: &mut Vec<PatchOperation>, pod: &Value, maps: [(&str, serde_json::Map<String, Value>); 2]) {
    if !pod.pointer("/metadata").is_some_and(Value::is_object) {
        let metadata = maps.into_iter().map(|(field, map)| (field.to_string(), Value::Object(map))).collect();
        ops.push(add(pointer(&["metadata"]), Value::Object(metadata)));
        return;
    }
    for (field, map) in maps {
        if pod.pointer(pointer(&["metadata", field]).as_str()).is_some_and(Value::is_object) {
            for (key, value) in map {
                ops.push(add(pointer(&["metadata", field, &key]), value));
            }
        } else {
            ops.push(add(pointer(&["metadata", field]), Value::Object(map)));
        }
    }
}
