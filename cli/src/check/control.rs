//! The control plane Deployment: it exists, its sidecar mode fits the server's version (lesson 12
//! of docs/architecture.md: native sidecars on a server without SidecarContainers get every pod
//! rejected), and its replicas and pods are ready.
//!
//! Layer: runtime (operator CLI).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::kubernetes::{NATIVE_SIDECARS_MINOR, ServerVersion};
use super::report::{Category, Check, plural};
use super::{CONTROL_NAME, CONTROL_NAMESPACE, kube_error, pod_ready, read_hint, terminating};

const CATEGORY: &Category = &Category::ControlPlane;
/// The Deployment's switch for the proxy's form (`auto`, `true`, `false`).
pub const NATIVE_SIDECARS_ENV: &str = "CNIMESH_CONTROL_NATIVE_SIDECARS";

pub async fn check(client: &kube::Client, version: &ServerVersion, checks: &mut Vec<Check>) {
    let exists = "control plane Deployment exists";
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let deployment = match deployments.get_opt(CONTROL_NAME).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            checks.push(Check::fail(
                CATEGORY,
                exists,
                format!("no Deployment {CONTROL_NAME} in namespace {CONTROL_NAMESPACE}"),
                "install the mesh: cnimesh install | kubectl apply -f -",
            ));
            return skip_rest(checks, "no control plane Deployment");
        }
        Err(e) => {
            checks.push(Check::fail(
                CATEGORY,
                exists,
                format!("reading Deployment {CONTROL_NAMESPACE}/{CONTROL_NAME}: {}", kube_error(&e)),
                read_hint(&e, "allow reading deployments in the control plane's namespace"),
            ));
            return skip_rest(checks, "the control plane Deployment could not be read");
        }
    };
    checks.push(Check::ok(CATEGORY, exists, format!("{CONTROL_NAMESPACE}/{CONTROL_NAME}")));
    checks.push(sidecar_mode(&deployment, version));
    checks.push(replicas(&deployment));
    checks.push(pods(client, &deployment).await);
}

fn skip_rest(checks: &mut Vec<Check>, why: &str) {
    for name in
        ["sidecar mode fits the server version", "control plane replicas are ready", "control plane pods are ready"]
    {
        checks.push(Check::skip(CATEGORY, name, format!("skipped: {why}")));
    }
}

/// The value of the env variable in the control plane container: `auto` when unset, the mode
/// that picks native sidecars from the server's version (docs/architecture.md, lesson 12). A value taken from a
/// reference (`valueFrom`) cannot be read here and is treated as unset.
fn sidecar_setting(deployment: &Deployment) -> String {
    let containers = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|s| &s.containers[..]);
    let container = containers.and_then(|cs| cs.iter().find(|c| c.name == CONTROL_NAME).or(cs.first()));
    container
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == NATIVE_SIDECARS_ENV))
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "auto".to_string())
}

fn sidecar_mode(deployment: &Deployment, version: &ServerVersion) -> Check {
    let name = "sidecar mode fits the server version";
    let native = version.at_least(NATIVE_SIDECARS_MINOR);
    let server = version.short();
    let setting = sidecar_setting(deployment);
    let fix = format!("kubectl -n {CONTROL_NAMESPACE} set env deployment/{CONTROL_NAME} {NATIVE_SIDECARS_ENV}=auto");
    match setting.trim().to_ascii_lowercase().as_str() {
        "auto" if native => Check::ok(
            CATEGORY,
            name,
            format!("auto: native sidecars (Kubernetes {server} ≥ 1.{NATIVE_SIDECARS_MINOR})"),
        ),
        "auto" => Check::ok(
            CATEGORY,
            name,
            format!("auto: proxies are regular containers (Kubernetes {server} < 1.{NATIVE_SIDECARS_MINOR})"),
        ),
        "true" if native => Check::ok(CATEGORY, name, format!("true: native sidecars (Kubernetes {server})")),
        "true" => Check::fail(
            CATEGORY,
            name,
            format!(
                "native sidecars need Kubernetes ≥ 1.{NATIVE_SIDECARS_MINOR} (SidecarContainers); this server is {server}: set auto or false"
            ),
            format!("{fix} (the API server drops native sidecars and rejects injected pods)"),
        ),
        "false" => Check::ok(CATEGORY, name, format!("false: proxies are regular containers (Kubernetes {server})")),
        _ => Check::fail(CATEGORY, name, format!("{NATIVE_SIDECARS_ENV}={setting:?} is not auto, true or false"), fix),
    }
}

fn replicas(deployment: &Deployment) -> Check {
    let name = "control plane replicas are ready";
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = deployment.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    let hint = format!(
        "kubectl -n {CONTROL_NAMESPACE} describe deployment {CONTROL_NAME}; kubectl -n {CONTROL_NAMESPACE} logs deployment/{CONTROL_NAME}"
    );
    if ready == 0 {
        Check::fail(CATEGORY, name, format!("0 of {desired} replicas ready: injection and identity are down"), hint)
    } else if ready < desired {
        Check::warn(CATEGORY, name, format!("{ready} of {desired} replicas ready"), hint)
    } else {
        Check::ok(CATEGORY, name, format!("{ready} of {desired} replicas ready"))
    }
}

async fn pods(client: &kube::Client, deployment: &Deployment) -> Check {
    let name = "control plane pods are ready";
    let labels = deployment.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let pods = match api.list(&ListParams::default().labels(&selector.join(","))).await {
        Ok(list) => list.items,
        Err(e) => {
            return Check::fail(
                CATEGORY,
                name,
                format!("listing pods in {CONTROL_NAMESPACE}: {}", kube_error(&e)),
                read_hint(&e, "allow listing pods in the control plane's namespace"),
            );
        }
    };
    let name_of = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    // Terminating pods are a rollout's old ones: they leave, they are not failing.
    let leaving: Vec<String> = pods.iter().filter(|p| terminating(p)).map(name_of).collect();
    let pods: Vec<&Pod> = pods.iter().filter(|p| !terminating(p)).collect();
    let not_ready: Vec<String> = pods.iter().filter(|p| !pod_ready(p)).map(|p| name_of(p)).collect();
    let status = deployment.status.as_ref();
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let rolling_out = deployment.metadata.generation > status.and_then(|s| s.observed_generation)
        || status.and_then(|s| s.updated_replicas).unwrap_or(0) < desired
        || !leaving.is_empty();
    let rollout_hint = format!("kubectl -n {CONTROL_NAMESPACE} rollout status deployment/{CONTROL_NAME}");
    if pods.is_empty() && !leaving.is_empty() {
        Check::fail(
            CATEGORY,
            name,
            format!("only terminating pods ({}): no replica will serve", leaving.join(", ")),
            format!("kubectl -n {CONTROL_NAMESPACE} describe deployment {CONTROL_NAME}"),
        )
    } else if pods.is_empty() {
        Check::fail(
            CATEGORY,
            name,
            "no control plane pods",
            format!("kubectl -n {CONTROL_NAMESPACE} describe deployment {CONTROL_NAME}"),
        )
    } else if !not_ready.is_empty() && rolling_out && not_ready.len() < pods.len() {
        Check::warn(
            CATEGORY,
            name,
            format!(
                "rolling out: {} of {} pods ready; not yet: {}{}",
                pods.len() - not_ready.len(),
                pods.len(),
                not_ready.join(", "),
                if leaving.is_empty() { String::new() } else { format!("; terminating: {}", leaving.join(", ")) }
            ),
            rollout_hint,
        )
    } else if !not_ready.is_empty() {
        Check::fail(
            CATEGORY,
            name,
            format!("{} of {} pods not ready: {}", not_ready.len(), pods.len(), not_ready.join(", ")),
            format!("kubectl -n {CONTROL_NAMESPACE} describe pod {}", not_ready[0]),
        )
    } else if !leaving.is_empty() {
        Check::warn(
            CATEGORY,
            name,
            format!(
                "rolling out: {} ready, {} terminating ({})",
                plural(pods.len(), "pod"),
                leaving.len(),
                leaving.join(", ")
            ),
            rollout_hint,
        )
    } else {
        Check::ok(CATEGORY, name, format!("{} ready", plural(pods.len(), "pod")))
    }
}
