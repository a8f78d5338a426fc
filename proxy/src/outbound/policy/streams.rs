//! What an EgressNetwork's policy says about connections that are not HTTP, read
//! once when the policy arrives ([`crate::outbound::policy::model`]): the TLS routes by SNI, and
//! whether the opaque route refuses.

use linkerd2_proxy_api::outbound::{self as api, opaque_route, proxy_protocol, tls_route};
use linkerd2_proxy_api::tls_route::sni_match;

use crate::outbound::routes::model::HostMatch;

/// What an egress policy says about connections that are not HTTP, read once when the policy
/// arrives (HTTP requests go through the HTTP routes like any other).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRules {
    /// The policy's protocol is `tls`: connections are routed by SNI over these, most specific
    /// first by the proxy's usual host ranking.
    pub tls: Option<Vec<TlsRule>>,
    /// The opaque route refuses (`Forbidden`): non-HTTP connections are closed.
    pub opaque_forbidden: bool,
}

/// One TLS route: the SNIs it matches (empty: any) and whether it refuses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsRule {
    pub snis: Vec<HostMatch>,
    pub forbidden: bool,
}

impl StreamRules {
    pub fn from_api(policy: &api::OutboundPolicy) -> Self {
        let forbidden_opaque = |routes: &[api::OpaqueRoute]| {
            routes.iter().flat_map(|r| &r.rules).any(|rule| {
                rule.filters.iter().any(|f| matches!(f.kind, Some(opaque_route::filter::Kind::Forbidden(_))))
            })
        };
        match policy.protocol.as_ref().and_then(|p| p.kind.as_ref()) {
            Some(proxy_protocol::Kind::Tls(t)) => {
                Self { tls: Some(t.routes.iter().map(tls_rule).collect()), opaque_forbidden: false }
            }
            Some(proxy_protocol::Kind::Opaque(o)) => Self { tls: None, opaque_forbidden: forbidden_opaque(&o.routes) },
            Some(proxy_protocol::Kind::Detect(d)) => {
                Self { tls: None, opaque_forbidden: d.opaque.as_ref().is_some_and(|o| forbidden_opaque(&o.routes)) }
            }
            _ => Self::default(),
        }
    }

    /// Whether a TLS connection with this SNI (`None`: no SNI, or not TLS) is refused.
    pub fn tls_refused(&self, sni: Option<&str>) -> bool {
        let Some(rules) = &self.tls else { return self.opaque_forbidden };
        let rank = |rule: &TlsRule| -> Option<(u8, usize)> {
            if rule.snis.is_empty() {
                return Some((0, 0));
            }
            let sni = sni?;
            rule.snis
                .iter()
                .filter_map(|m| match m {
                    HostMatch::Exact(name) if name.eq_ignore_ascii_case(sni) => Some((2, name.len())),
                    HostMatch::Suffix(suffix) if sni.len() > suffix.len() && sni.ends_with(suffix.as_str()) => {
                        Some((1, suffix.len()))
                    }
                    _ => None,
                })
                .max()
        };
        // The most specific route wins; ties go to the earlier one. No route at all: refused,
        // as a stock proxy refuses what no route describes.
        let mut best: Option<((u8, usize), &TlsRule)> = None;
        for rule in rules {
            if let Some(r) = rank(rule)
                && best.is_none_or(|(b, _)| r > b)
            {
                best = Some((r, rule));
            }
        }
        best.is_none_or(|(_, rule)| rule.forbidden)
    }
}

fn tls_rule(route: &api::TlsRoute) -> TlsRule {
    let snis = route
        .snis
        .iter()
        .filter_map(|m| match m.r#match.as_ref()? {
            sni_match::Match::Exact(name) => Some(HostMatch::Exact(name.to_ascii_lowercase())),
            sni_match::Match::Suffix(s) => {
                let mut labels: Vec<&str> = s.reverse_labels.iter().map(String::as_str).collect();
                labels.reverse();
                Some(HostMatch::Suffix(format!(".{}", labels.join("."))))
            }
        })
        .collect();
    let forbidden = route
        .rules
        .iter()
        .any(|r| r.filters.iter().any(|f| matches!(f.kind, Some(tls_route::filter::Kind::Forbidden(_)))));
    TlsRule { snis, forbidden }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(snis: &[HostMatch], forbidden: bool) -> TlsRule {
        TlsRule { snis: snis.to_vec(), forbidden }
    }

    #[test]
    fn the_most_specific_tls_route_decides_and_no_sni_gets_the_fallback() {
        let rules = StreamRules {
            tls: Some(vec![
                rule(&[HostMatch::Exact("api.example.test".into())], false),
                rule(&[HostMatch::Suffix(".example.test".into())], true),
                rule(&[], true),
            ]),
            opaque_forbidden: false,
        };
        assert!(!rules.tls_refused(Some("api.example.test")));
        assert!(!rules.tls_refused(Some("API.example.test")), "SNI is case-insensitive");
        assert!(rules.tls_refused(Some("other.example.test")));
        assert!(rules.tls_refused(Some("evil.test")));
        assert!(rules.tls_refused(None));
        let allow = StreamRules { tls: Some(vec![rule(&[], false)]), opaque_forbidden: false };
        assert!(!allow.tls_refused(Some("anything.test")));
        let none = StreamRules { tls: Some(vec![rule(&[HostMatch::Exact("a.test".into())], false)]), ..allow };
        assert!(none.tls_refused(Some("b.test")), "what no route describes is refused");
    }
}
