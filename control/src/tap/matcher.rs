//! The `ObserveRequest` sent to every tapped proxy: the query's HTTP conditions and the `--to`
//! addresses (its pods' and their Services' ClusterIPs), or for `--to egress[/HOSTNAME]` the
//! destination labels the proxy gives egress (`dst_kind`, `dst_hostname`), as one `all` match. Empty sequences are never sent (linkerd2-proxy refuses
//! them as invalid), so a query without conditions matches on "any source port".
//!
//! Layer: model (pure).

use std::net::IpAddr;

use linkerd2_proxy_api::http_types::{HttpMethod, Scheme};
use linkerd2_proxy_api::net::IpAddress;
use linkerd2_proxy_api::tap::ObserveRequest;
use linkerd2_proxy_api::tap::observe_request::r#match::{self as m, http as mhttp, tcp};
use linkerd2_proxy_api::tap::observe_request::{Extract, Match, extract};

use cnimesh_model::resource::{Kind, Resource};
use cnimesh_model::tap::query::TapQuery;

/// The request for `query`, with `to` the addresses of its `to` resource (ignored when the
/// query has no `to`).
pub fn observe_request(query: &TapQuery, to: &[IpAddr]) -> ObserveRequest {
    let mut all = Vec::new();
    let http = |h: mhttp::Match| wrap(m::Match::Http(m::Http { r#match: Some(h) }));
    let string = |s: mhttp::string_match::Match| mhttp::StringMatch { r#match: Some(s) };
    if let Some(method) = &query.method {
        all.push(http(mhttp::Match::Method(HttpMethod::from(method.clone()))));
    }
    if let Some(scheme) = &query.scheme {
        all.push(http(mhttp::Match::Scheme(Scheme::from(scheme.as_str()))));
    }
    if let Some(authority) = &query.authority {
        all.push(http(mhttp::Match::Authority(string(mhttp::string_match::Match::Exact(authority.clone())))));
    }
    if let Some(path) = &query.path {
        all.push(http(mhttp::Match::Path(string(mhttp::string_match::Match::Prefix(path.clone())))));
    }
    if let Some((Resource { kind: Kind::Egress, name }, _)) = &query.to {
        // Egress is matched by the labels the proxy gives its destination, by hostname.
        let label = |key: &str, value: &str| {
            wrap(m::Match::DestinationLabel(m::Label { key: key.into(), value: value.into() }))
        };
        all.push(label("dst_kind", "egress"));
        if let Some(hostname) = name {
            all.push(label("dst_hostname", &hostname.to_ascii_lowercase()));
        }
    } else if query.to.is_some() {
        let hosts: Vec<Match> = to
            .iter()
            .map(|ip| {
                let mask = if ip.is_ipv4() { 32 } else { 128 };
                let netmask = tcp::Netmask { ip: Some(IpAddress::from(*ip)), mask };
                wrap(m::Match::Destination(m::Tcp { r#match: Some(tcp::Match::Netmask(netmask)) }))
            })
            .collect();
        all.push(one_or(m::Match::Any, hosts));
    }
    if all.is_empty() {
        let any_port = tcp::PortRange { min: 1, max: u32::from(u16::MAX) };
        all.push(wrap(m::Match::Source(m::Tcp { r#match: Some(tcp::Match::Ports(any_port)) })));
    }
    ObserveRequest {
        // The proxies stream until the relay hangs up; the relay counts the limit over all of them.
        limit: match query.limit {
            0 => u32::MAX,
            n => n,
        },
        r#match: Some(one_or(m::Match::All, all)),
        extract: Some(Extract { extract: Some(extract::Extract::Http(extract::Http { extract: None })) }),
    }
}

fn wrap(m: m::Match) -> Match {
    Match { r#match: Some(m) }
}

/// A single condition as itself, several as `seq` of them (never an empty one: callers pass at
/// least one).
fn one_or(seq: fn(m::Seq) -> m::Match, mut matches: Vec<Match>) -> Match {
    if matches.len() == 1 {
        return matches.remove(0);
    }
    wrap(seq(m::Seq { matches }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> TapQuery {
        TapQuery::parse(q).unwrap()
    }

    #[test]
    fn no_conditions_match_any_source_port_and_no_limit_is_the_largest() {
        let req = observe_request(&parse("resource=deploy/web"), &[]);
        assert_eq!(req.limit, u32::MAX);
        let Some(m::Match::Source(m::Tcp { r#match: Some(tcp::Match::Ports(p)) })) = req.r#match.unwrap().r#match
        else {
            panic!("not a source port range")
        };
        assert_eq!((p.min, p.max), (1, 65535));
    }

    #[test]
    fn conditions_are_all_of_the_http_matches_and_any_of_the_destinations() {
        let q = parse("resource=deploy/client&to=deploy/web&method=GET&path=/hello&authority=web:8080&limit=5");
        let ips: Vec<IpAddr> = vec!["10.0.0.7".parse().unwrap(), "fd00::7".parse().unwrap()];
        let req = observe_request(&q, &ips);
        assert_eq!(req.limit, 5);
        let Some(m::Match::All(all)) = req.r#match.unwrap().r#match else { panic!("not all") };
        assert_eq!(all.matches.len(), 4);
        let inner: Vec<m::Match> = all.matches.into_iter().map(|m| m.r#match.unwrap()).collect();
        assert!(matches!(&inner[0], m::Match::Http(m::Http { r#match: Some(mhttp::Match::Method(_)) })));
        assert!(matches!(&inner[1], m::Match::Http(m::Http { r#match: Some(mhttp::Match::Authority(s)) })
            if s.r#match == Some(mhttp::string_match::Match::Exact("web:8080".into()))));
        assert!(matches!(&inner[2], m::Match::Http(m::Http { r#match: Some(mhttp::Match::Path(s)) })
            if s.r#match == Some(mhttp::string_match::Match::Prefix("/hello".into()))));
        let m::Match::Any(any) = &inner[3] else { panic!("destinations are any") };
        let masks: Vec<(IpAddr, u32)> = any
            .matches
            .iter()
            .map(|m| match &m.r#match {
                Some(m::Match::Destination(m::Tcp { r#match: Some(tcp::Match::Netmask(n)) })) => {
                    (IpAddr::try_from(n.ip.unwrap()).unwrap(), n.mask)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(masks, [(ips[0], 32), (ips[1], 128)]);
    }

    #[test]
    fn egress_is_matched_by_the_destination_labels_of_its_hostname() {
        let req = observe_request(&parse("resource=deploy/client&to=egress/API.example.test"), &[]);
        let Some(m::Match::All(all)) = req.r#match.unwrap().r#match else { panic!("not all") };
        let labels: Vec<(String, String)> = all
            .matches
            .into_iter()
            .map(|m| match m.r#match {
                Some(m::Match::DestinationLabel(l)) => (l.key, l.value),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = [("dst_kind", "egress"), ("dst_hostname", "api.example.test")];
        assert_eq!(labels, expected.map(|(k, v)| (k.to_string(), v.to_string())));
        let any = observe_request(&parse("resource=deploy/client&to=egress"), &[]);
        assert!(matches!(any.r#match.unwrap().r#match, Some(m::Match::DestinationLabel(l)) if l.value == "egress"));
    }

    #[test]
    fn a_single_condition_is_sent_bare() {
        let req = observe_request(&parse("resource=deploy/web&path=/a"), &[]);
        assert!(matches!(req.r#match.unwrap().r#match, Some(m::Match::Http(_))));
    }
}
