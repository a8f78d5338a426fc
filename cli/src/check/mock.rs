//! A mocked Kubernetes API server for the check's tests: canned replies keyed by method and
//! path (query strings are ignored), 404 `Status` for anything else, and SelfSubjectAccessReviews
//! answered from a deny list. With `rbac` set, every request is first authorized against those
//! rules, as the API server's RBAC authorizer does for a user holding only that role (403
//! otherwise, and the request is recorded in `forbidden`). It is the one thing the tests fake; everything above the HTTP
//! requests (kube-rs, parsing, the checks) runs for real.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub enum Reply {
    Json(Value),
    Text(String),
    /// An HTTP error with a Kubernetes `Status` body.
    Status(u16, String),
}

#[derive(Debug, Clone, Default)]
pub struct MockApi {
    routes: BTreeMap<(String, String), Reply>,
    /// SelfSubjectAccessReviews to deny, as `verb resource[/subresource] namespace|*`.
    pub denied: BTreeSet<String>,
    /// Every request fails at the connection: the API server is unreachable.
    pub unreachable: bool,
    /// The rules (of a Role or ClusterRole) the caller holds; `None`: everything is allowed.
    pub rbac: Option<Vec<Value>>,
    /// The requests `rbac` refused, as `verb group/resource[/subresource] name`.
    pub forbidden: Arc<Mutex<Vec<String>>>,
}

/// What RBAC judges a request by: the verb and the resource it names.
#[derive(Debug)]
struct Attributes {
    verb: &'static str,
    group: String,
    resource: String,
    name: String,
}

impl Attributes {
    /// `/api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUBRESOURCE[/…]]]` or the same under `/apis/GROUP/VERSION`.
    fn of(method: &str, path: &str) -> Option<Self> {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => (String::new(), rest),
            ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
            _ => return None,
        };
        let rest = match rest {
            ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
            other => other,
        };
        let (resource, name, sub) = match rest {
            [resource] => (resource.to_string(), String::new(), None),
            [resource, name] => (resource.to_string(), name.to_string(), None),
            [resource, name, sub, ..] => (resource.to_string(), name.to_string(), Some(*sub)),
            [] => return None,
        };
        let verb = match (method, name.is_empty()) {
            ("GET", true) => "list",
            ("GET", false) => "get",
            ("POST", _) => "create",
            ("DELETE", _) => "delete",
            ("PATCH", _) => "patch",
            _ => "update",
        };
        let resource = match sub {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource,
        };
        Some(Attributes { verb, group, resource, name })
    }

    fn allowed_by(&self, rule: &Value) -> bool {
        let has = |key: &str, wanted: &str| {
            rule[key].as_array().is_some_and(|values| values.iter().any(|v| v == wanted || v == "*"))
        };
        let names = rule["resourceNames"].as_array().filter(|names| !names.is_empty());
        has("verbs", self.verb)
            && has("apiGroups", &self.group)
            && has("resources", &self.resource)
            && names.is_none_or(|names| names.iter().any(|n| *n == self.name.as_str()))
    }
}

impl MockApi {
    pub fn get(&mut self, path: &str, value: Value) -> &mut Self {
        self.routes.insert(("GET".into(), path.into()), Reply::Json(value));
        self
    }
    pub fn get_text(&mut self, path: &str, text: &str) -> &mut Self {
        self.routes.insert(("GET".into(), path.into()), Reply::Text(text.into()));
        self
    }
    /// An HTTP error with a `Status` body, as the API server sends when a pod proxy fails.
    pub fn fail(&mut self, path: &str, code: u16, message: &str) -> &mut Self {
        self.routes.insert(("GET".into(), path.into()), Reply::Status(code, message.into()));
        self
    }
    pub fn remove(&mut self, path: &str) -> &mut Self {
        self.routes.remove(&("GET".to_string(), path.to_string()));
        self
    }
    /// The JSON of a GET route, to edit in place.
    pub fn json_mut(&mut self, path: &str) -> &mut Value {
        match self.routes.get_mut(&("GET".to_string(), path.to_string())) {
            Some(Reply::Json(v)) => v,
            _ => panic!("no JSON route for {path}"),
        }
    }

    fn answer(&self, method: &str, path: &str, body: &[u8]) -> (u16, String, &'static str) {
        if method == "POST" && path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" {
            let mut review: Value = serde_json::from_slice(body).expect("a review");
            let attrs = &review["spec"]["resourceAttributes"];
            let text = |k: &str| attrs[k].as_str().unwrap_or_default().to_string();
            let sub = text("subresource");
            let resource = if sub.is_empty() { text("resource") } else { format!("{}/{sub}", text("resource")) };
            let ns = Some(text("namespace")).filter(|n| !n.is_empty()).unwrap_or_else(|| "*".into());
            let allowed = !self.denied.contains(&format!("{} {resource} {ns}", text("verb")));
            review["status"] = json!({"allowed": allowed});
            return (201, review.to_string(), "application/json");
        }
        if let (Some(rules), Some(attributes)) = (&self.rbac, Attributes::of(method, path))
            && !rules.iter().any(|rule| attributes.allowed_by(rule))
        {
            let Attributes { verb, group, resource, name } = attributes;
            self.forbidden.lock().push(format!("{verb} {group}/{resource} {name}").trim_end().to_string());
            let message = format!("forbidden: the role does not allow {verb} {resource} {name}");
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": "Forbidden", "code": 403});
            return (403, body.to_string(), "application/json");
        }
        match self.routes.get(&(method.to_string(), path.to_string())) {
            Some(Reply::Json(v)) => (200, v.to_string(), "application/json"),
            Some(Reply::Text(t)) => (200, t.clone(), "text/plain"),
            Some(Reply::Status(code, message)) => (*code, status(*code, message), "application/json"),
            None => (404, status(404, &format!("{path} not found")), "application/json"),
        }
    }

    pub fn client(&self) -> kube::Client {
        let mock = Arc::new(self.clone());
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let mock = mock.clone();
            async move {
                if mock.unreachable {
                    return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
                }
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                let body = req.into_body().collect().await.expect("a request body").to_bytes();
                let (code, text, content_type) = mock.answer(&method, &path, &body);
                let response = http::Response::builder()
                    .status(code)
                    .header("content-type", content_type)
                    .body(Full::new(Bytes::from(text)))
                    .expect("a response");
                Ok(response)
            }
        });
        kube::Client::new(service, "default")
    }
}

fn status(code: u16, message: &str) -> String {
    let reason = match code {
        404 => "NotFound",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
        .to_string()
}
