//! One request, from its arrival to its answer: recorded, then faults, then authentication, then
//! authorization (with RBAC enforced), then discovery, the pod proxy, reviews and token requests, and last the stored collections (list,
//! watch, create, get, replace, patch, apply, delete; the `status` subresource).

use std::sync::Arc;

use http::{HeaderMap, Method, Response, StatusCode};
use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::ClusterApi;
use crate::call::{APPLY_PATCH, Call, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, parse_query};
use crate::faults::Verdict;
use crate::kinds::{Target, parse_path};
use crate::rbac::{self, Attributes, User};
use crate::response::{Body, json_response, status};
use crate::{apply, discovery, list, patch, pod_proxy, store, watch};

impl ClusterApi {
    pub(crate) async fn handle(
        self: &Arc<Self>,
        method: Method,
        uri: &http::Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let delay = self.faults.lock().delay_for(uri.path());
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let content_type =
            headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let parsed_body = serde_json::from_slice(&body)
            .or_else(|_| serde_saphyr::from_str::<Value>(&String::from_utf8_lossy(&body)).map_err(|_| ()))
            .unwrap_or(Value::Null);
        let call = Call {
            method,
            path: uri.path().to_string(),
            query: parse_query(uri.query().unwrap_or_default()),
            content_type,
            body: parsed_body,
            authorization: headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(String::from),
        };
        // A server that is down answers nobody; one that is up asks for the token before any
        // other fault shows (an unauthenticated caller learns nothing from them).
        let refusing = self.faults.lock().refusing;
        let response = if refusing {
            status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "the API server is refusing (fault)")
        } else if !self.authenticated(call.authorization.as_deref()) {
            status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        } else if let Some(forbidden) = self.forbidden(&call) {
            forbidden
        } else {
            let fault = self.faults.lock().take(&call.method, &call.path);
            match fault {
                Some((Verdict::Refused, code)) => {
                    status(code, "ServiceUnavailable", "the API server is refusing (fault)")
                }
                Some((Verdict::Failed, code)) => status(code, "InternalError", "an internal error (fault)"),
                Some((Verdict::Conflict, code)) => status(code, "Conflict", "the object has been modified (fault)"),
                Some((Verdict::Unserved, code)) => {
                    status(code, "NotFound", "the server could not find the requested resource")
                }
                None => match self.fixed_text(&call) {
                    Some(text) => crate::response::text_response(text),
                    None => match pod_proxy::parse(&call.path) {
                        Some(target) => {
                            // Recorded before the pod answers, which may take a while.
                            self.record(call.clone());
                            return self.proxy(target, call, uri.query(), headers, body).await;
                        }
                        None => self.route(&call),
                    },
                },
            }
        };
        // A watch is recorded once it is registered, so a test waiting for it can then write.
        self.record(call);
        response
    }

    /// The text [`ClusterApi::set_text`] fixed for this GET, if any.
    fn fixed_text(&self, call: &Call) -> Option<String> {
        (call.method == Method::GET).then(|| self.texts.lock().get(&call.path).cloned()).flatten()
    }

    fn record(&self, call: Call) {
        self.calls.lock().push(call);
        self.changed.notify_waiters();
    }

    /// With a token required: the request bears it, or a token this server issued for the API.
    fn authenticated(&self, authorization: Option<&str>) -> bool {
        let Some(required) = self.token.lock().clone() else { return true };
        let Some(bearer) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else { return false };
        bearer == required || self.tokens.lock().is_api_token(bearer)
    }

    /// The service account a request's token authenticates, when RBAC holds it to its roles;
    /// `None` for the administrator (the required token, or no token when none is required).
    fn rbac_user(&self, authorization: Option<&str>) -> Option<User> {
        if !self.rbac.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let bearer = authorization.and_then(|a| a.strip_prefix("Bearer "))?;
        if self.token.lock().as_deref() == Some(bearer) {
            return None;
        }
        self.tokens.lock().user_of(bearer)
    }

    /// 403 Forbidden when RBAC is enforced and the caller's roles do not allow the request.
    fn forbidden(&self, call: &Call) -> Option<Response<Body>> {
        let user = self.rbac_user(call.authorization.as_deref())?;
        let attributes = Attributes::of_call(call)?;
        if rbac::allows(&self.store.lock(), &user, &attributes) {
            return None;
        }
        Some(rbac::forbidden(&user, &attributes))
    }

    fn route(&self, call: &Call) -> Response<Body> {
        if call.method == Method::GET {
            let kinds = self.store.lock().kinds();
            let minor = self.minor_version.lock().unwrap_or(discovery::MINOR_VERSION);
            if let Some(response) = discovery::answer(&call.path, &kinds, minor) {
                return response;
            }
        }
        match parse_path(&call.path) {
            Some(target) if call.method == Method::POST && target.name.is_none() && is_review(&target) => {
                self.review(call, &target)
            }
            Some(target) if target.subresource.as_deref() == Some("token") => self.token_request(call, target),
            Some(target) => self.answer(call, target),
            None => status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find {}", call.path)),
        }
    }

    async fn proxy(
        &self,
        target: pod_proxy::ProxyTarget,
        call: Call,
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let pods = crate::kinds::Resource { api_version: "v1".into(), plural: "pods".into() };
        let backend = {
            let store = self.store.lock();
            match target.via {
                pod_proxy::Via::Pod => {
                    let pod = store.get(&pods, &(target.namespace.clone(), target.name.clone()));
                    let ip = pod.and_then(|p| p["status"]["podIP"].as_str()).and_then(|ip| ip.parse().ok());
                    let port = target.port.parse().ok();
                    ip.zip(port).ok_or_else(|| format!("pods {:?} not found or without an IP", target.name))
                }
                pod_proxy::Via::Service => {
                    let services = crate::kinds::Resource { api_version: "v1".into(), plural: "services".into() };
                    match store.get(&services, &(target.namespace.clone(), target.name.clone())) {
                        None => Err(format!("services {:?} not found", target.name)),
                        Some(service) => {
                            let in_namespace: Vec<Value> = store
                                .objects
                                .get(&pods)
                                .into_iter()
                                .flatten()
                                .filter(|((namespace, _), _)| *namespace == target.namespace)
                                .map(|(_, pod)| pod.clone())
                                .collect();
                            pod_proxy::service_backend(service, &in_namespace, &target.port)
                                .map_err(|why| format!("services {:?}: {why}", target.name))
                        }
                    }
                }
            }
        };
        let (ip, port) = match backend {
            Ok(backend) => backend,
            Err(why) => return status(StatusCode::NOT_FOUND, "NotFound", why),
        };
        let query = query.filter(|q| !q.is_empty());
        pod_proxy::forward(ip, port, &target, call.method, query, headers, body).await
    }

    fn review(&self, call: &Call, target: &Target) -> Response<Body> {
        let user = self.rbac_user(call.authorization.as_deref());
        let status_of = match (target.resource.plural.as_str(), user) {
            ("tokenreviews", _) => self.tokens.lock().review(&call.body),
            // Held to RBAC: the caller's roles answer.
            (_, Some(user)) => {
                match Attributes::of_review(&call.body["spec"]) {
                    Some(asked) if !rbac::allows(&self.store.lock(), &user, &asked) => {
                        json!({"allowed": false, "reason": asked.forbidden_message(&user)})
                    }
                    Some(_) => json!({"allowed": true, "reason": "allowed by the caller's roles"}),
                    // Non-resource URLs (discovery) are open to every authenticated caller.
                    None => json!({"allowed": true, "reason": "non-resource URLs are open to every caller"}),
                }
            }
            // RBAC not enforced: every caller may do everything beyond the token.
            (_, None) => json!({"allowed": true, "reason": "the in-process API server authorizes every request"}),
        };
        let mut review = call.body.clone();
        review["status"] = status_of;
        json_response(StatusCode::CREATED, review)
    }

    fn token_request(&self, call: &Call, target: Target) -> Response<Body> {
        let (Some(namespace), Some(name)) = (target.namespace, target.name) else {
            return status(StatusCode::NOT_FOUND, "NotFound", "a token is requested for a service account");
        };
        if call.method != Method::POST || target.resource.plural != "serviceaccounts" {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "only POST of serviceaccounts/<name>/token",
            );
        }
        let audiences: Vec<String> = call.body["spec"]["audiences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect();
        let uid = {
            let store = self.store.lock();
            let Some(account) = store.get(&target.resource, &(namespace.clone(), name.clone())) else {
                return status(StatusCode::NOT_FOUND, "NotFound", format!("serviceaccounts {name:?} not found"));
            };
            account["metadata"]["uid"].as_str().unwrap_or_default().to_string()
        };
        let token = match self.tokens.lock().issue(&namespace, &name, &uid, audiences.clone()) {
            Ok(token) => token,
            Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
        };
        json_response(
            StatusCode::CREATED,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"audiences": audiences},
                "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}),
        )
    }

    fn answer(&self, call: &Call, target: Target) -> Response<Body> {
        let Target { resource, namespace, name, subresource } = target;
        let mut store = self.store.lock();
        let Some(name) = name else {
            return match call.method {
                Method::GET if call.is_watch() => watch::open(&mut store, call, resource, namespace),
                Method::GET => {
                    let kinds = store.kinds();
                    let list_kind = crate::kinds::kind_of(&kinds, &resource)
                        .map_or_else(|| "List".to_string(), |k| format!("{}List", k.kind));
                    list::answer(&store, call, &resource, namespace.as_deref(), list_kind)
                }
                Method::POST => {
                    let mut body = call.body.clone();
                    let name = match (body["metadata"]["name"].as_str(), body["metadata"]["generateName"].as_str()) {
                        (Some(name), _) => name.to_string(),
                        // As the API server: the prefix and a suffix unique in this server.
                        (None, Some(prefix)) => format!("{prefix}{:05x}", store.version + 1),
                        (None, None) => String::new(),
                    };
                    if !name.is_empty() {
                        body["metadata"]["name"] = json!(name);
                    }
                    let key = (namespace.clone().unwrap_or_default(), name.clone());
                    if let Err(why) = store.check_body(&body, &resource, &key) {
                        return status(StatusCode::BAD_REQUEST, "BadRequest", why);
                    }
                    if store.get(&resource, &key).is_some() {
                        return status(
                            StatusCode::CONFLICT,
                            "AlreadyExists",
                            format!("{} {name:?} already exists", resource.plural),
                        );
                    }
                    let object = store.server_fields(&resource, None, body);
                    json_response(StatusCode::CREATED, store.commit(&resource, key, object, "ADDED"))
                }
                _ => status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!("{} on a collection", call.method),
                ),
            };
        };
        let key = (namespace.unwrap_or_default(), name.clone());
        let not_found = || status(StatusCode::NOT_FOUND, "NotFound", format!("{} {name:?} not found", resource.plural));
        let existing = store.get(&resource, &key).cloned();
        match (&call.method, subresource.as_deref()) {
            (&Method::GET, None | Some("status")) => {
                existing.map_or_else(not_found, |o| json_response(StatusCode::OK, o))
            }
            (&Method::DELETE, None) => match existing {
                Some(object) => json_response(StatusCode::OK, store.commit(&resource, key, object, "DELETED")),
                None => not_found(),
            },
            (&Method::PUT, None | Some("status")) => {
                let Some(old) = existing else { return not_found() };
                if let Err(why) = store.check_body(&call.body, &resource, &key) {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", why);
                }
                if store::is_stale(&call.body, Some(&old)) {
                    return status(StatusCode::CONFLICT, "Conflict", format!("the object {name:?} has been modified"));
                }
                let mut object = store.server_fields(&resource, Some(&old), call.body.clone());
                // A write of the object leaves its status alone, and the reverse.
                if subresource.is_some() {
                    let status = object["status"].take();
                    object = old.clone();
                    object["status"] = status;
                } else if !old["status"].is_null() {
                    object["status"] = old["status"].clone();
                }
                json_response(StatusCode::OK, store.write(&resource, key, &old, object))
            }
            (&Method::PATCH, None | Some("status")) if call.content_type.starts_with(APPLY_PATCH) => {
                apply::apply(&mut store, call, &resource, key, existing, subresource.is_some())
            }
            (&Method::PATCH, None | Some("status"))
                if call.content_type.starts_with(MERGE_PATCH) || call.content_type.starts_with(STRATEGIC_PATCH) =>
            {
                let Some(old) = existing else { return not_found() };
                // A patch carrying a resourceVersion is a compare-and-swap, as on a real server.
                if store::is_stale(&call.body, Some(&old)) {
                    return status(StatusCode::CONFLICT, "Conflict", format!("the object {name:?} has been modified"));
                }
                let mut object = old.clone();
                let mut body = call.body.clone();
                match subresource {
                    Some(_) => body = json!({"status": body["status"].take()}),
                    None => {
                        if let Some(p) = body.as_object_mut() {
                            p.remove("status");
                        }
                    }
                }
                if call.content_type.starts_with(STRATEGIC_PATCH) {
                    patch::strategic_merge(&mut object, &body);
                } else {
                    patch::merge(&mut object, &body);
                }
                json_response(StatusCode::OK, store.write(&resource, key, &old, object))
            }
            (&Method::PATCH, None | Some("status")) if call.content_type.starts_with(JSON_PATCH) => {
                let Some(old) = existing else { return not_found() };
                let mut object = old.clone();
                if let Err(why) = patch::json_patch(&mut object, &call.body) {
                    return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", why);
                }
                // A write of the object leaves its status alone, and the reverse.
                if subresource.is_some() {
                    let status = object["status"].take();
                    object = old.clone();
                    object["status"] = status;
                } else {
                    object["status"] = old["status"].clone();
                }
                if let Err(why) = store.check_body(&object, &resource, &key) {
                    return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", why);
                }
                json_response(StatusCode::OK, store.write(&resource, key, &old, object))
            }
            (&Method::PATCH, _) => status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {}", call.content_type),
            ),
            _ => not_found(),
        }
    }
}

fn is_review(target: &Target) -> bool {
    matches!(target.resource.plural.as_str(), "tokenreviews" | "selfsubjectaccessreviews")
}
