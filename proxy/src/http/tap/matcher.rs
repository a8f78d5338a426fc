//! An `ObserveRequest.Match` tree, checked once when a tap opens (a malformed one is the
//! caller's INVALID_ARGUMENT, as linkerd2-proxy answers) and then evaluated against each request
//! while the tap is open.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use linkerd2_proxy_api::http_types::{http_method, scheme};
use linkerd2_proxy_api::tap::observe_request::r#match::{self as pb, http::string_match};

/// Why a match cannot be used; each names the part that is wrong.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMatch {
    #[error("a match (or one of its parts) is empty")]
    Empty,
    #[error("invalid port range {0}-{1}")]
    Port(u32, u32),
    #[error("invalid network: {0}")]
    Network(String),
    #[error("invalid HTTP method {0:?}")]
    Method(String),
    #[error("invalid scheme {0:?}")]
    Scheme(String),
    #[error("a label match needs a key and a value")]
    Label,
}

/// What a request is matched on: its HTTP head, its connection's ends and the labels the tap
/// event will carry.
pub struct Subject<'a> {
    pub method: &'a http::Method,
    pub scheme: Option<&'a str>,
    pub authority: &'a str,
    pub path: &'a str,
    pub source: SocketAddr,
    pub destination: SocketAddr,
    pub destination_labels: &'a HashMap<String, String>,
    pub route_labels: Option<&'a HashMap<String, String>>,
}

#[derive(Debug, Clone)]
pub enum Match {
    All(Vec<Match>),
    Any(Vec<Match>),
    Not(Box<Match>),
    Source(Tcp),
    Destination(Tcp),
    DestinationLabel(String, String),
    RouteLabel(String, String),
    Scheme(String),
    Method(http::Method),
    Authority(Text),
    Path(Text),
}

#[derive(Debug, Clone)]
pub enum Tcp {
    /// Inclusive.
    Ports(u16, u16),
    Net(IpNet),
}

#[derive(Debug, Clone)]
pub enum Text {
    Exact(String),
    Prefix(String),
}

impl Text {
    fn matches(&self, value: &str) -> bool {
        match self {
            Text::Exact(s) => value == s,
            Text::Prefix(p) => value.starts_with(p.as_str()),
        }
    }
}

impl Tcp {
    fn matches(&self, addr: SocketAddr) -> bool {
        match self {
            Tcp::Ports(min, max) => (*min..=*max).contains(&addr.port()),
            Tcp::Net(net) => net.contains(&addr.ip()),
        }
    }
}

impl Match {
    /// The match of an `ObserveRequest`; a request without one is invalid, as in linkerd2-proxy
    /// (`all: {}` matches everything).
    pub fn new(m: Option<linkerd2_proxy_api::tap::observe_request::Match>) -> Result<Self, InvalidMatch> {
        Self::from_pb(m.and_then(|m| m.r#match).ok_or(InvalidMatch::Empty)?)
    }

    fn from_pb(m: pb::Match) -> Result<Self, InvalidMatch> {
        let seq = |s: pb::Seq| {
            s.matches.into_iter().filter_map(|m| m.r#match).map(Self::from_pb).collect::<Result<Vec<_>, _>>()
        };
        let label = |l: pb::Label| {
            if l.key.is_empty() || l.value.is_empty() { Err(InvalidMatch::Label) } else { Ok((l.key, l.value)) }
        };
        Ok(match m {
            pb::Match::All(s) => Match::All(seq(s)?),
            pb::Match::Any(s) => Match::Any(seq(s)?),
            pb::Match::Not(m) => Match::Not(Box::new(Self::from_pb(m.r#match.ok_or(InvalidMatch::Empty)?)?)),
            pb::Match::Source(t) => Match::Source(tcp(t)?),
            pb::Match::Destination(t) => Match::Destination(tcp(t)?),
            pb::Match::DestinationLabel(l) => label(l).map(|(k, v)| Match::DestinationLabel(k, v))?,
            pb::Match::RouteLabel(l) => label(l).map(|(k, v)| Match::RouteLabel(k, v))?,
            pb::Match::Http(h) => http_match(h.r#match.ok_or(InvalidMatch::Empty)?)?,
        })
    }

    pub fn matches(&self, s: &Subject<'_>) -> bool {
        match self {
            Match::All(ms) => ms.iter().all(|m| m.matches(s)),
            Match::Any(ms) => ms.iter().any(|m| m.matches(s)),
            Match::Not(m) => !m.matches(s),
            Match::Source(t) => t.matches(s.source),
            Match::Destination(t) => t.matches(s.destination),
            Match::DestinationLabel(k, v) => s.destination_labels.get(k) == Some(v),
            Match::RouteLabel(k, v) => s.route_labels.is_some_and(|l| l.get(k) == Some(v)),
            // An HTTP/1 request in origin form has no scheme: it is `http`.
            Match::Scheme(want) => s.scheme.unwrap_or("http").eq_ignore_ascii_case(want),
            Match::Method(m) => m == s.method,
            Match::Authority(t) => t.matches(s.authority),
            Match::Path(t) => t.matches(s.path),
        }
    }
}

/// A port range with a missing end is one port; a netmask needs an address and a length that
/// fits it.
fn tcp(t: pb::Tcp) -> Result<Tcp, InvalidMatch> {
    match t.r#match.ok_or(InvalidMatch::Empty)? {
        pb::tcp::Match::Ports(r) => {
            let min = if r.min == 0 { r.max } else { r.min };
            let max = if r.max == 0 { r.min } else { r.max };
            match (u16::try_from(min), u16::try_from(max)) {
                (Ok(lo), Ok(hi)) if lo > 0 && lo <= hi => Ok(Tcp::Ports(lo, hi)),
                _ if min == 0 => Err(InvalidMatch::Empty),
                _ => Err(InvalidMatch::Port(r.min, r.max)),
            }
        }
        pb::tcp::Match::Netmask(n) => {
            let ip: IpAddr =
                n.ip.ok_or(InvalidMatch::Empty)?.try_into().map_err(|e| InvalidMatch::Network(format!("{e}")))?;
            let len = u8::try_from(n.mask).map_err(|_| InvalidMatch::Network(format!("{ip}/{}", n.mask)))?;
            if len == 0 {
                return Err(InvalidMatch::Empty);
            }
            IpNet::new(ip, len).map(Tcp::Net).map_err(|_| InvalidMatch::Network(format!("{ip}/{len}")))
        }
    }
}

fn http_match(m: pb::http::Match) -> Result<Match, InvalidMatch> {
    let text = |s: pb::http::StringMatch| match s.r#match.ok_or(InvalidMatch::Empty)? {
        string_match::Match::Exact(e) => Ok(Text::Exact(e)),
        string_match::Match::Prefix(p) => Ok(Text::Prefix(p)),
    };
    Ok(match m {
        pb::http::Match::Scheme(s) => match s.r#type.ok_or(InvalidMatch::Empty)? {
            scheme::Type::Registered(r) if r == scheme::Registered::Http as i32 => Match::Scheme("http".into()),
            scheme::Type::Registered(r) if r == scheme::Registered::Https as i32 => Match::Scheme("https".into()),
            scheme::Type::Registered(r) => return Err(InvalidMatch::Scheme(r.to_string())),
            scheme::Type::Unregistered(s) if http::uri::Scheme::try_from(s.as_str()).is_ok() => Match::Scheme(s),
            scheme::Type::Unregistered(s) => return Err(InvalidMatch::Scheme(s)),
        },
        pb::http::Match::Method(m) => {
            let t = m.r#type.ok_or(InvalidMatch::Empty)?;
            let shown = match &t {
                http_method::Type::Registered(r) => r.to_string(),
                http_method::Type::Unregistered(s) => s.clone(),
            };
            Match::Method(http::Method::try_from(t).map_err(|_| InvalidMatch::Method(shown))?)
        }
        pb::http::Match::Authority(s) => Match::Authority(text(s)?),
        pb::http::Match::Path(s) => Match::Path(text(s)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::http_types::HttpMethod;
    use linkerd2_proxy_api::tap::observe_request::Match as PbMatch;

    fn m(inner: pb::Match) -> PbMatch {
        PbMatch { r#match: Some(inner) }
    }

    fn path_prefix(p: &str) -> pb::Match {
        pb::Match::Http(pb::Http {
            r#match: Some(pb::http::Match::Path(pb::http::StringMatch {
                r#match: Some(string_match::Match::Prefix(p.into())),
            })),
        })
    }

    fn ports(min: u32, max: u32) -> pb::Match {
        pb::Match::Destination(pb::Tcp { r#match: Some(pb::tcp::Match::Ports(pb::tcp::PortRange { min, max })) })
    }

    fn net(ip: IpAddr, mask: u32) -> pb::Match {
        pb::Match::Source(pb::Tcp {
            r#match: Some(pb::tcp::Match::Netmask(pb::tcp::Netmask { ip: Some(ip.into()), mask })),
        })
    }

    fn subject<'a>(
        method: &'a http::Method,
        path: &'a str,
        labels: &'a HashMap<String, String>,
        route: Option<&'a HashMap<String, String>>,
    ) -> Subject<'a> {
        Subject {
            method,
            scheme: None,
            authority: "web.shop.svc.cluster.local:80",
            path,
            source: "10.0.0.5:40000".parse().unwrap(),
            destination: "10.0.0.7:8080".parse().unwrap(),
            destination_labels: labels,
            route_labels: route,
        }
    }

    #[test]
    fn the_tree_combines_tcp_http_and_label_matches() {
        let labels = HashMap::from([("tls".to_string(), "true".to_string())]);
        let route = HashMap::from([("route".to_string(), "api".to_string())]);
        let get = http::Method::GET;
        let hit = subject(&get, "/api/users", &labels, Some(&route));
        let get_method =
            pb::Match::Http(pb::Http { r#match: Some(pb::http::Match::Method(HttpMethod::from(http::Method::GET))) });
        let tree = Match::new(Some(m(pb::Match::All(pb::Seq {
            matches: vec![
                m(path_prefix("/api")),
                m(get_method),
                m(ports(8080, 0)),
                m(net("10.0.0.0".parse().unwrap(), 24)),
                m(pb::Match::DestinationLabel(pb::Label { key: "tls".into(), value: "true".into() })),
                m(pb::Match::RouteLabel(pb::Label { key: "route".into(), value: "api".into() })),
                m(pb::Match::Not(Box::new(m(path_prefix("/api/admin"))))),
            ],
        }))))
        .unwrap();
        assert!(tree.matches(&hit));
        assert!(!tree.matches(&subject(&get, "/api/admin/x", &labels, Some(&route))));
        assert!(!tree.matches(&subject(&get, "/api/users", &labels, None)), "no route: no route label");
        assert!(!tree.matches(&subject(&http::Method::POST, "/api/users", &labels, Some(&route))));
        let any = Match::new(Some(m(pb::Match::Any(pb::Seq { matches: vec![m(ports(1, 80)), m(path_prefix("/x"))] }))))
            .unwrap();
        assert!(!any.matches(&hit));
        let everything = Match::new(Some(m(pb::Match::All(pb::Seq::default())))).unwrap();
        assert!(everything.matches(&hit), "an empty `all` matches every request");
        let v6 = Match::new(Some(m(net("fd00::".parse().unwrap(), 8)))).unwrap();
        assert!(!v6.matches(&hit), "an IPv6 network never holds an IPv4 source");
    }

    #[test]
    fn malformed_matches_are_refused_with_the_reason() {
        assert_eq!(Match::new(None).unwrap_err(), InvalidMatch::Empty);
        assert_eq!(Match::new(Some(PbMatch { r#match: None })).unwrap_err(), InvalidMatch::Empty);
        assert_eq!(Match::new(Some(m(ports(0, 0)))).unwrap_err(), InvalidMatch::Empty);
        assert_eq!(Match::new(Some(m(ports(70000, 0)))).unwrap_err(), InvalidMatch::Port(70000, 0));
        assert_eq!(Match::new(Some(m(ports(90, 80)))).unwrap_err(), InvalidMatch::Port(90, 80));
        assert!(matches!(Match::new(Some(m(net("10.0.0.0".parse().unwrap(), 33)))), Err(InvalidMatch::Network(_))));
        assert_eq!(Match::new(Some(m(net("10.0.0.0".parse().unwrap(), 0)))).unwrap_err(), InvalidMatch::Empty);
        let label = pb::Match::DestinationLabel(pb::Label { key: "k".into(), value: String::new() });
        assert_eq!(Match::new(Some(m(label))).unwrap_err(), InvalidMatch::Label);
        let bad_method = pb::Match::Http(pb::Http {
            r#match: Some(pb::http::Match::Method(HttpMethod {
                r#type: Some(http_method::Type::Unregistered("GE T".into())),
            })),
        });
        assert!(matches!(Match::new(Some(m(bad_method))), Err(InvalidMatch::Method(_))));
        let nested = pb::Match::Not(Box::new(m(pb::Match::Http(pb::Http { r#match: None }))));
        assert_eq!(Match::new(Some(m(nested))).unwrap_err(), InvalidMatch::Empty);
    }
}
