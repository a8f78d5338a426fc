//! Where an injected proxy sends its spans: the pod's `config.cnimesh.io/trace-collector`
//! and `config.cnimesh.io/trace-sampling` annotations, else its namespace's, else the cluster-wide
//! default the control plane was started with (`--proxy-trace-collector`, `--proxy-trace-sampling`,
//! from the install values `proxy.tracing.*`). Each setting is resolved on its own, so a namespace
//! can name the collector and one pod raise its sampling.
//!
//! Every value keeps where it came from, so a bad one is reported with its source: a bad pod or
//! namespace annotation costs the pod its tracing (never its proxy: tracing is observability
//! only), with a warning naming the annotation, its object and the value. The value `off` for the collector turns tracing off below a level that set it.
//!
//! Layer: model (pure): the namespace's annotations are read by the caller.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};

use super::validate::{check_trace_collector, check_trace_sampling};

pub const TRACE_COLLECTOR_ANNOTATION: &str = "config.cnimesh.io/trace-collector";
pub const TRACE_SAMPLING_ANNOTATION: &str = "config.cnimesh.io/trace-sampling";
/// The proxy's OTLP/gRPC collector (the tracing contract with the proxy; unset = no tracing).
pub const TRACE_COLLECTOR_ENV: &str = "CNIMESH_PROXY_TRACE_COLLECTOR";
/// The ratio of requests without trace context the proxy starts a trace for (default 0).
pub const TRACE_SAMPLING_ENV: &str = "CNIMESH_PROXY_TRACE_SAMPLING";
/// The collector value that turns tracing off for a namespace or pod below a cluster default.
pub const TRACE_OFF: &str = "off";

/// One setting and where it was given (`annotation config.cnimesh.io/trace-collector of
/// namespace shop`), for the warning a bad value gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceValue {
    pub value: String,
    pub origin: String,
}

/// The tracing settings at one level (cluster, namespace or pod); `None` defers to the level
/// above.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceSettings {
    pub collector: Option<TraceValue>,
    pub sampling: Option<TraceValue>,
}

impl TraceSettings {
    /// The cluster-wide default (the control plane's flags), validated at start.
    pub fn cluster(collector: Option<&str>, sampling: Option<&str>) -> Result<Self, String> {
        let value = |value: Option<&str>, flag: &str, check: fn(&str) -> Result<String, String>| {
            value
                .filter(|v| !v.trim().is_empty())
                .map(|v| {
                    let value = if flag.ends_with("collector") && v.trim() == TRACE_OFF { v.into() } else { check(v)? };
                    Ok::<_, String>(TraceValue { value, origin: format!("--{flag}") })
                })
                .transpose()
                .map_err(|why| format!("--{flag}: {why}"))
        };
        Ok(Self {
            collector: value(collector, "proxy-trace-collector", check_trace_collector)?,
            sampling: value(sampling, "proxy-trace-sampling", check_trace_sampling)?,
        })
    }

    /// The annotations of an object's metadata (`what`: `pod` or `namespace shop`), unchecked:
    /// they are checked once they win.
    pub fn annotated(annotations: Option<&BTreeMap<String, String>>, what: &str) -> Self {
        let get = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .map(|value| TraceValue { value: value.clone(), origin: format!("annotation {key} of {what}") })
        };
        Self { collector: get(TRACE_COLLECTOR_ANNOTATION), sampling: get(TRACE_SAMPLING_ANNOTATION) }
    }

    /// These settings where given, `below` them winning where it says something.
    pub fn overridden_by(&self, below: &TraceSettings) -> TraceSettings {
        TraceSettings {
            collector: below.collector.clone().or_else(|| self.collector.clone()),
            sampling: below.sampling.clone().or_else(|| self.sampling.clone()),
        }
    }

    /// The proxy's variables for these (effective) settings: none without a collector (tracing
    /// off, sampling moot), or a bad value's message naming where it was given.
    pub fn env(&self) -> Result<Vec<(&'static str, String)>, String> {
        let named = |v: &TraceValue, why: String| format!("{}: {why}", v.origin);
        // Checked even when nothing traces: a typo should be heard before the collector arrives.
        let sampling = match &self.sampling {
            Some(sampling) => Some(check_trace_sampling(&sampling.value).map_err(|why| named(sampling, why))?),
            None => None,
        };
        let Some(collector) = &self.collector else { return Ok(Vec::new()) };
        if collector.value.trim() == TRACE_OFF {
            return Ok(Vec::new());
        }
        let collector = check_trace_collector(&collector.value).map_err(|why| named(collector, why))?;
        let mut vars = vec![(TRACE_COLLECTOR_ENV, collector)];
        vars.extend(sampling.map(|s| (TRACE_SAMPLING_ENV, s)));
        Ok(vars)
    }
}

/// Adds variables (tracing's, the shutdown timing's) to the proxy container.
pub fn append_env(container: &mut Container, vars: Vec<(&'static str, String)>) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.extend(vars.into_iter().map(|(name, value)| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_pod_beats_the_namespace_which_beats_the_cluster_setting_by_setting() {
        let cluster = TraceSettings::cluster(Some("http://cluster-collector:4317"), Some("0.01")).unwrap();
        let ns = annotations(&[(TRACE_COLLECTOR_ANNOTATION, "ns-collector:4317")]);
        let ns = TraceSettings::annotated(Some(&ns), "namespace shop");
        let pod = annotations(&[(TRACE_SAMPLING_ANNOTATION, "1")]);
        let pod = TraceSettings::annotated(Some(&pod), "pod");
        let env = |s: &TraceSettings| s.env().unwrap();
        assert_eq!(
            env(&cluster),
            [(TRACE_COLLECTOR_ENV, "http://cluster-collector:4317".into()), (TRACE_SAMPLING_ENV, "0.01".into())]
        );
        let in_ns = cluster.overridden_by(&ns);
        assert_eq!(
            env(&in_ns),
            [(TRACE_COLLECTOR_ENV, "ns-collector:4317".into()), (TRACE_SAMPLING_ENV, "0.01".into())]
        );
        let in_pod = in_ns.overridden_by(&pod);
        assert_eq!(env(&in_pod), [(TRACE_COLLECTOR_ENV, "ns-collector:4317".into()), (TRACE_SAMPLING_ENV, "1".into())]);
        let pod_only = TraceSettings::default().overridden_by(&TraceSettings::annotated(
            Some(&annotations(&[(TRACE_COLLECTOR_ANNOTATION, "pod-collector:4317")])),
            "pod",
        ));
        assert_eq!(env(&pod_only), [(TRACE_COLLECTOR_ENV, "pod-collector:4317".into())], "sampling stays the proxy's");
    }

    #[test]
    fn no_collector_anywhere_or_off_means_no_tracing_variables() {
        assert!(TraceSettings::default().env().unwrap().is_empty());
        let sampling_only = TraceSettings::cluster(None, Some("1")).unwrap();
        assert!(sampling_only.env().unwrap().is_empty(), "sampling without a collector traces nothing");
        let cluster = TraceSettings::cluster(Some("collector:4317"), Some("1")).unwrap();
        let off = TraceSettings::annotated(Some(&annotations(&[(TRACE_COLLECTOR_ANNOTATION, "off")])), "namespace a");
        assert!(cluster.overridden_by(&off).env().unwrap().is_empty());
        assert!(TraceSettings::cluster(Some(""), None).unwrap().collector.is_none(), "an empty flag is unset");
    }

    #[test]
    fn a_bad_value_names_its_source_and_a_bad_flag_is_refused() {
        let cluster = TraceSettings::cluster(Some("collector:4317"), None).unwrap();
        let ns = TraceSettings::annotated(Some(&annotations(&[(TRACE_SAMPLING_ANNOTATION, "150%")])), "namespace shop");
        let error = cluster.overridden_by(&ns).env().unwrap_err();
        assert!(
            error.starts_with("annotation config.cnimesh.io/trace-sampling of namespace shop: \"150%\""),
            "{error}"
        );
        let pod = TraceSettings::annotated(Some(&annotations(&[(TRACE_COLLECTOR_ANNOTATION, "collector")])), "pod");
        let error = cluster.overridden_by(&pod).env().unwrap_err();
        assert!(error.starts_with("annotation config.cnimesh.io/trace-collector of pod: \"collector\""), "{error}");
        let without_collector = TraceSettings::default().overridden_by(&ns).env().unwrap_err();
        assert!(without_collector.contains("150%"), "a bad ratio is reported even while nothing traces");
        let error = TraceSettings::cluster(Some("grpc://c:1"), None).unwrap_err();
        assert!(error.starts_with("--proxy-trace-collector: \"grpc://c:1\""), "{error}");
        let error = TraceSettings::cluster(None, Some("2")).unwrap_err();
        assert!(error.starts_with("--proxy-trace-sampling: \"2\""), "{error}");
    }
}
