//! A mocked Kubernetes API server holding objects, for the install lifecycle's tests (install,
//! upgrade, prune): its `/version` (a chosen 1.x), GET of one object, LIST of a kind (cluster-wide or in a namespace) filtered
//! by an equality label selector, 404 `Status` for anything absent. Objects are loaded from
//! rendered YAML, as `kubectl apply` would have created them. Only the API server is faked; the
//! kube client, the parsing and the commands run for real.

use std::sync::Arc;

use kube::core::{ApiResource, GroupVersionKind};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// What `cnimesh install --set …` prints with freshly generated certificates: the cluster the
/// lifecycle tests start from.
pub fn rendered_install(set: &[&str]) -> String {
    let args = super::InstallArgs {
        values: super::ValuesArgs { set: set.iter().map(|s| s.to_string()).collect(), ..Default::default() },
        ..Default::default()
    };
    super::render(&super::Certificates::from_args(&args).unwrap(), &args.options().unwrap()).unwrap()
}

#[derive(Debug, Clone, Default)]
pub struct ObjectsApi {
    objects: Arc<Mutex<Vec<Value>>>,
    /// The minor version `/version` answers (1.x); unset: a current server.
    minor: Arc<Mutex<Option<u32>>>,
}

/// The minor version of a mocked server nobody set one for.
pub const CURRENT_MINOR: u32 = 33;

/// `(api prefix, plural)` of an object: `/api/v1` + `secrets`, `/apis/apps/v1` + `deployments`.
fn resource(object: &Value) -> (String, String) {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let prefix = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    (prefix, resource.plural)
}

impl ObjectsApi {
    /// A server of Kubernetes 1.`minor`.
    pub fn at(minor: u32) -> Self {
        let api = ObjectsApi::default();
        api.upgrade_to(minor);
        api
    }

    /// The cluster's own upgrade: `/version` answers 1.`minor` from now on.
    pub fn upgrade_to(&self, minor: u32) {
        *self.minor.lock() = Some(minor);
    }

    /// Every document of a rendered YAML stream, as the cluster would hold it.
    pub fn apply(&self, rendered: &str) {
        let docs = crate::yaml::documents(rendered, "rendered").expect("rendered YAML parses");
        let mut objects = self.objects.lock();
        for doc in docs {
            let key = crate::yaml::describe(&doc);
            objects.retain(|o| crate::yaml::describe(o) != key);
            objects.push(doc);
        }
    }

    pub fn insert(&self, object: Value) {
        self.objects.lock().push(object);
    }

    pub fn objects(&self) -> Vec<Value> {
        self.objects.lock().clone()
    }

    pub fn client(&self) -> kube::Client {
        let this = self.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let this = this.clone();
            async move {
                let (status, body) = this.answer(req.method().as_str(), req.uri().path(), req.uri().query());
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    fn answer(&self, method: &str, path: &str, query: Option<&str>) -> (u16, Value) {
        let not_found = (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                   "message": format!("{path} not found")}),
        );
        if method != "GET" {
            return (405, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 405}));
        }
        if path == "/version" {
            let minor = self.minor.lock().unwrap_or(CURRENT_MINOR);
            return (
                200,
                json!({"major": "1", "minor": minor.to_string(), "gitVersion": format!("v1.{minor}.0"), "gitCommit": "",
                       "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}),
            );
        }
        let selector: Vec<(String, String)> = query
            .into_iter()
            .flat_map(form_pairs)
            .filter(|(k, _)| k == "labelSelector")
            .flat_map(|(_, v)| {
                v.split(',')
                    .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                    .collect::<Vec<_>>()
            })
            .collect();
        let objects = self.objects.lock();
        // `/api/v1/...` or `/apis/group/version/...`: the rest is [namespaces, ns]? plural [name]?
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let split = if segments.first() == Some(&"api") { 2 } else { 3 };
        if segments.len() < split + 1 {
            return not_found;
        }
        let prefix = format!("/{}", segments[..split].join("/"));
        let rest = &segments[split..];
        let (namespace, plural, name) = match rest {
            [plural] => (None, *plural, None),
            [plural, name] => (None, *plural, Some(*name)),
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            _ => return not_found,
        };
        let matches = |o: &&Value| {
            resource(o) == (prefix.clone(), plural.to_string())
                && namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns)
        };
        match name {
            Some(name) => objects
                .iter()
                .filter(matches)
                .find(|o| o["metadata"]["name"] == name)
                .cloned()
                .map_or(not_found, |o| (200, o)),
            None => {
                let items: Vec<Value> = objects
                    .iter()
                    .filter(matches)
                    .filter(|o| selector.iter().all(|(k, v)| o["metadata"]["labels"][k] == v.as_str()))
                    .cloned()
                    .collect();
                (200, json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}))
            }
        }
    }
}

fn form_pairs(query: &str) -> Vec<(String, String)> {
    query.split('&').filter_map(|pair| pair.split_once('=')).map(|(k, v)| (decode(k), decode(v))).collect()
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " ")).decode_utf8_lossy().into_owned()
}
