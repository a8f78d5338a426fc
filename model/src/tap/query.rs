//! What a tap asks for, as the relay's query string: one type the relay parses and the
//! `cnimesh tap` / `top` commands write, so the two cannot disagree.
//!
//! `GET /tap?resource=KIND[/NAME]&namespace=NS[&to=KIND[/NAME]][&to-namespace=NS]`
//! `[&method=M][&path=PREFIX][&authority=HOST[:PORT]][&scheme=http|https][&limit=N][&max-rps=R]`
//!
//! - `resource`: whose proxies are tapped (both directions): namespace, deployment, statefulset,
//!   daemonset, replicaset, job, cronjob or pod, kubectl's short names too; without a name, every
//!   meshed pod of that kind in the namespace. For `namespace/NAME` the name is the namespace.
//! - `namespace`: the resource's namespace [default: `default`].
//! - `to`, `to-namespace` [default: `namespace`]: only requests whose destination is one of that
//!   resource's pods, or the ClusterIP of a Service they are endpoints of; `to=egress[/HOSTNAME]`:
//!   only requests to an EgressNetwork's destinations (with that hostname).
//! - `method` (exact), `path` (prefix), `authority` (exact), `scheme`: request matches.
//! - `limit`: end after this many requests (0 or absent: until the caller goes away).
//! - `max-rps`: at most this many new requests per second are streamed, the others are dropped
//!   [default: 100; 0: no limit]. The proxies stream everything that matches; this bounds what
//!   one tap sends over the API server's proxy.
//!
//! Layer: model (pure).

use std::fmt::Write as _;

use crate::resource::{Kind, Resource};

/// The header carrying the `cnimesh-tap` ServiceAccount's token, beside the query.
pub const TOKEN_HEADER: &str = "cnimesh-tap-token";
/// [`TapQuery::max_rps`]'s default, as `linkerd viz tap --max-rps`.
pub const DEFAULT_MAX_RPS: f64 = 100.0;

#[derive(Debug, Clone, PartialEq)]
pub struct TapQuery {
    pub resource: Resource,
    pub namespace: String,
    pub to: Option<(Resource, String)>,
    pub method: Option<http::Method>,
    pub path: Option<String>,
    pub authority: Option<String>,
    pub scheme: Option<String>,
    /// 0: no limit.
    pub limit: u32,
    /// 0: no limit.
    pub max_rps: f64,
}

impl TapQuery {
    /// A query for `resource` in `namespace` with the defaults.
    pub fn new(resource: Resource, namespace: impl Into<String>) -> Self {
        Self {
            resource,
            namespace: namespace.into(),
            to: None,
            method: None,
            path: None,
            authority: None,
            scheme: None,
            limit: 0,
            max_rps: DEFAULT_MAX_RPS,
        }
    }

    /// Parses a query string (without the `?`); the error names the parameter and the problem.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut resource = None;
        let mut namespace = None;
        let (mut to, mut to_namespace) = (None, None);
        let mut q = Self::new(Resource { kind: Kind::Pod, name: None }, "");
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = value.into_owned();
            let shown = format!("{key}={value:?}");
            let bad = |why: &dyn std::fmt::Display| format!("{shown}: {why}");
            let nonempty = |v: String| if v.is_empty() { Err(bad(&"must not be empty")) } else { Ok(v) };
            match &*key {
                "resource" => resource = Some(value.parse::<Resource>().map_err(|e| bad(&e))?),
                "namespace" => namespace = Some(nonempty(value)?),
                "to" => to = Some(value.parse::<Resource>().map_err(|e| bad(&e))?),
                "to-namespace" => to_namespace = Some(nonempty(value)?),
                "method" => {
                    q.method =
                        Some(http::Method::from_bytes(value.to_ascii_uppercase().as_bytes()).map_err(|e| bad(&e))?)
                }
                "path" if !value.starts_with('/') => return Err(bad(&"a path starts with '/'")),
                "path" => q.path = Some(value),
                "authority" => q.authority = Some(nonempty(value)?),
                "scheme" => q.scheme = Some(nonempty(value.to_ascii_lowercase())?),
                "limit" => q.limit = value.parse().map_err(|e| bad(&e))?,
                "max-rps" => {
                    q.max_rps = value.parse().map_err(|e| bad(&e))?;
                    if !(q.max_rps.is_finite() && q.max_rps >= 0.0) {
                        return Err(bad(&"not a rate"));
                    }
                }
                other => return Err(format!("unknown parameter {other:?}")),
            }
        }
        q.resource = resource.ok_or("the parameter resource (KIND[/NAME]) is required")?;
        if q.resource.kind == Kind::Egress {
            return Err(format!(
                "resource={:?}: egress has no proxies to tap; tap the workload that sends it with to=egress[/HOSTNAME]",
                resource_text(&q.resource)
            ));
        }
        q.namespace = match (&q.resource, namespace) {
            (Resource { kind: Kind::Namespace, name: Some(name) }, _) => name.clone(),
            (_, namespace) => namespace.unwrap_or_else(|| "default".into()),
        };
        q.to = match (to, to_namespace) {
            (Some(to), ns) => Some((to, ns.unwrap_or_else(|| q.namespace.clone()))),
            (None, Some(_)) => return Err("to-namespace without to".into()),
            (None, None) => None,
        };
        Ok(q)
    }

    /// The query string [`TapQuery::parse`] reads back.
    pub fn to_query_string(&self) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        s.append_pair("resource", &resource_text(&self.resource));
        s.append_pair("namespace", &self.namespace);
        if let Some((to, ns)) = &self.to {
            s.append_pair("to", &resource_text(to));
            s.append_pair("to-namespace", ns);
        }
        for (key, value) in [
            ("method", self.method.as_ref().map(|m| m.as_str())),
            ("path", self.path.as_deref()),
            ("authority", self.authority.as_deref()),
            ("scheme", self.scheme.as_deref()),
        ] {
            if let Some(value) = value {
                s.append_pair(key, value);
            }
        }
        if self.limit > 0 {
            s.append_pair("limit", &self.limit.to_string());
        }
        let mut rps = String::new();
        let _ = write!(rps, "{}", self.max_rps);
        s.append_pair("max-rps", &rps);
        s.finish()
    }
}

/// `kind[/name]`, as the query and the commands write a resource.
pub fn resource_text(resource: &Resource) -> String {
    match &resource.name {
        Some(name) => format!("{}/{name}", resource.kind.name()),
        None => resource.kind.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_query_parses_and_round_trips() {
        let q = TapQuery::parse(
            "resource=deploy/web&namespace=demo&to=sts/db&method=post&path=/api%2Fv1&authority=web:8080&limit=10&max-rps=2.5&scheme=HTTP",
        )
        .unwrap();
        assert_eq!(q.resource, "deployment/web".parse().unwrap());
        assert_eq!(q.namespace, "demo");
        assert_eq!(q.to, Some(("statefulset/db".parse().unwrap(), "demo".into())));
        assert_eq!(q.method, Some(http::Method::POST));
        assert_eq!(q.path.as_deref(), Some("/api/v1"));
        assert_eq!(q.authority.as_deref(), Some("web:8080"));
        assert_eq!(q.scheme.as_deref(), Some("http"));
        assert_eq!((q.limit, q.max_rps), (10, 2.5));
        assert_eq!(TapQuery::parse(&q.to_query_string()).unwrap(), q);
    }

    #[test]
    fn defaults_and_namespaces() {
        let q = TapQuery::parse("resource=deployment").unwrap();
        assert_eq!((q.namespace.as_str(), q.limit, q.max_rps, q.to.is_none()), ("default", 0, DEFAULT_MAX_RPS, true));
        let q = TapQuery::parse("resource=ns/shop&namespace=ignored").unwrap();
        assert_eq!(q.namespace, "shop");
        let q = TapQuery::parse("resource=po/a&namespace=x&to=deploy/b&to-namespace=y").unwrap();
        assert_eq!(q.to.unwrap().1, "y");
        let q = TapQuery::new("deploy/web".parse().unwrap(), "demo");
        assert_eq!(TapQuery::parse(&q.to_query_string()).unwrap(), q);
    }

    #[test]
    fn mistakes_are_named() {
        for (query, expected) in [
            ("namespace=demo", "resource (KIND[/NAME]) is required"),
            ("resource=widget/x", "unknown resource kind"),
            ("resource=deploy/web&limit=-1", "limit=\"-1\""),
            ("resource=deploy/web&max-rps=nan", "max-rps=\"nan\": not a rate"),
            ("resource=deploy/web&path=hello", "a path starts with '/'"),
            ("resource=deploy/web&method=G%20T", "method="),
            ("resource=deploy/web&namespace=", "must not be empty"),
            ("resource=deploy/web&to-namespace=x", "to-namespace without to"),
            ("resource=deploy/web&colour=red", "unknown parameter \"colour\""),
            ("resource=egress/api.example.test", "egress has no proxies to tap"),
        ] {
            let error = TapQuery::parse(query).unwrap_err();
            assert!(error.contains(expected), "{query}: {error}");
        }
    }
}
