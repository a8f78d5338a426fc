use std::sync::Arc;

use super::*;
use crate::model::{Resource, is_probe_route, suffix};

fn authz(name: &str, nets: &[&str], except: &[&str], authn: Authn) -> Authz {
    Authz {
        meta: Resource::new("policy.cnimesh.io", "authorizationpolicy", name),
        networks: nets
            .iter()
            .map(|n| Network { net: n.parse().unwrap(), except: except.iter().map(|e| e.parse().unwrap()).collect() })
            .collect(),
        authn,
    }
}

fn ids(list: &[&str], suffixes: &[&str]) -> Authn {
    Authn::MeshTls {
        identities: list.iter().map(|s| Arc::from(*s)).collect(),
        suffixes: suffixes.iter().map(|s| Arc::from(*s)).collect(),
    }
}

fn client<'a>(ip: &str, identity: Option<&'a str>) -> Client<'a> {
    Client { ip: ip.parse().unwrap(), identity }
}

const WEB: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";
const OTHER: &str = "other.shop.serviceaccount.identity.cnimesh.cluster.local";

#[test]
fn identities_networks_and_exceptions() {
    let list = vec![
        authz("web-only", &["0.0.0.0/0", "::/0"], &[], ids(&[WEB], &[])),
        authz("office", &["10.1.0.0/16"], &["10.1.9.0/24"], Authn::Unauthenticated),
    ];
    let name = |c| authorized(&list, c).map(|a| &*a.meta.name);
    assert_eq!(name(client("10.2.0.1", Some(WEB))), Some("web-only"));
    assert_eq!(name(client("10.2.0.1", Some(OTHER))), None, "another identity");
    assert_eq!(name(client("10.2.0.1", None)), None, "plaintext");
    assert_eq!(name(client("10.1.2.3", None)), Some("office"), "the CIDR admits plaintext");
    assert_eq!(name(client("::ffff:10.1.2.3", None)), Some("office"), "IPv4-mapped");
    assert_eq!(name(client("10.1.9.3", Some(OTHER))), None, "except");
    assert_eq!(name(client("::ffff:10.1.9.3", Some(OTHER))), None, "except, IPv4-mapped");
    assert_eq!(authorized(&[], client("10.1.2.3", Some(WEB))).map(|a| &*a.meta.name), None, "empty: deny");
}

#[test]
fn suffixes() {
    let any = ids(&[], &[""]);
    assert!(any.permits(Some(OTHER)));
    assert!(!any.permits(None), "any identity is still an identity");
    let shop = ids(&[], &[".shop.serviceaccount.identity.cnimesh.cluster.local"]);
    assert!(shop.permits(Some(WEB)));
    assert!(shop.permits(Some("shop.serviceaccount.identity.cnimesh.cluster.local")), "the suffix itself");
    assert!(!shop.permits(Some("web.shopx.serviceaccount.identity.cnimesh.cluster.local")));
    assert!(!shop.permits(Some("evil-shop.serviceaccount.identity.cnimesh.cluster.local")));
    assert_eq!(&*suffix(&["shop", "serviceaccount"]), ".shop.serviceaccount");
    assert_eq!(&*suffix::<&str>(&[]), "", "no labels: every identity");
}

#[test]
fn each_refusal_is_explained_and_the_decision_is_the_one_authorized_makes() {
    let list = vec![
        authz("web-only", &["0.0.0.0/0"], &[], ids(&[WEB], &[])),
        authz("office", &["10.1.0.0/16"], &[], Authn::Unauthenticated),
        authz("anyone-meshed", &["0.0.0.0/0", "::/0"], &[], ids(&[], &[""])),
    ];
    let d = decide(&list, None, Some("192.0.2.1".parse().unwrap()));
    assert_eq!(
        d,
        Decision {
            allowed_by: None,
            refused: vec![(0, Refusal::NeedsMeshTls), (1, Refusal::AddressOutside), (2, Refusal::NeedsMeshTls)],
        }
    );
    let d = decide(&list, Some(OTHER), Some("192.0.2.1".parse().unwrap()));
    assert_eq!(
        d,
        Decision { allowed_by: Some(2), refused: vec![(0, Refusal::IdentityNotListed), (1, Refusal::AddressOutside)] }
    );
    assert_eq!(decide(&list, None, None).allowed_by, Some(1), "an unknown address is not checked");
    for (ip, id) in [("10.1.0.1", None), ("::ffff:10.1.0.1", None), ("192.0.2.1", Some(WEB)), ("192.0.2.1", None)] {
        let c = client(ip, id);
        let by = authorized(&list, c).map(|a| &*a.meta.name);
        assert_eq!(decide(&list, id, Some(c.ip)).allowed_by.map(|i| &*list[i].meta.name), by, "{ip} {id:?}");
    }
}

#[test]
fn routes_by_path_and_method() {
    let route = |name: &str, path: PathMatch, method: Option<http::Method>| Route {
        meta: Resource::new("", "default", name),
        matches: vec![RouteMatch { path, method }],
        authorizations: Vec::new(),
    };
    let routes = vec![
        route("probe", PathMatch::Exact("/ready".into()), Some(http::Method::GET)),
        route("api", PathMatch::Prefix("/api/".into()), None),
        route("default", PathMatch::Any, None),
    ];
    let get = http::Method::GET;
    assert_eq!(route_for(&routes, &get, "/ready"), Some(0));
    assert_eq!(route_for(&routes, &http::Method::POST, "/ready"), Some(2), "method");
    assert_eq!(route_for(&routes, &get, "/ready/x"), Some(2), "exact");
    assert_eq!(route_for(&routes, &get, "/api"), Some(1));
    assert_eq!(route_for(&routes, &get, "/api/v1"), Some(1));
    assert_eq!(route_for(&routes, &get, "/apix"), Some(2), "whole segments");
    assert_eq!(route_for(&routes[..2], &get, "/x"), None);
}

#[test]
fn a_route_without_authorizations_is_held_to_the_servers() {
    let server = vec![authz("office", &["10.1.0.0/16"], &[], Authn::Unauthenticated)];
    let mut route = Route { meta: Resource::new("", "default", "default"), matches: vec![], authorizations: vec![] };
    assert_eq!(route.authorizations_or(&server), &server[..]);
    route.authorizations = vec![authz("probe", &["0.0.0.0/0"], &[], Authn::Unauthenticated)];
    assert_eq!(&*route.authorizations_or(&server)[0].meta.name, "probe");
}

#[test]
fn the_probe_route_is_known_by_its_kind_and_name() {
    assert!(is_probe_route(&Resource::new("", "default", "probe")));
    assert!(!is_probe_route(&Resource::new("gateway.networking.k8s.io", "default", "probe")));
    assert!(!is_probe_route(&Resource::new("", "httproute", "probe")));
}
