//! Whether a pod is meshed, and the redirect spec its annotations ask for.
//!
//! A pod is meshed when it carries a `cnimesh-proxy` container — a regular container or a native
//! sidecar (init container with `restartPolicy: Always`) — and is not annotated
//! `cnimesh.io/inject=disabled`. Annotation lists *add* to the node defaults: the proxy's own
//! control and admin ports stay skipped whatever a pod says.

use cnimesh_cni::agent::Decision;
use cnimesh_cni::spec::{PortRange, RedirectSpec, parse_port_list};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Container, Pod};

use cnimesh_common::names::{
    INJECT_ANNOTATION, PROXY_CONTAINER, SKIP_INBOUND_PORTS_ANNOTATION, SKIP_OUTBOUND_PORTS_ANNOTATION,
    SKIP_SUBNETS_ANNOTATION,
};

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The pod's proxy container, if it has one.
pub fn proxy_container(pod: &Pod) -> Option<&Container> {
    let spec = pod.spec.as_ref()?;
    let regular = spec.containers.iter().find(|c| c.name == PROXY_CONTAINER);
    let sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == PROXY_CONTAINER && c.restart_policy.as_deref() == Some("Always"));
    regular.or(sidecar)
}

/// Why a pod is not meshed, or `None` when it is.
pub fn not_meshed_reason(pod: &Pod) -> Option<String> {
    if annotation(pod, INJECT_ANNOTATION) == Some("disabled") {
        return Some(format!("annotated {INJECT_ANNOTATION}=disabled"));
    }
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Some("uses the host network".into());
    }
    if proxy_container(pod).is_none() {
        return Some(format!("has no {PROXY_CONTAINER} container"));
    }
    None
}

pub fn is_meshed(pod: &Pod) -> bool {
    not_meshed_reason(pod).is_none()
}

fn add_ports(list: &mut Vec<PortRange>, pod: &Pod, key: &str) -> Result<(), String> {
    if let Some(text) = annotation(pod, key) {
        list.extend(parse_port_list(text).map_err(|e| format!("annotation {key}: {e}"))?);
    }
    Ok(())
}

/// The spec for a meshed pod.
pub fn spec_for(pod: &Pod, defaults: &RedirectSpec) -> Result<RedirectSpec, String> {
    let mut spec = defaults.clone();
    add_ports(&mut spec.skip_inbound_ports, pod, SKIP_INBOUND_PORTS_ANNOTATION)?;
    add_ports(&mut spec.skip_outbound_ports, pod, SKIP_OUTBOUND_PORTS_ANNOTATION)?;
    if let Some(text) = annotation(pod, SKIP_SUBNETS_ANNOTATION) {
        for net in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let parsed: IpNet =
                net.parse().map_err(|_| format!("annotation {SKIP_SUBNETS_ANNOTATION}: invalid CIDR {net:?}"))?;
            spec.skip_outbound_subnets.push(parsed);
        }
    }
    // The proxy's UID: its container's runAsUser, else the pod's, else the default.
    let pod_uid = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()?.run_as_user);
    let effective_uid = |c: &Container| c.security_context.as_ref().and_then(|s| s.run_as_user).or(pod_uid);
    if let Some(uid) = proxy_container(pod).and_then(effective_uid) {
        spec.proxy_uid = u32::try_from(uid).map_err(|_| format!("runAsUser {uid} is not a valid UID"))?;
    }
    // Traffic of the proxy's UID is never captured: an app sharing it would silently bypass the
    // mesh, and so would everything running as root.
    if spec.proxy_uid == 0 {
        return Err(format!("the {PROXY_CONTAINER} container would run as root (UID 0): give it its own runAsUser"));
    }
    let spec_ref = pod.spec.as_ref();
    let others = spec_ref.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    if let Some(c) =
        others.filter(|c| c.name != PROXY_CONTAINER).find(|c| effective_uid(c) == Some(i64::from(spec.proxy_uid)))
    {
        return Err(format!(
            "container {} runs as the proxy's UID {}: its traffic would bypass the proxy; set a different runAsUser",
            c.name, spec.proxy_uid
        ));
    }
    let spec = spec.normalized();
    spec.validate()?;
    Ok(spec)
}

/// The answer to give the plugin for this pod.
pub fn decide(pod: &Pod, defaults: &RedirectSpec) -> Decision {
    if let Some(reason) = not_meshed_reason(pod) {
        return Decision::Skip { reason };
    }
    match spec_for(pod, defaults) {
        Ok(spec) => Decision::Capture { spec },
        // Retrying will not fix an annotation: the pod fails with a message naming it.
        Err(message) => Decision::Error { message, retry: false },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn meshed(annotations: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"containers": [{"name": "app"}, {"name": "cnimesh-proxy", "securityContext": {"runAsUser": 2102}}]}
        }))
    }

    #[test]
    fn regular_and_native_sidecar_proxies_are_meshed() {
        assert!(matches!(decide(&meshed(json!({})), &RedirectSpec::default()), Decision::Capture { .. }));
        let native = pod(json!({"metadata": {"name": "n"}, "spec": {
            "initContainers": [{"name": "cnimesh-proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "app"}]}}));
        assert!(is_meshed(&native));
        let plain_init = pod(json!({"metadata": {"name": "n"}, "spec": {
            "initContainers": [{"name": "cnimesh-proxy"}], "containers": [{"name": "app"}]}}));
        assert!(!is_meshed(&plain_init), "a run-to-completion init container is not a proxy");
    }

    #[test]
    fn opt_outs_and_unmeshed_pods_are_skipped() {
        let d = decide(&meshed(json!({"cnimesh.io/inject": "disabled"})), &RedirectSpec::default());
        assert_eq!(d, Decision::Skip { reason: "annotated cnimesh.io/inject=disabled".into() });
        let plain = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}}));
        assert!(matches!(decide(&plain, &RedirectSpec::default()), Decision::Skip { .. }));
        let host = pod(json!({"metadata": {"name": "h"}, "spec": {"hostNetwork": true,
            "containers": [{"name": "cnimesh-proxy"}]}}));
        assert!(
            matches!(decide(&host, &RedirectSpec::default()), Decision::Skip { reason } if reason.contains("host network"))
        );
    }

    #[test]
    fn annotations_add_to_defaults_and_uid_comes_from_the_proxy() {
        let mut p = meshed(json!({
            SKIP_INBOUND_PORTS_ANNOTATION: "8081, 9000-9100",
            SKIP_OUTBOUND_PORTS_ANNOTATION: "5432",
            SKIP_SUBNETS_ANNOTATION: "10.96.0.0/12,fd00::/8",
        }));
        p.spec.as_mut().unwrap().containers[1].security_context.as_mut().unwrap().run_as_user = Some(1337);
        let Decision::Capture { spec } = decide(&p, &RedirectSpec::default()) else { panic!() };
        let inbound: Vec<String> = spec.skip_inbound_ports.iter().map(ToString::to_string).collect();
        assert_eq!(inbound, ["4190", "4191", "4567", "4568", "8081", "9000-9100"]);
        assert!(spec.skip_outbound_ports.contains(&PortRange::single(5432)));
        assert_eq!(spec.skip_outbound_subnets.len(), 2);
        assert_eq!(spec.proxy_uid, 1337);
    }

    #[test]
    fn a_shared_or_root_proxy_uid_is_refused() {
        let shared = pod(json!({"metadata": {"name": "s"}, "spec": {"securityContext": {"runAsUser": 1000},
            "containers": [{"name": "app"}, {"name": "cnimesh-proxy"}]}}));
        let d = decide(&shared, &RedirectSpec::default());
        assert!(
            matches!(&d, Decision::Error { message, retry: false } if message.contains("container app runs as the proxy's UID 1000")),
            "{d:?}"
        );
        let root = pod(
            json!({"metadata": {"name": "r"}, "spec": {"containers": [{"name": "app", "securityContext": {"runAsUser": 1000}},
            {"name": "cnimesh-proxy", "securityContext": {"runAsUser": 0}}]}}),
        );
        assert!(
            matches!(decide(&root, &RedirectSpec::default()), Decision::Error { message, .. } if message.contains("root"))
        );
        // The pod default is fine when the proxy has its own UID.
        let ok = pod(json!({"metadata": {"name": "o"}, "spec": {"securityContext": {"runAsUser": 1000},
            "containers": [{"name": "app"}, {"name": "cnimesh-proxy", "securityContext": {"runAsUser": 2102}}]}}));
        assert!(matches!(decide(&ok, &RedirectSpec::default()), Decision::Capture { .. }));
    }

    #[test]
    fn bad_annotations_are_named_and_not_retried() {
        let d = decide(&meshed(json!({SKIP_INBOUND_PORTS_ANNOTATION: "80,abc"})), &RedirectSpec::default());
        let Decision::Error { message, retry } = d else { panic!("{d:?}") };
        assert!(!retry);
        assert!(message.contains(SKIP_INBOUND_PORTS_ANNOTATION) && message.contains("abc"), "{message}");
        let d = decide(&meshed(json!({SKIP_SUBNETS_ANNOTATION: "10.0.0.0/99"})), &RedirectSpec::default());
        assert!(matches!(d, Decision::Error { message, .. } if message.contains("10.0.0.0/99")));
    }
}
