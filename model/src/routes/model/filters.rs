//! A rule's (or a backend's) filters: header modifiers, redirects, and the host rewrite.

use super::checks::{header_name, invalid, port};
use super::crd;
use super::hostnames::hostnames;
use super::kind::RouteKind;
use crate::meta::Invalid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
}

/// Applied in the order add, set, remove (linkerd2-proxy-api's order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    pub add: Vec<(String, String)>,
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    Full(String),
    Prefix(String),
}

pub(super) fn filters(filters: &[crd::HttpRouteFilter], kind: RouteKind) -> Result<Vec<Filter>, Invalid> {
    filters.iter().map(|f| filter(f, kind)).collect()
}

fn filter(f: &crd::HttpRouteFilter, kind: RouteKind) -> Result<Filter, Invalid> {
    let missing = || Invalid(format!("filter {} has no {} field", f.kind, field_of(&f.kind)));
    match (f.kind.as_str(), kind) {
        ("RequestHeaderModifier", _) => {
            Ok(Filter::RequestHeaders(header_modifier(f.request_header_modifier.as_ref().ok_or_else(missing)?)?))
        }
        ("ResponseHeaderModifier", RouteKind::Http) => {
            Ok(Filter::ResponseHeaders(header_modifier(f.response_header_modifier.as_ref().ok_or_else(missing)?)?))
        }
        ("RequestRedirect", RouteKind::Http) => {
            Ok(Filter::Redirect(redirect(f.request_redirect.as_ref().ok_or_else(missing)?)?))
        }
        ("URLRewrite", RouteKind::Http) => {
            // linkerd2-proxy-api's outbound filters have no rewrite: a new Host header can be
            // set, a new path cannot.
            let rewrite = f.url_rewrite.as_ref().ok_or_else(missing)?;
            if rewrite.path.is_some() {
                return invalid(
                    "URLRewrite of the path cannot be served (linkerd2-proxy-api's outbound HttpRoute filters have no path rewrite); only hostname can",
                );
            }
            let host = rewrite.hostname.clone().ok_or_else(|| Invalid("URLRewrite with nothing to rewrite".into()))?;
            hostnames(std::slice::from_ref(&host))?;
            Ok(Filter::RequestHeaders(HeaderModifier { set: vec![("host".into(), host)], ..HeaderModifier::default() }))
        }
        (other, RouteKind::Http) => invalid(format!(
            "filter type {other:?} is not supported (RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite are)"
        )),
        (other, RouteKind::Grpc) => invalid(format!(
            "filter type {other:?} is not supported on a GRPCRoute (linkerd2-proxy-api's gRPC routes take RequestHeaderModifier only)"
        )),
    }
}

fn field_of(kind: &str) -> &'static str {
    match kind {
        "RequestHeaderModifier" => "requestHeaderModifier",
        "ResponseHeaderModifier" => "responseHeaderModifier",
        "RequestRedirect" => "requestRedirect",
        _ => "urlRewrite",
    }
}

fn header_modifier(f: &crd::HttpHeaderFilter) -> Result<HeaderModifier, Invalid> {
    let pairs = |headers: &[crd::HttpHeader]| {
        headers
            .iter()
            .map(|h| {
                http::HeaderValue::from_str(&h.value).map_err(|_| {
                    Invalid(format!("header {:?}: value {:?} is not a valid header value", h.name, h.value))
                })?;
                Ok((header_name(&h.name)?, h.value.clone()))
            })
            .collect::<Result<Vec<_>, Invalid>>()
    };
    Ok(HeaderModifier {
        add: pairs(&f.add)?,
        set: pairs(&f.set)?,
        remove: f.remove.iter().map(|n| header_name(n)).collect::<Result<_, _>>()?,
    })
}

fn redirect(f: &crd::HttpRequestRedirectFilter) -> Result<Redirect, Invalid> {
    if let Some(scheme) = f.scheme.as_deref()
        && !matches!(scheme, "http" | "https")
    {
        return invalid(format!("redirect scheme {scheme:?} is not http or https"));
    }
    if let Some(host) = &f.hostname {
        hostnames(std::slice::from_ref(host))?;
    }
    let path = f
        .path
        .as_ref()
        .map(|p| match (p.kind.as_str(), &p.replace_full_path, &p.replace_prefix_match) {
            ("ReplaceFullPath", Some(full), _) => Ok(PathModifier::Full(full.clone())),
            ("ReplacePrefixMatch", _, Some(prefix)) => Ok(PathModifier::Prefix(prefix.clone())),
            (kind, _, _) => invalid(format!(
                "redirect path type {kind:?} needs ReplaceFullPath with replaceFullPath or ReplacePrefixMatch with replacePrefixMatch"
            )),
        })
        .transpose()?;
    let status = f
        .status_code
        .map(|s| match s {
            301 | 302 | 303 | 307 | 308 => Ok(s as u16),
            other => invalid(format!("redirect statusCode {other} is not 301, 302, 303, 307 or 308")),
        })
        .transpose()?;
    Ok(Redirect {
        scheme: f.scheme.clone(),
        hostname: f.hostname.clone(),
        path,
        port: f.port.map(|p| port(p, "redirect port")).transpose()?,
        status,
    })
}
