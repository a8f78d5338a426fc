//! Meshed pods (those carrying the `cnimesh-proxy` container or native sidecar): each proxy is
//! ready and holds an identity certificate. The certificate is read from the proxy's own metrics
//! (`identity_cert_expiration_timestamp_seconds`) through the API server's pod proxy: a proxy
//! without one cannot do mTLS, whatever its readiness says.
//!
//! Layer: runtime (operator CLI).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::report::{Category, Check, plural};
use super::{CONCURRENCY, kube_error, pod_proxy_get, read_hint};
use cnimesh_model::inject::{PROXY_ADMIN_PORT, PROXY_CONTAINER};

const CATEGORY: &Category = &Category::MeshedPods;
/// The proxy's gauge of its current certificate's expiry, seconds since the epoch.
pub const CERT_EXPIRY_METRIC: &str = "identity_cert_expiration_timestamp_seconds";
/// Failing pods listed by name; the rest are counted.
const LIST_CAP: usize = 10;

/// What to look at when a pod's proxy is not ready or cannot be read (also shown by the dashboard).
pub fn proxy_hint(ns: &str, pod: &str) -> String {
    format!("kubectl -n {ns} describe pod {pod}; kubectl -n {ns} logs {pod} -c {PROXY_CONTAINER}")
}

const READY: &str = "meshed pods' proxies are ready";
const CERTIFIED: &str = "meshed pods' proxies hold a certificate";

fn is_meshed(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let init = spec.init_containers.iter().flatten();
    spec.containers.iter().chain(init).any(|c| c.name == PROXY_CONTAINER)
}

/// Finished pods (Jobs) keep their spec but have no running proxy: nothing to check.
fn is_running(pod: &Pod) -> bool {
    !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn proxy_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    let init = status.init_container_statuses.iter().flatten();
    status.container_statuses.iter().flatten().chain(init).any(|c| c.name == PROXY_CONTAINER && c.ready)
}

fn key(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

/// The first sample of `name` in Prometheus text (any labels), as a number.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    cnimesh_common::prom_text::samples(text).into_iter().find(|s| s.name == name).map(|s| s.value)
}

/// `names` capped at [`LIST_CAP`], plus a count of the rest.
pub(super) fn capped(mut items: Vec<String>) -> Vec<String> {
    if items.len() > LIST_CAP {
        let more = items.len() - LIST_CAP;
        items.truncate(LIST_CAP);
        items.push(format!("… and {more} more"));
    }
    items
}

pub async fn check(client: &kube::Client, now: i64, checks: &mut Vec<Check>) {
    let api: Api<Pod> = Api::all(client.clone());
    let pods = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            checks.push(Check::fail(
                CATEGORY,
                READY,
                format!("listing pods in all namespaces: {}", kube_error(&e)),
                read_hint(&e, "allow listing pods cluster-wide"),
            ));
            checks.push(Check::skip(CATEGORY, CERTIFIED, "skipped: pods could not be listed"));
            return;
        }
    };
    let meshed: Vec<&Pod> = pods.iter().filter(|p| is_meshed(p) && is_running(p)).collect();
    if meshed.is_empty() {
        checks.push(Check::ok(CATEGORY, READY, "no meshed pods yet"));
        checks.push(Check::ok(CATEGORY, CERTIFIED, "no meshed pods yet"));
        return;
    }
    let (ready, not_ready): (Vec<&Pod>, Vec<&Pod>) = meshed.iter().partition(|p| proxy_ready(p));
    checks.push(if not_ready.is_empty() {
        Check::ok(CATEGORY, READY, format!("{}, all proxies ready", plural(meshed.len(), "meshed pod")))
    } else {
        let (ns, pod) = key(not_ready[0]);
        Check::fail(
            CATEGORY,
            READY,
            format!("{} of {} meshed pods have a proxy that is not ready", not_ready.len(), meshed.len()),
            proxy_hint(&ns, &pod),
        )
        .details(capped(
            not_ready
                .iter()
                .map(|p| {
                    let (ns, n) = key(p);
                    format!("{ns}/{n}")
                })
                .collect(),
        ))
    });
    if ready.is_empty() {
        checks.push(Check::skip(CATEGORY, CERTIFIED, "skipped: no ready proxy"));
        return;
    }

    let port = PROXY_ADMIN_PORT;
    let results: Vec<(String, Result<f64, String>)> = futures::stream::iter(ready.iter().map(|p| key(p)))
        .map(|(ns, pod)| async move {
            let expiry = match pod_proxy_get(client, &ns, &pod, port, "metrics").await {
                Err(e) => Err(format!("metrics unavailable: {e}")),
                Ok(text) => match gauge(&text, CERT_EXPIRY_METRIC) {
                    None => Err(format!("no {CERT_EXPIRY_METRIC} in its metrics: no certificate yet")),
                    Some(t) if t <= 0.0 => Err("no certificate (expiry 0)".to_string()),
                    Some(t) if t <= now as f64 => {
                        Err(format!("certificate expired at {}", super::certs::format_time(t as i64)))
                    }
                    Some(t) => Ok(t),
                },
            };
            (format!("{ns}/{pod}"), expiry)
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let failing: Vec<String> =
        results.iter().filter_map(|(pod, r)| r.as_ref().err().map(|e| format!("{pod}: {e}"))).collect();
    checks.push(if failing.is_empty() {
        let also = if not_ready.is_empty() { "all ready with certificates".to_string() } else { "with certificates".into() };
        Check::ok(CATEGORY, CERTIFIED, format!("{}, {also}", plural(results.len(), "meshed pod")))
    } else {
        let (first, _) = results.iter().find(|(_, r)| r.is_err()).expect("one failed");
        let (ns, pod) = first.split_once('/').unwrap_or(("<ns>", first));
        Check::fail(
            CATEGORY,
            CERTIFIED,
            format!("{} of {} ready proxies have no valid certificate: they cannot do mTLS", failing.len(), results.len()),
            format!(
                "the proxy gets its certificate from the control plane's Identity service: kubectl -n {ns} logs {pod} -c {PROXY_CONTAINER}, and check the control-plane section above"
            ),
        )
        .details(capped(failing))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauge_is_read_with_or_without_labels() {
        let text = "# HELP identity_cert_expiration_timestamp_seconds Expiry.\n\
                    # TYPE identity_cert_expiration_timestamp_seconds gauge\n\
                    identity_cert_expiration_timestamp_seconds_total 3\n\
                    identity_cert_expiration_timestamp_seconds 1.7e9\n";
        assert_eq!(gauge(text, CERT_EXPIRY_METRIC), Some(1.7e9));
        assert_eq!(gauge("identity_cert_expiration_timestamp_seconds{id=\"a\"} 12\n", CERT_EXPIRY_METRIC), Some(12.0));
        assert_eq!(gauge("process_cpu_seconds_total 1\n", CERT_EXPIRY_METRIC), None);
    }
}
