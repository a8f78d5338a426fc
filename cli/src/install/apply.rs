//! Puts [`Values`] into the documents of `daemonset/`. Each setting lands where the files already
//! hold its default, so the default values rewrite every field with what it holds (tested:
//! byte-identical output); settings the files leave to a binary's own default (the proxy's) are
//! added as variables only when they differ from it.

use anyhow::Context;
use serde_json::{Value, json};

use super::values::{LogFormat, Quantities, Resources, Values};
use super::{DEFAULT_CONTROL_NAMESPACE, NodeRepair};
use cnimesh_common::names::{AGENT_NAME, CONTROL_NAME};

/// What the binaries read to choose their log format (cnimesh_common::logging).
pub const LOG_FORMAT_ENV: &str = "CNIMESH_LOG_FORMAT";
/// What the webhook passes on to the proxies it injects.
pub const PROXY_LOG_FORMAT_ENV: &str = "CNIMESH_CONTROL_PROXY_LOG_FORMAT";

/// Fills one document in; `false` leaves it out of the install.
pub fn apply(doc: &mut Value, values: &Values) -> anyhow::Result<bool> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    rewrite_images(doc, values);
    match kind.as_str() {
        "Deployment" if name == CONTROL_NAME => control_plane(doc, values)?,
        "PodDisruptionBudget" if name == CONTROL_NAME => {
            // A budget of all but one: drains go one replica at a time. One replica cannot have a
            // budget that lets a drain through, so it has none.
            if values.control_plane.replicas < 2 {
                return Ok(false);
            }
            doc["spec"]["minAvailable"] = json!(values.control_plane.replicas - 1);
        }
        "ClusterRole" if name == AGENT_NAME => set_agent_pod_verbs(doc, values.node_agent.repair)?,
        "DaemonSet" if name == AGENT_NAME => node_agent(doc, values)?,
        "MutatingWebhookConfiguration" => exclude_namespaces(doc, &values.excluded_namespaces)?,
        "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
            if name.starts_with(AGENT_NAME) && !values.node_agent.admission_policy =>
        {
            return Ok(false);
        }
        _ => {}
    }
    Ok(true)
}

/// `<registry>/<image>:<tag>` for every container; the tags of the mesh's own images from the values.
fn rewrite_images(doc: &mut Value, values: &Values) {
    for list in ["containers", "initContainers"] {
        let Some(containers) = doc.pointer_mut(&format!("/spec/template/spec/{list}")).and_then(Value::as_array_mut)
        else {
            continue;
        };
        for container in containers {
            let Some(image) = container.get("image").and_then(Value::as_str) else { continue };
            let base = image.rsplit('/').next().unwrap_or(image);
            let (name, tag) = base.split_once(':').unwrap_or((base, "latest"));
            let tag = match name {
                "cnimesh-control" => values.image_tags.control.as_str(),
                "cnimesh-node" => values.image_tags.node.as_str(),
                "cnimesh-proxy" => values.image_tags.proxy.as_str(),
                _ => tag,
            };
            container["image"] = json!(values.image(name, tag));
        }
    }
}

fn container<'a>(doc: &'a mut Value, name: &str) -> anyhow::Result<&'a mut Value> {
    doc.pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == name))
        .with_context(|| format!("no container {name} in the {name} manifest"))
}

fn control_plane(doc: &mut Value, values: &Values) -> anyhow::Result<()> {
    doc["spec"]["replicas"] = json!(values.control_plane.replicas);
    if values.ha {
        make_ha(doc)?;
    }
    let container = container(doc, CONTROL_NAME)?;
    container["resources"] = resources(&values.control_plane.resources);
    let env = container.get_mut("env").and_then(Value::as_array_mut).context("the control plane has no env")?;
    let proxy = &values.proxy;
    let (requests, limits) = (&proxy.resources.requests, &proxy.resources.limits);
    let proxy_image = values.image("cnimesh-proxy", &values.image_tags.proxy);
    // (variable, value, the control plane's own default when the file leaves it out)
    let settings: [(&str, Option<&str>, Option<&str>); 13] = [
        ("CNIMESH_CONTROL_LOG", Some(values.control_plane.log_level.as_str()), Some("info")),
        (
            "CNIMESH_CONTROL_TRUST_DOMAIN",
            Some(values.identity_trust_domain.as_str()),
            Some(cnimesh_identity::DEFAULT_TRUST_DOMAIN),
        ),
        ("CNIMESH_CONTROL_PROXY_IMAGE", Some(proxy_image.as_str()), Some(cnimesh_model::inject::DEFAULT_PROXY_IMAGE)),
        (
            "CNIMESH_CONTROL_DEFAULT_INBOUND_POLICY",
            Some(proxy.default_inbound_policy.as_str()),
            Some("all-unauthenticated"),
        ),
        ("CNIMESH_CONTROL_PROXY_LOG_LEVEL", Some(proxy.log_level.as_str()), Some("info")),
        ("CNIMESH_CONTROL_PROXY_CPU_REQUEST", requests.cpu.as_deref(), Some("20m")),
        ("CNIMESH_CONTROL_PROXY_MEMORY_REQUEST", requests.memory.as_deref(), Some("32Mi")),
        ("CNIMESH_CONTROL_PROXY_CPU_LIMIT", limits.cpu.as_deref(), None),
        ("CNIMESH_CONTROL_PROXY_MEMORY_LIMIT", limits.memory.as_deref(), Some("256Mi")),
        (LOG_FORMAT_ENV, Some(values.log_format.as_str()), Some(LogFormat::Plain.as_str())),
        (PROXY_LOG_FORMAT_ENV, Some(values.log_format.as_str()), Some(LogFormat::Plain.as_str())),
        // Unset in the files: no cluster-wide tracing unless the values name a collector.
        ("CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR", proxy.tracing.collector.as_deref(), None),
        ("CNIMESH_CONTROL_PROXY_TRACE_SAMPLING", proxy.tracing.sampling.as_deref(), None),
    ];
    for (name, value, default) in settings {
        set_env(env, name, value, default);
    }
    Ok(())
}

fn node_agent(doc: &mut Value, values: &Values) -> anyhow::Result<()> {
    let container = container(doc, AGENT_NAME)?;
    container["resources"] = resources(&values.node_agent.resources);
    let env = container.get_mut("env").and_then(Value::as_array_mut).context("the agent's container has no env")?;
    let var = env.iter_mut().find(|e| e["name"] == "CNIMESH_REPAIR").context("the agent has no CNIMESH_REPAIR")?;
    var["value"] = json!(values.node_agent.repair.as_str());
    set_env(env, LOG_FORMAT_ENV, Some(values.log_format.as_str()), Some(LogFormat::Plain.as_str()));
    Ok(())
}

/// Replaces a variable's value where the file sets it; elsewhere adds it only when it differs
/// from the binary's default (a `None` value removes it).
fn set_env(env: &mut Vec<Value>, name: &str, value: Option<&str>, default: Option<&str>) {
    match (env.iter().position(|e| e["name"] == name), value) {
        (Some(i), Some(value)) => env[i]["value"] = json!(value),
        (Some(i), None) => {
            env.remove(i);
        }
        (None, Some(value)) if Some(value) != default => env.push(json!({"name": name, "value": value})),
        (None, _) => {}
    }
}

fn resources(resources: &Resources) -> Value {
    let list = |q: &Quantities| {
        let mut map = serde_json::Map::new();
        for (key, value) in [("cpu", &q.cpu), ("memory", &q.memory)] {
            if let Some(value) = value {
                map.insert(key.into(), json!(value));
            }
        }
        map
    };
    let mut out = serde_json::Map::new();
    for (key, q) in [("requests", &resources.requests), ("limits", &resources.limits)] {
        let map = list(q);
        if !map.is_empty() {
            out.insert(key.into(), Value::Object(map));
        }
    }
    Value::Object(out)
}

/// The webhooks never see these namespaces, nor the control plane's own.
fn exclude_namespaces(doc: &mut Value, excluded: &[String]) -> anyhow::Result<()> {
    let mut names: Vec<String> = excluded.to_vec();
    if !names.iter().any(|n| n == DEFAULT_CONTROL_NAMESPACE) {
        names.push(DEFAULT_CONTROL_NAMESPACE.into());
    }
    let webhooks =
        doc.get_mut("webhooks").and_then(Value::as_array_mut).context("a webhook configuration without webhooks")?;
    for webhook in webhooks {
        let expression = webhook
            .pointer_mut("/namespaceSelector/matchExpressions")
            .and_then(Value::as_array_mut)
            .and_then(|es| {
                es.iter_mut().find(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn")
            })
            .context("a webhook without the kubernetes.io/metadata.name NotIn expression")?;
        expression["values"] = json!(names);
    }
    Ok(())
}

/// The agent's ClusterRole grants on pods exactly what its repair mode uses.
fn set_agent_pod_verbs(doc: &mut Value, repair: NodeRepair) -> anyhow::Result<()> {
    let rules = doc.get_mut("rules").and_then(Value::as_array_mut).context("the agent's ClusterRole has no rules")?;
    let pods = rules
        .iter_mut()
        .find(|r| r["apiGroups"] == json!([""]) && r["resources"] == json!(["pods"]))
        .context("the agent's ClusterRole has no rule for pods")?;
    pods["verbs"] = json!(repair.pod_verbs());
    Ok(())
}

/// `ha`: each replica on its own node (required anti-affinity: with three replicas and
/// `maxUnavailable: 0` a rollout needs a fourth node for its surge pod, which an HA cluster
/// has), and the webhook certificate kept by the control plane itself (`--webhook-certs
/// managed`: the Lease holder renews it and patches the caBundle; every replica reloads it).
fn make_ha(doc: &mut Value) -> anyhow::Result<()> {
    let pod = doc.pointer_mut("/spec/template/spec").context("a Deployment without a pod template")?;
    let term = pod
        .pointer("/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm")
        .cloned()
        .context("the control plane's Deployment has no anti-affinity term to require")?;
    pod["affinity"]["podAntiAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [term]});
    let container = pod
        .pointer_mut("/containers/0/env")
        .and_then(Value::as_array_mut)
        .context("the control plane's container has no env")?;
    container.push(json!({"name": "CNIMESH_CONTROL_WEBHOOK_CERTS", "value": "managed"}));
    Ok(())
}
