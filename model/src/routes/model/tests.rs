//! Routes read into records, and refused with the reason.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::meta::{Invalid, NsName};

fn http(text: &str) -> Result<Route, Invalid> {
    Route::from_http(&serde_saphyr::from_str::<crd::HttpRoute>(text).expect("parses"))
}

fn grpc(text: &str) -> Result<Route, Invalid> {
    Route::from_grpc(&serde_saphyr::from_str::<crd::GrpcRoute>(text).expect("parses"))
}

const HEAD: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\n";

fn route(spec: &str) -> Result<Route, Invalid> {
    http(&format!("{HEAD}spec:\n  parentRefs: [{{group: '', kind: Service, name: api, port: 80}}]\n{spec}"))
}

#[test]
fn a_full_route_is_read() {
    let r = route(
        r#"  hostnames: [api.shop, "*.example.com"]
  rules:
  - matches:
    - path: {type: Exact, value: /v1/items}
      method: GET
      headers: [{name: X-Canary, value: "1"}, {type: RegularExpression, name: x-user, value: "^a.*"}]
      queryParams: [{name: page, value: "2"}]
    - path: {type: RegularExpression, value: "^/v[0-9]+/"}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {add: [{name: x-a, value: b}], set: [{name: x-s, value: t}], remove: [x-r]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {remove: [server]}
    - type: URLRewrite
      urlRewrite: {hostname: api.internal}
    backendRefs:
    - {name: api, port: 80, weight: 90}
    - {name: api-canary, port: 8080, weight: 10, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-canary, value: "1"}]}}]}
    timeouts: {request: 10s, backendRequest: 1m0s}
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}, statusCode: 301}}]
"#,
    );
    let error = r.unwrap_err();
    assert!(error.0.contains("rules[0]: timeouts.backendRequest is longer"), "{error}");
    let r = route(
        r#"  hostnames: [api.shop, "*.example.com"]
  rules:
  - matches:
    - path: {type: Exact, value: /v1/items}
      method: GET
      headers: [{name: X-Canary, value: "1"}, {type: RegularExpression, name: x-user, value: "^a.*"}]
      queryParams: [{name: page, value: "2"}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: api.internal}
    backendRefs:
    - {name: api, port: 80, weight: 90}
    - {name: api-canary, namespace: canary, port: 8080, weight: 10}
    timeouts: {request: 10s, backendRequest: 500ms}
    retry: {codes: [500, 502, 503, 504], attempts: 3, backoff: 100ms}
"#,
    )
    .unwrap();
    assert_eq!(r.parents, [Parent { service: NsName::new("shop", "api"), port: Some(80) }]);
    assert_eq!(r.hostnames, [HostMatch::Exact("api.shop".into()), HostMatch::Suffix("example.com".into())]);
    let rule = &r.rules[0];
    let Matches::Http(m) = &rule.matches else { panic!() };
    assert_eq!(m[0].path, Some(PathMatch::Exact("/v1/items".into())));
    assert_eq!(m[0].method, Some(::http::Method::GET));
    assert_eq!(m[0].headers[0].name, "x-canary", "header names are lowercase");
    assert_eq!(
        rule.filters,
        [Filter::RequestHeaders(HeaderModifier {
            set: vec![("host".into(), "api.internal".into())],
            ..HeaderModifier::default()
        })]
    );
    assert_eq!(rule.backends[1].service, NsName::new("canary", "api-canary"));
    assert_eq!(r.foreign_backends().count(), 1);
    assert_eq!(rule.timeouts.request, Some(Duration::from_secs(10)));
    assert_eq!(rule.timeouts.backend_request, Some(Duration::from_millis(500)));
    let retry = rule.retry.as_ref().unwrap();
    assert_eq!((retry.limit, retry.backoff), (3, Some(Duration::from_millis(100))));
    assert_eq!(retry.conditions, RetryConditions::Http(vec![500..=500, 502..=504]));
    assert!(r.attaches_to(&NsName::new("shop", "api"), 80));
    assert!(!r.attaches_to(&NsName::new("shop", "api"), 81));
}

#[test]
fn defaults_and_annotations() {
    let r = http(&format!(
            "{}spec:\n  parentRefs: [{{group: core, kind: Service, name: api}}, {{name: gw}}]\n",
            HEAD.replace(
                "namespace: shop",
                "namespace: shop, annotations: {retry.cnimesh.io/http: '5xx,429,500-504', retry.cnimesh.io/timeout: 300ms, timeout.cnimesh.io/request: 2s}"
            )
        ))
        .unwrap();
    assert_eq!(r.parents.len(), 1, "the Gateway parent is not ours");
    let rule = &r.rules[0];
    assert_eq!(
        rule.matches,
        Matches::Http(vec![HttpMatch { path: Some(PathMatch::Prefix("/".into())), ..HttpMatch::default() }])
    );
    assert!(rule.backends.is_empty(), "no backendRefs: the parent Service");
    assert_eq!(rule.timeouts.request, Some(Duration::from_secs(2)));
    assert_eq!(
        rule.retry,
        Some(Retry {
            limit: 1,
            conditions: RetryConditions::Http(vec![500..=599, 429..=429, 500..=504]),
            timeout: Some(Duration::from_millis(300)),
            backoff: None,
        })
    );
    let g = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop, annotations: {retry.cnimesh.io/grpc: 'unavailable,internal', retry.cnimesh.io/limit: '4'}}\nspec:\n  parentRefs: [{group: '', kind: Service, name: api}]\n  rules:\n  - matches: [{method: {service: shop.Items, method: Get}}]\n    backendRefs: [{name: api, port: 9090}]\n",
        )
        .unwrap();
    let Matches::Grpc(m) = &g.rules[0].matches else { panic!() };
    assert_eq!((m[0].service.as_deref(), m[0].method.as_deref()), (Some("shop.Items"), Some("Get")));
    let retry = g.rules[0].retry.as_ref().unwrap();
    assert_eq!(retry.limit, 4);
    assert_eq!(
        retry.conditions,
        RetryConditions::Grpc(GrpcConditions { internal: true, unavailable: true, ..GrpcConditions::default() })
    );
}

#[test]
fn a_services_annotations_fill_what_its_routes_leave_unset() {
    let meta = |annotations: &[(&str, &str)]| ObjectMeta {
        annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..ObjectMeta::default()
    };
    let service = ServiceDefaults::from_annotations(&meta(&[
        (RETRY_HTTP_ANNOTATION, "gateway-error"),
        (RETRY_GRPC_ANNOTATION, "unavailable"),
        (RETRY_LIMIT_ANNOTATION, "2"),
        (REQUEST_TIMEOUT_ANNOTATION, "3s"),
    ]))
    .unwrap();
    let http_retry = service.of(RouteKind::Http).retry.clone().unwrap();
    assert_eq!((http_retry.limit, &http_retry.conditions), (2, &RetryConditions::Http(vec![502..=504])));
    let grpc = GrpcConditions { unavailable: true, ..GrpcConditions::default() };
    assert_eq!(service.of(RouteKind::Grpc).retry.as_ref().unwrap().conditions, RetryConditions::Grpc(grpc));
    assert_eq!(service.http.request_timeout, Some(Duration::from_secs(3)));
    assert_eq!(ServiceDefaults::from_annotations(&ObjectMeta::default()).unwrap(), ServiceDefaults::default());
    let bad = ServiceDefaults::from_annotations(&meta(&[(RETRY_LIMIT_ANNOTATION, "lots")])).unwrap_err();
    assert!(bad.0.contains(RETRY_LIMIT_ANNOTATION), "{bad}");

    // A route without retries or timeouts takes the Service's; one with its own keeps them.
    let plain = route("  rules: [{}]\n").unwrap();
    let filled = plain.rules[0].with_defaults(&service.http);
    assert_eq!((filled.retry.as_ref(), filled.timeouts.request), (Some(&http_retry), Some(Duration::from_secs(3))));
    let own = http(&format!(
        "{}spec:\n  parentRefs: [{{group: '', kind: Service, name: api}}]\n",
        HEAD.replace(
            "namespace: shop",
            "namespace: shop, annotations: {retry.cnimesh.io/http: '503', timeout.cnimesh.io/request: 1s}"
        )
    ))
    .unwrap();
    let kept = own.rules[0].with_defaults(&service.http);
    assert!(matches!(kept, std::borrow::Cow::Borrowed(_)), "nothing to fill");
    let retry = kept.retry.as_ref().unwrap();
    assert_eq!((retry.limit, &retry.conditions), (1, &RetryConditions::Http(vec![503..=503])), "the route's, whole");
    assert_eq!(kept.timeouts.request, Some(Duration::from_secs(1)));
    let timeout_only = route("  rules: [{timeouts: {request: 5s}}]\n").unwrap();
    let mixed = timeout_only.rules[0].with_defaults(&service.http);
    assert_eq!((mixed.retry.as_ref(), mixed.timeouts.request), (Some(&http_retry), Some(Duration::from_secs(5))));
}

#[test]
fn bad_routes_are_refused_with_the_reason() {
    let cases = [
        ("  rules: [{matches: [{path: {type: RegularExpression, value: '(['}}]}]\n", "path regular expression"),
        ("  rules: [{matches: [{path: {type: Exact, value: items}}]}]\n", "does not start with /"),
        ("  rules: [{matches: [{path: {type: Glob, value: /a}}]}]\n", "path match type \"Glob\""),
        ("  rules: [{matches: [{method: FETCH}]}]\n", "method \"FETCH\""),
        ("  rules: [{matches: [{headers: [{name: 'a b', value: x}]}]}]\n", "not an HTTP header name"),
        ("  rules: [{filters: [{type: RequestMirror}]}]\n", "filter type \"RequestMirror\" is not supported"),
        ("  rules: [{filters: [{type: ExtensionRef}]}]\n", "filter type \"ExtensionRef\""),
        ("  rules: [{filters: [{type: RequestHeaderModifier}]}]\n", "has no requestHeaderModifier"),
        (
            "  rules: [{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /x}}}]}]\n",
            "URLRewrite of the path",
        ),
        (
            "  rules: [{timeouts: {request: 10 seconds}}]\n",
            "timeouts.request: \"10 seconds\" is not a Gateway API duration",
        ),
        ("  rules: [{timeouts: {request: 1.5s}}]\n", "not a Gateway API duration"),
        ("  rules: [{backendRefs: [{name: api}]}]\n", "backendRef api has no port"),
        (
            "  rules: [{backendRefs: [{name: x, kind: ServiceImport, group: multicluster.x-k8s.io, port: 80}]}]\n",
            "only Services",
        ),
        ("  rules: [{backendRefs: [{name: api, port: 80, weight: -1}]}]\n", "weight -1"),
        ("  rules: [{retry: {codes: [200]}}]\n", "retry.codes: 200"),
        (
            "  rules: [{matches: [{path: {type: Exact, value: /a}}], filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]\n",
            "ReplacePrefixMatch needs",
        ),
        ("  rules: [{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 200}}]}]\n", "statusCode 200"),
        ("  hostnames: [Not_A_Host]\n", "hostname \"Not_A_Host\""),
        ("  rules: [{backendRefs: [{name: api, port: 80, weight: 0}], retry: {attempts: -2}}]\n", "retry.attempts -2"),
    ];
    for (spec, reason) in cases {
        let error = route(spec).expect_err(spec);
        assert!(error.0.contains(reason), "{spec}: {error}");
    }
    let annotated = |a: &str| {
        http(&format!(
            "{}spec: {{}}\n",
            HEAD.replace("namespace: shop", &format!("namespace: shop, annotations: {{{a}}}"))
        ))
    };
    assert!(annotated("retry.cnimesh.io/http: 6xx").unwrap_err().0.contains("annotation retry.cnimesh.io/http"));
    assert!(annotated("retry.cnimesh.io/limit: many").unwrap_err().0.contains("retry.cnimesh.io/limit"));
    assert!(annotated("timeout.cnimesh.io/request: 5").unwrap_err().0.contains("timeout.cnimesh.io/request"));
    let section =
        http(&format!("{HEAD}spec: {{parentRefs: [{{group: '', kind: Service, name: api, sectionName: http}}]}}\n"));
    assert!(section.unwrap_err().0.contains("sectionName \"http\" is not supported"));
    let grpc_error = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  rules: [{matches: [{method: {type: RegularExpression, service: 'shop\\..*'}}]}]\n",
        )
        .unwrap_err();
    assert!(grpc_error.0.contains("only Exact"), "{grpc_error}");
    let grpc_error = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  rules: [{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {}}]}]\n",
        )
        .unwrap_err();
    assert!(grpc_error.0.contains("on a GRPCRoute"), "{grpc_error}");
}

#[test]
fn gateway_durations() {
    assert_eq!(duration("1h30m").unwrap(), Some(Duration::from_secs(5400)));
    assert_eq!(duration("500ms").unwrap(), Some(Duration::from_millis(500)));
    assert_eq!(duration("1m1s1ms").unwrap(), Some(Duration::from_millis(61_001)));
    assert_eq!(duration("0s").unwrap(), None, "zero: no timeout");
    for bad in ["", "s", "10", "1.5s", "123456s", "1h1h1h1h1h", "-1s", "1 s", "1d"] {
        assert!(duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn reference_grants() {
    let grant: crd::ReferenceGrant = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: canary}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}, {group: gateway.networking.k8s.io, kind: Gateway, namespace: edge}]\n  to: [{group: '', kind: Service, name: api-canary}]\n",
        )
        .unwrap();
    let grant = Grant::from_crd(&grant);
    assert!(grant.permits(RouteKind::Http, "shop", "api-canary"));
    assert!(!grant.permits(RouteKind::Grpc, "shop", "api-canary"));
    assert!(!grant.permits(RouteKind::Http, "edge", "api-canary"));
    assert!(!grant.permits(RouteKind::Http, "shop", "db"));
}
