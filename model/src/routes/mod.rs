//! Routes (control side): Gateway API `HTTPRoute` and `GRPCRoute` attached to Services
//! (the GAMMA mesh profile), served to proxies inside `OutboundPolicies` answers.
//!
//! Flow, as for policy: the source reads HTTPRoutes, GRPCRoutes and ReferenceGrants (kube
//! watchers) into the outbound index (`crate::outbound`),
//! which validates each ([`model`]) and keeps, per watched parent, the routes attached to it
//! ([`routes_of`]) on a `tokio::sync::watch` channel; `cnimesh_control::grpc::outbound` turns them into
//! linkerd2-proxy-api routes.
//!
//! Layer: model/index (pure): [`crd`] (the Gateway API types), [`model`] (validated records) and
//! the per-Service selection below.

pub mod crd;
pub mod model;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use model::{Grant, Route, RouteKind};

use crate::meta::NsName;

/// The routes attached to one Service, in precedence order.
pub type ServiceRoutes = Arc<Vec<Arc<Route>>>;

/// The routes attached to `service` (on any port), ordered as the Gateway API orders routes and
/// Linkerd's policy controller sends them: the oldest first, then by namespace and name. (Among
/// the rules of all routes, the proxy then picks the most specific match, ties going to the
/// earlier route.) A route sending traffic to a Service of another namespace without a
/// ReferenceGrant there is left out whole, and said so in the log.
pub fn routes_of(
    service: &NsName,
    routes: &BTreeMap<(RouteKind, NsName), Arc<Route>>,
    grants: &BTreeMap<NsName, Grant>,
) -> Vec<Arc<Route>> {
    let mut attached: Vec<Arc<Route>> = routes
        .values()
        .filter(|r| r.parents.iter().any(|p| p.service == *service))
        .filter(|r| match r.foreign_backends().find(|b| !granted(r, &b.service, grants)) {
            None => true,
            Some(backend) => {
                tracing::error!(
                    kind = r.kind.as_str(),
                    route = %r.key,
                    backend = %backend.service,
                    reason = "no ReferenceGrant in the backend's namespace allows it",
                    "route not served"
                );
                false
            }
        })
        .cloned()
        .collect();
    attached.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
    attached
}

fn granted(route: &Route, backend: &NsName, grants: &BTreeMap<NsName, Grant>) -> bool {
    grants
        .range(NsName::new(&backend.namespace, "")..)
        .take_while(|(k, _)| k.namespace == backend.namespace)
        .any(|(_, g)| g.permits(route.kind, &route.key.namespace, &backend.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, created: Option<&str>, backend_ns: &str) -> Arc<Route> {
        let created = created.map(|c| format!(", creationTimestamp: '{c}'")).unwrap_or_default();
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: shop{created}}}\nspec:\n  parentRefs: [{{group: '', kind: Service, name: api}}]\n  rules: [{{backendRefs: [{{name: api-v2, namespace: {backend_ns}, port: 80}}]}}]\n"
        );
        Arc::new(Route::from_http(&serde_saphyr::from_str(&text).unwrap()).unwrap())
    }

    #[test]
    fn oldest_first_then_by_name_and_foreign_backends_need_a_grant() {
        let mut routes = BTreeMap::new();
        for r in [
            route("b", Some("2026-01-01T00:00:00Z"), "shop"),
            route("a", Some("2026-01-02T00:00:00Z"), "shop"),
            route("c", Some("2026-01-01T00:00:00Z"), "shop"),
            route("foreign", None, "canary"),
        ] {
            routes.insert((r.kind, r.key.clone()), r);
        }
        let api = NsName::new("shop", "api");
        let names = |grants: &BTreeMap<NsName, Grant>| {
            routes_of(&api, &routes, grants).iter().map(|r| r.key.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&BTreeMap::new()), ["b", "c", "a"]);
        let grant: crd::ReferenceGrant = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: canary}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]\n  to: [{group: '', kind: Service}]\n",
        )
        .unwrap();
        let grants = BTreeMap::from([(NsName::new("canary", "g"), Grant::from_crd(&grant))]);
        // No timestamp sorts before any (as Option does): a route not yet stored by the API.
        assert_eq!(names(&grants), ["foreign", "b", "c", "a"]);
        assert!(routes_of(&NsName::new("shop", "other"), &routes, &grants).is_empty());
    }

    /// The fuzz seeds of the Kubernetes source's object reading (fuzz/corpus/control_kube_objects):
    /// each route reads as its kind and validates, as the Gateway API's own examples should.
    #[test]
    fn the_fuzz_seeds_routes_read_and_validate() {
        let seed = |name: &str| {
            let path = format!("{}/../fuzz/corpus/control_kube_objects/{name}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let http: crd::HttpRoute = serde_json::from_str(&seed("httproute-api-canary.json")).unwrap();
        assert_eq!(Route::from_http(&http).unwrap().rules.len(), 2);
        let grpc: crd::GrpcRoute = serde_json::from_str(&seed("grpcroute-items.json")).unwrap();
        assert_eq!(Route::from_grpc(&grpc).unwrap().rules.len(), 1);
        let grant: crd::ReferenceGrant = serde_json::from_str(&seed("referencegrant-shop-routes.json")).unwrap();
        assert!(Grant::from_crd(&grant).permits(RouteKind::Http, "shop", "api-v2"));
    }
}
