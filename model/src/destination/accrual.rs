//! A Service's failure accrual (circuit breaking), from its `balancer.cnimesh.io/…` annotations
//! (Linkerd's `balancer.linkerd.io/…` names and defaults): `failure-accrual: consecutive` turns
//! it on; `failure-accrual-consecutive-max-failures` (7), `-min-penalty` (1s), `-max-penalty`
//! (1m) and `-jitter-ratio` (0.5) tune it. Durations are Gateway API durations (`500ms`, `10s`,
//! `1m`), like the Service's timeout annotations. Served in every client's outbound policy
//! (`FailureAccrual.ConsecutiveFailures`); the proxy applies it per endpoint of its balancer.
//!
//! A bad value is the Service's owner's typo, not a reason to take the Service out of discovery:
//! the Service is served without accrual, and the reason, naming the Service and the annotation,
//! is logged ([`crate::destination::model::ServiceRecord::from_k8s`]).
//!
//! Layer: model/index (pure).

use std::collections::BTreeMap;
use std::time::Duration;

use cnimesh_common::names::{
    FAILURE_ACCRUAL_ANNOTATION, FAILURE_ACCRUAL_DEFAULT_JITTER_RATIO, FAILURE_ACCRUAL_DEFAULT_MAX_FAILURES,
    FAILURE_ACCRUAL_DEFAULT_MAX_PENALTY, FAILURE_ACCRUAL_DEFAULT_MIN_PENALTY, FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION,
    FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION, FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION,
    FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `consecutive` failure accrual, with every knob resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureAccrual {
    pub max_failures: u32,
    pub min_penalty: Duration,
    pub max_penalty: Duration,
    pub jitter_ratio: f32,
}

impl Eq for FailureAccrual {}

/// Why a Service's accrual annotations were not applied: the annotation and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {why}")]
pub struct InvalidAccrual {
    pub annotation: &'static str,
    pub why: String,
}

impl FailureAccrual {
    /// The Service's accrual: `Ok(None)` without `failure-accrual`; an error names the first
    /// bad annotation.
    pub fn from_annotations(meta: &ObjectMeta) -> Result<Option<Self>, InvalidAccrual> {
        let empty = BTreeMap::new();
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let get = |name: &str| annotations.get(name).map(|v| v.trim());
        let bad = |annotation: &'static str, why: String| InvalidAccrual { annotation, why };
        match get(FAILURE_ACCRUAL_ANNOTATION) {
            None => return Ok(None),
            Some("consecutive") => {}
            Some(other) => {
                return Err(bad(
                    FAILURE_ACCRUAL_ANNOTATION,
                    format!("{other:?} is not a failure accrual kind (consecutive)"),
                ));
            }
        }
        let max_failures = match get(FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION) {
            None => FAILURE_ACCRUAL_DEFAULT_MAX_FAILURES,
            Some(v) => v.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                bad(FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION, format!("{v:?} is not a positive whole number"))
            })?,
        };
        let penalty = |annotation: &'static str, default: Duration| -> Result<Duration, InvalidAccrual> {
            match get(annotation) {
                None => Ok(default),
                Some(v) => match crate::routes::model::duration(v) {
                    Ok(Some(d)) => Ok(d),
                    Ok(None) => Err(bad(annotation, format!("{v:?}: a penalty must be longer than zero"))),
                    Err(e) => Err(bad(annotation, e.0)),
                },
            }
        };
        let min_penalty = penalty(FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION, FAILURE_ACCRUAL_DEFAULT_MIN_PENALTY)?;
        let max_penalty = penalty(FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION, FAILURE_ACCRUAL_DEFAULT_MAX_PENALTY)?;
        if min_penalty > max_penalty {
            return Err(bad(
                FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION,
                format!("{max_penalty:?} is shorter than the min penalty {min_penalty:?}"),
            ));
        }
        #[allow(clippy::cast_possible_truncation)] // a ratio in 0..=1
        let jitter_ratio = match get(FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION) {
            None => FAILURE_ACCRUAL_DEFAULT_JITTER_RATIO as f32,
            Some(v) => {
                v.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)).map(|r| r as f32).ok_or_else(|| {
                    bad(FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION, format!("{v:?} is not a number from 0 to 1"))
                })?
            }
        };
        Ok(Some(Self { max_failures, min_penalty, max_penalty, jitter_ratio }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> ObjectMeta {
        let annotations = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ObjectMeta { name: Some("web".into()), annotations: Some(annotations), ..Default::default() }
    }

    #[test]
    fn consecutive_accrual_takes_linkerds_defaults_and_its_tuning_annotations() {
        assert_eq!(FailureAccrual::from_annotations(&meta(&[])), Ok(None), "no annotation: no accrual");
        let defaults = FailureAccrual::from_annotations(&meta(&[(FAILURE_ACCRUAL_ANNOTATION, "consecutive")]));
        let expected = FailureAccrual {
            max_failures: 7,
            min_penalty: Duration::from_secs(1),
            max_penalty: Duration::from_secs(60),
            jitter_ratio: 0.5,
        };
        assert_eq!(defaults, Ok(Some(expected)));
        let tuned = FailureAccrual::from_annotations(&meta(&[
            (FAILURE_ACCRUAL_ANNOTATION, "consecutive"),
            (FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION, "3"),
            (FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION, "500ms"),
            (FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION, "10s"),
            (FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION, "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (tuned.max_failures, tuned.min_penalty, tuned.max_penalty, tuned.jitter_ratio),
            (3, Duration::from_millis(500), Duration::from_secs(10), 0.0)
        );
    }

    #[test]
    fn a_bad_accrual_annotation_is_named_with_its_value() {
        let on = (FAILURE_ACCRUAL_ANNOTATION, "consecutive");
        for (pairs, annotation, text) in [
            (vec![(FAILURE_ACCRUAL_ANNOTATION, "sometimes")], FAILURE_ACCRUAL_ANNOTATION, "\"sometimes\""),
            (
                vec![on, (FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION, "0")],
                FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION,
                "\"0\"",
            ),
            (
                vec![on, (FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION, "1 second")],
                FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION,
                "1 second",
            ),
            (
                vec![on, (FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION, "100ms")],
                FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION,
                "shorter",
            ),
            (
                vec![on, (FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION, "2")],
                FAILURE_ACCRUAL_JITTER_RATIO_ANNOTATION,
                "\"2\"",
            ),
        ] {
            let error = FailureAccrual::from_annotations(&meta(&pairs)).unwrap_err();
            assert_eq!(error.annotation, annotation);
            assert!(error.to_string().contains(annotation) && error.to_string().contains(text), "{error}");
        }
    }
}
