//! The install's options as one typed document (`--values FILE`, `--set key=value`): what an
//! operator keeps in Git and what `cnimesh upgrade` finds again in the cluster.
//!
//! Two layers, kept apart on purpose: the *overrides* (only what the operator gave, a JSON tree
//! checked key by key against the defaults) and the *effective* [`Values`] (defaults with the
//! overrides merged over them). The cluster keeps the overrides, so an upgrade gets the new
//! version's defaults (its image tags above all) wherever the operator did not choose otherwise.
//!
//! The defaults are exactly what `daemonset/` holds: rendering them changes nothing (tested).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use cnimesh_model::policy::DefaultPolicy;

/// Where the shipped images live; `--registry` replaces it for every image.
pub const DEFAULT_REGISTRY: &str = "ghcr.io/cnimesh";

/// Bad values: each error names the key (and what it accepts) so the fix is obvious.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValuesError {
    #[error("unknown key `{key}`: valid keys {scope}are {valid}")]
    UnknownKey { key: String, scope: String, valid: String },
    #[error("`{key}` expects {expected}, not {value}")]
    WrongType { key: String, expected: String, value: String },
    #[error("`--set {0}`: expected KEY=VALUE with a dotted key, e.g. controlPlane.replicas=3")]
    BadSet(String),
    #[error("{origin}: {message}")]
    File { origin: String, message: String },
}

/// Everything `install` can be asked to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Values {
    pub control_plane: ControlPlane,
    /// Registry (and path) of every image: `<registry>/cnimesh-{control,proxy,node}:<tag>`.
    pub registry: String,
    pub image_tags: ImageTags,
    pub proxy: Proxy,
    pub node_agent: NodeAgent,
    /// `plain` or `json`: CNIMESH_LOG_FORMAT of the control plane and the node agents, and of the
    /// proxies the webhook injects.
    pub log_format: LogFormat,
    /// Namespaces the injection webhook never sees (the control plane's own is always added).
    pub excluded_namespaces: Vec<String>,
    /// Required anti-affinity (one replica per node) and the webhook certificate kept by the
    /// control plane (`--webhook-certs managed`). `--ha` also sets controlPlane.replicas=3.
    pub ha: bool,
    /// The trust domain of this cluster's identities (`CNIMESH_CONTROL_TRUST_DOMAIN`):
    /// `<sa>.<ns>.serviceaccount.identity.cnimesh.<domain>`. Clusters linked by multicluster keep
    /// their own (docs/tasks/multicluster.md); the issuer must be made for it (`ca issuer`).
    pub identity_trust_domain: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlane {
    /// More than one keeps the webhook up through drains (the budget keeps all but one).
    pub replicas: u32,
    pub resources: Resources,
    /// CNIMESH_CONTROL_LOG (a tracing filter).
    pub log_level: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    pub requests: Quantities,
    pub limits: Quantities,
}

/// Kubernetes quantities (`100m`, `64Mi`); null leaves the field out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quantities {
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageTags {
    pub control: String,
    pub proxy: String,
    pub node: String,
}

/// What the webhook gives every proxy it injects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Proxy {
    /// all-unauthenticated, all-authenticated, cluster-authenticated, deny or audit.
    pub default_inbound_policy: String,
    pub log_level: String,
    pub resources: Resources,
    pub tracing: ProxyTracing,
}

/// Where every injected proxy sends spans unless its namespace or pod is annotated
/// (`config.cnimesh.io/trace-collector`, `-sampling`); the control plane's
/// `CNIMESH_CONTROL_PROXY_TRACE_*`. Null: no cluster-wide tracing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyTracing {
    /// An OTLP/gRPC collector: `host:port`, `http://host:port` or `https://host:port`.
    pub collector: Option<String>,
    /// The ratio (0 to 1) of requests without trace context that start a trace; null is the
    /// proxy's default, 0. A YAML number or a string.
    #[serde(deserialize_with = "ratio")]
    pub sampling: Option<String>,
}

/// A ratio given as a YAML number (`0.05`) or a string (`--set`), kept as its text.
fn ratio<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => return Err(serde::de::Error::custom(format!("a sampling ratio, not {other}"))),
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAgent {
    /// delete, label or off (`--node-repair`).
    pub repair: super::NodeRepair,
    /// The agents' ValidatingAdmissionPolicy (false for API servers older than 1.30).
    pub admission_policy: bool,
    pub resources: Resources,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

fn quantities(cpu: Option<&str>, memory: Option<&str>) -> Quantities {
    Quantities { cpu: cpu.map(Into::into), memory: memory.map(Into::into) }
}

impl Default for Values {
    /// What `daemonset/` and the control plane's own defaults say.
    fn default() -> Self {
        let version = env!("CARGO_PKG_VERSION");
        Values {
            control_plane: ControlPlane {
                replicas: 2,
                resources: Resources {
                    requests: quantities(Some("100m"), Some("64Mi")),
                    limits: quantities(None, Some("256Mi")),
                },
                log_level: "info".into(),
            },
            registry: DEFAULT_REGISTRY.into(),
            image_tags: ImageTags { control: version.into(), proxy: version.into(), node: version.into() },
            proxy: Proxy {
                default_inbound_policy: DefaultPolicy::default().as_str().into(),
                log_level: "info".into(),
                resources: Resources {
                    requests: quantities(Some("20m"), Some("32Mi")),
                    limits: quantities(None, Some("256Mi")),
                },
                tracing: ProxyTracing { collector: None, sampling: None },
            },
            node_agent: NodeAgent {
                repair: super::NodeRepair::Delete,
                admission_policy: true,
                resources: Resources {
                    requests: quantities(Some("20m"), Some("32Mi")),
                    limits: quantities(None, Some("128Mi")),
                },
            },
            log_format: LogFormat::Plain,
            excluded_namespaces: vec!["kube-system".into()],
            ha: false,
            identity_trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.into(),
        }
    }
}

/// Keys whose strings must be one of a few words.
fn choices(key: &str) -> Option<Vec<&'static str>> {
    match key {
        "logFormat" => Some(vec!["plain", "json"]),
        "nodeAgent.repair" => Some(vec!["delete", "label", "off"]),
        "proxy.defaultInboundPolicy" => Some(DefaultPolicy::ALL.map(DefaultPolicy::as_str).to_vec()),
        _ => None,
    }
}

/// A value's check: the value normalised, or why it is bad.
type Check = fn(&str) -> Result<String, String>;

/// Keys whose strings the control plane would refuse at start unless well-formed: their check and
/// what they expect.
fn checked_text(key: &str) -> Option<(Check, &'static str)> {
    use cnimesh_model::inject::{check_trace_collector, check_trace_sampling};
    match key {
        "proxy.tracing.collector" => Some((
            check_trace_collector,
            "an OTLP/gRPC collector (host:port, http://host:port or https://host:port) or null",
        )),
        "proxy.tracing.sampling" => Some((check_trace_sampling, "a sampling ratio from 0 to 1, or null")),
        "identityTrustDomain" => Some((check_trust_domain, "a DNS name such as cluster.local or west.example.com")),
        _ => None,
    }
}

/// A trust domain is valid when the control plane's own identity in it is a valid name (the
/// control plane would refuse it at start otherwise).
fn check_trust_domain(value: &str) -> Result<String, String> {
    cnimesh_identity::Name::for_service_account("cnimesh-control", "cnimesh", value)
        .map(|_| value.to_string())
        .map_err(|e| format!("{value:?} ({e})"))
}

/// What the operator asked for, and nothing else: a tree of known keys with values of the right
/// type (checked as they come in, against the defaults' shape).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides(Map<String, Value>);

impl Overrides {
    pub fn as_json(&self) -> &Map<String, Value> {
        &self.0
    }

    /// A YAML values file (an empty file overrides nothing).
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the values file {}: {e}", path.display()))?;
        Ok(Self::from_yaml(&text, &path.display().to_string())?)
    }

    /// A YAML values document, checked key by key.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ValuesError> {
        let tree: Value = serde_saphyr::from_str(text)
            .map_err(|e| ValuesError::File { origin: origin.into(), message: e.to_string() })?;
        let tree = match tree {
            Value::Null => Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(ValuesError::File {
                    origin: origin.into(),
                    message: format!("a values file is a mapping of keys, not {}", describe(&other)),
                });
            }
        };
        check(&tree, &schema(), "")?;
        Ok(Overrides(tree))
    }

    /// `--set a.b=c`: the value is read as the key's type (a number, true/false, a string, or a
    /// comma-separated list); `null` clears a quantity.
    pub fn set(&mut self, assignment: &str) -> Result<(), ValuesError> {
        let (key, text) = assignment.split_once('=').ok_or_else(|| ValuesError::BadSet(assignment.into()))?;
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(ValuesError::BadSet(assignment.into()));
        }
        let schema = schema();
        let mut node = &schema;
        let mut path = Vec::new();
        for part in key.split('.') {
            let Value::Object(fields) = node else {
                return Err(unknown(&path, part, node));
            };
            node = fields.get(part).ok_or_else(|| unknown(&path, part, node))?;
            path.push(part);
        }
        let value = match node {
            Value::Object(fields) => {
                return Err(ValuesError::WrongType {
                    key: key.into(),
                    expected: format!("one of its keys to be set ({})", keys(fields)),
                    value: format!("{text:?}"),
                });
            }
            Value::Bool(_) => match text {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(wrong(key, node, &Value::String(text.into()))),
            },
            Value::Number(_) => match text.parse::<u64>() {
                Ok(n) => Value::from(n),
                Err(_) => return Err(wrong(key, node, &Value::String(text.into()))),
            },
            Value::Array(_) => {
                Value::Array(text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Value::from).collect())
            }
            Value::Null if text == "null" => Value::Null,
            Value::String(_) | Value::Null => Value::String(text.into()),
        };
        check_leaf(key, node, &value)?;
        let mut target = &mut self.0;
        let parts: Vec<&str> = key.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            let entry = target.entry(part.to_string()).or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            target = entry.as_object_mut().expect("made an object above");
        }
        target.insert(parts[parts.len() - 1].to_string(), value);
        Ok(())
    }

    /// `other` wins wherever both say something.
    pub fn merge(&mut self, other: &Overrides) {
        merge(&mut self.0, &other.0);
    }

    /// Is this key given (e.g. `controlPlane.replicas`)?
    pub fn has(&self, key: &str) -> bool {
        let mut node = &self.0;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            match node.get(*part) {
                Some(Value::Object(inner)) if i + 1 < parts.len() => node = inner,
                Some(_) if i + 1 == parts.len() => return true,
                _ => return false,
            }
        }
        false
    }

    /// The defaults with these overrides over them.
    pub fn resolve(&self) -> Result<Values, ValuesError> {
        let Value::Object(mut tree) = schema() else { unreachable!("the defaults are a mapping") };
        merge(&mut tree, &self.0);
        let values: Values = serde_json::from_value(Value::Object(tree))
            .map_err(|e| ValuesError::File { origin: "values".into(), message: e.to_string() })?;
        if values.control_plane.replicas == 0 {
            return Err(ValuesError::WrongType {
                key: "controlPlane.replicas".into(),
                expected: "at least 1 (the webhook must answer)".into(),
                value: "0".into(),
            });
        }
        if values.registry.is_empty() || values.registry.ends_with('/') {
            return Err(ValuesError::WrongType {
                key: "registry".into(),
                expected: "a registry and path without a trailing slash, e.g. registry.example.com/mirror".into(),
                value: format!("{:?}", values.registry),
            });
        }
        Ok(values)
    }

    pub fn to_yaml(&self) -> String {
        if self.0.is_empty() {
            return "{}\n".into();
        }
        serde_saphyr::to_string(&Value::Object(self.0.clone())).expect("JSON values serialise as YAML")
    }
}

impl Values {
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("values serialise as YAML")
    }

    /// `<registry>/<name>:<tag>`.
    pub fn image(&self, name: &str, tag: &str) -> String {
        format!("{}/{name}:{tag}", self.registry)
    }
}

/// The defaults as JSON: the shape every override is checked against (a null is a quantity
/// that may be left out).
fn schema() -> Value {
    serde_json::to_value(Values::default()).expect("values serialise")
}

fn merge(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(Value::Object(inner)), Value::Object(over)) => merge(inner, over),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn check(tree: &Map<String, Value>, schema: &Value, prefix: &str) -> Result<(), ValuesError> {
    let Value::Object(fields) = schema else { unreachable!("checked against mappings only") };
    for (key, value) in tree {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        let Some(expected) = fields.get(key) else {
            let parents: Vec<&str> = if prefix.is_empty() { vec![] } else { prefix.split('.').collect() };
            return Err(unknown(&parents, key, schema));
        };
        match (expected, value) {
            (Value::Object(_), Value::Object(inner)) => check(inner, expected, &path)?,
            _ => check_leaf(&path, expected, value)?,
        }
    }
    Ok(())
}

fn check_leaf(key: &str, expected: &Value, value: &Value) -> Result<(), ValuesError> {
    let fits = match (expected, value) {
        (Value::Bool(_), Value::Bool(_)) => true,
        (Value::Number(_), Value::Number(n)) => n.is_u64(),
        (Value::String(_), Value::String(_)) | (Value::Null, Value::String(_) | Value::Null) => true,
        (Value::Array(_), Value::Array(items)) => items.iter().all(Value::is_string),
        _ => false,
    };
    if let Some((check, example)) = checked_text(key) {
        // Checked here, so that a bad value is refused by `--set` and the file, naming its key.
        let text = match value {
            Value::Null => return Ok(()),
            Value::String(text) => text.clone(),
            Value::Number(n) if key.ends_with("sampling") => n.to_string(),
            other => {
                return Err(ValuesError::WrongType {
                    key: key.into(),
                    expected: example.into(),
                    value: describe(other),
                });
            }
        };
        return check(&text).map(drop).map_err(|why| ValuesError::WrongType {
            key: key.into(),
            expected: example.into(),
            value: why,
        });
    }
    if !fits {
        return Err(wrong(key, expected, value));
    }
    if let (Some(words), Value::String(text)) = (choices(key), value)
        && !words.contains(&text.as_str())
    {
        return Err(ValuesError::WrongType {
            key: key.into(),
            expected: format!("one of {}", words.join(", ")),
            value: format!("{text:?}"),
        });
    }
    Ok(())
}

fn wrong(key: &str, expected: &Value, value: &Value) -> ValuesError {
    let expected = match expected {
        Value::Bool(_) => "true or false".to_string(),
        Value::Number(_) => "a whole number".to_string(),
        Value::String(_) => "a string".to_string(),
        Value::Null => "a string (a Kubernetes quantity) or null".to_string(),
        Value::Array(_) => "a list of strings (with --set: comma-separated)".to_string(),
        Value::Object(fields) => format!("a mapping of {}", keys(fields)),
    };
    ValuesError::WrongType { key: key.into(), expected, value: describe(value) }
}

fn unknown(parents: &[&str], key: &str, node: &Value) -> ValuesError {
    let scope = if parents.is_empty() { String::new() } else { format!("under `{}` ", parents.join(".")) };
    let full = if parents.is_empty() { key.to_string() } else { format!("{}.{key}", parents.join(".")) };
    let valid = match node {
        Value::Object(fields) => keys(fields),
        _ => "none (it is a single value)".into(),
    };
    ValuesError::UnknownKey { key: full, scope, valid }
}

fn keys(fields: &Map<String, Value>) -> String {
    fields.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn describe(value: &Value) -> String {
    match value {
        Value::Object(_) => "a mapping".into(),
        Value::Array(_) => "a list".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(assignments: &[&str]) -> Result<Values, ValuesError> {
        let mut overrides = Overrides::default();
        for a in assignments {
            overrides.set(a)?;
        }
        overrides.resolve()
    }

    #[test]
    fn set_reads_each_value_as_its_keys_type() {
        let values = set(&[
            "controlPlane.replicas=3",
            "ha=true",
            "excludedNamespaces=kube-system, monitoring",
            "proxy.resources.limits.cpu=500m",
            "logFormat=json",
        ])
        .unwrap();
        assert_eq!(values.control_plane.replicas, 3);
        assert!(values.ha);
        assert_eq!(values.excluded_namespaces, ["kube-system", "monitoring"]);
        assert_eq!(values.proxy.resources.limits.cpu.as_deref(), Some("500m"));
        assert_eq!(values.log_format, LogFormat::Json);
        assert_eq!(values.proxy.resources.requests.cpu.as_deref(), Some("20m"), "the rest stays default");
    }

    #[test]
    fn an_unknown_key_is_named_with_the_valid_ones() {
        let error = set(&["controlPlane.replica=3"]).unwrap_err().to_string();
        assert_eq!(
            error,
            "unknown key `controlPlane.replica`: valid keys under `controlPlane` are replicas, resources, logLevel"
        );
        let error = set(&["registri=x"]).unwrap_err().to_string();
        assert!(error.starts_with("unknown key `registri`: valid keys are controlPlane, registry,"), "{error}");
        let error = Overrides::from_yaml("proxy:\n  loglevel: debug\n", "v.yaml").unwrap_err().to_string();
        assert!(error.starts_with("unknown key `proxy.loglevel`: valid keys under `proxy` are"), "{error}");
    }

    #[test]
    fn a_wrong_type_names_the_key_and_the_expected_type() {
        let error = set(&["controlPlane.replicas=three"]).unwrap_err().to_string();
        assert_eq!(error, "`controlPlane.replicas` expects a whole number, not \"three\"");
        let error = set(&["ha=yes"]).unwrap_err().to_string();
        assert_eq!(error, "`ha` expects true or false, not \"yes\"");
        let error = set(&["logFormat=xml"]).unwrap_err().to_string();
        assert_eq!(error, "`logFormat` expects one of plain, json, not \"xml\"");
        let error = set(&["controlPlane=3"]).unwrap_err().to_string();
        assert!(error.starts_with("`controlPlane` expects one of its keys to be set (replicas,"), "{error}");
        let error = Overrides::from_yaml("controlPlane:\n  replicas: \"3\"\n", "v.yaml").unwrap_err().to_string();
        assert_eq!(error, "`controlPlane.replicas` expects a whole number, not \"3\"");
        let error = set(&["controlPlane.replicas=0"]).unwrap_err().to_string();
        assert!(error.contains("controlPlane.replicas"), "{error}");
        assert!(matches!(set(&["novalue"]), Err(ValuesError::BadSet(_))));
    }

    #[test]
    fn set_wins_over_a_file_and_only_given_keys_are_overrides() {
        let mut given =
            Overrides::from_yaml("controlPlane:\n  replicas: 3\nregistry: r.example/m\n", "v.yaml").unwrap();
        let mut cli = Overrides::default();
        cli.set("registry=mirror.example/cnimesh").unwrap();
        given.merge(&cli);
        let values = given.resolve().unwrap();
        assert_eq!((values.control_plane.replicas, values.registry.as_str()), (3, "mirror.example/cnimesh"));
        assert!(given.has("controlPlane.replicas") && !given.has("imageTags.proxy") && !given.has("ha"));
        assert_eq!(Overrides::from_yaml(&given.to_yaml(), "again").unwrap(), given, "overrides round-trip");
        assert_eq!(Overrides::default().resolve().unwrap(), Values::default());
    }

    #[test]
    fn proxy_tracing_takes_a_collector_and_a_ratio_from_set_or_a_file_and_refuses_bad_ones() {
        let values =
            set(&["proxy.tracing.collector=http://otel-collector.cnimesh-tracing:4317", "proxy.tracing.sampling=0.05"])
                .unwrap();
        assert_eq!(values.proxy.tracing.collector.as_deref(), Some("http://otel-collector.cnimesh-tracing:4317"));
        assert_eq!(values.proxy.tracing.sampling.as_deref(), Some("0.05"));
        let file =
            Overrides::from_yaml("proxy:\n  tracing:\n    collector: c.tracing:4317\n    sampling: 0.5\n", "v.yaml")
                .unwrap()
                .resolve()
                .unwrap();
        assert_eq!(file.proxy.tracing.sampling.as_deref(), Some("0.5"), "a YAML number is a ratio too");
        assert_eq!(Values::default().proxy.tracing, ProxyTracing { collector: None, sampling: None });

        let error = set(&["proxy.tracing.collector=collector"]).unwrap_err().to_string();
        assert!(error.starts_with("`proxy.tracing.collector` expects an OTLP/gRPC collector"), "{error}");
        assert!(error.contains("\"collector\""), "{error}");
        let error = set(&["proxy.tracing.sampling=2"]).unwrap_err().to_string();
        assert!(error.starts_with("`proxy.tracing.sampling` expects a sampling ratio"), "{error}");
        let error = Overrides::from_yaml("proxy:\n  tracing:\n    sampling: 1.5\n", "v.yaml").unwrap_err().to_string();
        assert!(error.contains("proxy.tracing.sampling") && error.contains("1.5"), "{error}");
        let error =
            Overrides::from_yaml("proxy:\n  tracing:\n    collector: 4317\n", "v.yaml").unwrap_err().to_string();
        assert!(error.contains("proxy.tracing.collector"), "{error}");
    }
}
