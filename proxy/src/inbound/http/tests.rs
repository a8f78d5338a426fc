//! The inbound decision as a table: a connection (its client's identity, the port's policy),
//! a request, and what the decision is (forwarded, with the headers and path the app gets, or
//! the proxy's own answer and why).

use http::StatusCode;

use super::*;
use crate::http::headers::GATEWAY_CLIENT_ID;
use crate::inbound::policy::discover::PortWatch;
use crate::inbound::policy::model::DefaultPolicy;
use crate::serve::metrics::Metrics;
use cnimesh_identity::Name;

const TRUST_DOMAIN: &str = "cluster.local";

fn name(sa: &str, ns: &str, trust_domain: &str) -> Name {
    Name::for_service_account(sa, ns, trust_domain).unwrap()
}

fn gateway() -> Name {
    name(cnimesh_common::names::GATEWAY_NAME, cnimesh_common::names::MULTICLUSTER_NAMESPACE, TRUST_DOMAIN)
}

/// A connection of a client that proved `client` (plaintext without), under `policy`.
fn conn(client: Option<&Name>, policy: Option<DefaultPolicy>) -> InboundHttp {
    let tls = TlsLabel { tls: client.is_some(), client_id: client.map(|c| c.as_str().to_string()), server_id: None };
    let policy = policy.map(|p| {
        Arc::new(ConnPolicy::new(
            PortWatch::fixed(Arc::new(p.policy(&[]))),
            "10.0.0.1".parse().unwrap(),
            tls.clone(),
            "10.0.0.2:80".into(),
            Arc::new(Metrics::default().authz.clone()),
        ))
    });
    let own = name("web", "shop", TRUST_DOMAIN);
    InboundHttp::new(&tls, policy, Some(&own))
}

/// What a decision came to, comparable in a table.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Forwarded: the path and `l5d-client-id` the app gets, and whether it is held to a
    /// forwarded workload's policy.
    Forward {
        path: String,
        client_id: Option<String>,
        forwarded: bool,
    },
    Answer(AnswerKind, StatusCode),
}

fn outcome(conn: &InboundHttp, mut req: Request<()>) -> Outcome {
    match conn.decide(&mut req) {
        Decision::Forward(a) => Outcome::Forward {
            path: req.uri().to_string(),
            client_id: req.headers().get("l5d-client-id").map(|v| v.to_str().unwrap().to_string()),
            forwarded: a.forwarded.is_some(),
        },
        Decision::Answer(answer) => Outcome::Answer(answer.kind, answer.status()),
    }
}

#[test]
fn each_inbound_request_is_forwarded_or_answered_as_the_table_says() {
    let client = name("app", "shop", TRUST_DOMAIN);
    let remote = name("app", "shop", "east.example");
    let forward = |path: &str, client_id: Option<&Name>, forwarded| Outcome::Forward {
        path: path.into(),
        client_id: client_id.map(|c| c.as_str().to_string()),
        forwarded,
    };
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut req = Request::get(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(()).unwrap()
    };
    use AnswerKind::*;
    use DefaultPolicy::*;
    let table: Vec<(&str, InboundHttp, Request<()>, Outcome)> = vec![
        (
            "without policy, a plaintext client's own l5d-client-id is removed",
            conn(None, None),
            get("/a", &[("l5d-client-id", client.as_str())]),
            forward("/a", None, false),
        ),
        (
            "an mTLS client's l5d-client-id is the identity it proved",
            conn(Some(&client), None),
            get("/a", &[("l5d-client-id", "someone.else")]),
            forward("/a", Some(&client), false),
        ),
        (
            "without policy, the path is left as sent",
            conn(None, None),
            get("/a/../b", &[]),
            forward("/a/../b", None, false),
        ),
        (
            "under policy, the path is normalized, its query kept",
            conn(None, Some(AllUnauthenticated)),
            get("/a/./b/../c?x=1", &[]),
            forward("/a/c?x=1", None, false),
        ),
        (
            "under policy, a path servers read differently is refused",
            conn(None, Some(AllUnauthenticated)),
            get("/a%2fb", &[]),
            Outcome::Answer(Malformed, StatusCode::BAD_REQUEST),
        ),
        (
            "a denying policy refuses",
            conn(None, Some(Deny)),
            get("/a", &[]),
            Outcome::Answer(Policy, StatusCode::FORBIDDEN),
        ),
        (
            "a policy for meshed clients refuses a plaintext one",
            conn(None, Some(AllAuthenticated)),
            get("/a", &[]),
            Outcome::Answer(Policy, StatusCode::FORBIDDEN),
        ),
        (
            "a policy for meshed clients admits an mTLS one",
            conn(Some(&client), Some(AllAuthenticated)),
            get("/a", &[]),
            forward("/a", Some(&client), false),
        ),
        (
            "the gateway's request without the workload it forwards for is refused",
            conn(Some(&gateway()), None),
            get("/a", &[]),
            Outcome::Answer(Malformed, StatusCode::BAD_REQUEST),
        ),
        (
            "the gateway's request naming two workloads is refused",
            conn(Some(&gateway()), None),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), remote.as_str()), (GATEWAY_CLIENT_ID.as_str(), remote.as_str())]),
            Outcome::Answer(Malformed, StatusCode::BAD_REQUEST),
        ),
        (
            "the gateway's request naming a workload of our own trust domain is refused",
            conn(Some(&gateway()), None),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), client.as_str())]),
            Outcome::Answer(Malformed, StatusCode::BAD_REQUEST),
        ),
        (
            "the gateway's request naming no identity is refused",
            conn(Some(&gateway()), None),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), "Not A Name")]),
            Outcome::Answer(Malformed, StatusCode::BAD_REQUEST),
        ),
        (
            "the gateway's request goes to the app as the remote workload's",
            conn(Some(&gateway()), None),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), remote.as_str())]),
            forward("/a", Some(&remote), false),
        ),
        (
            "under policy, the gateway's request is authorized as the remote workload",
            conn(Some(&gateway()), Some(AllAuthenticated)),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), remote.as_str())]),
            forward("/a", Some(&remote), true),
        ),
        (
            "another cluster's gateway is not taken at its word",
            conn(
                Some(&name(
                    cnimesh_common::names::GATEWAY_NAME,
                    cnimesh_common::names::MULTICLUSTER_NAMESPACE,
                    "east.example",
                )),
                None,
            ),
            get("/a", &[(GATEWAY_CLIENT_ID.as_str(), remote.as_str())]),
            forward(
                "/a",
                Some(&name(
                    cnimesh_common::names::GATEWAY_NAME,
                    cnimesh_common::names::MULTICLUSTER_NAMESPACE,
                    "east.example",
                )),
                false,
            ),
        ),
    ];
    for (case, conn, req, expected) in table {
        assert_eq!(outcome(&conn, req), expected, "{case}");
    }
}

/// A network peer (meshed or not) that sends a destination override inbound steers nothing: the
/// inbound has no routing to change, and the app behind the proxy never sees the header.
#[test]
fn a_destination_override_from_the_network_never_reaches_the_app() {
    let client = name("ingress", "edge", TRUST_DOMAIN);
    for conn in [conn(Some(&client), None), conn(None, Some(DefaultPolicy::AllUnauthenticated))] {
        let mut req = Request::get("/")
            .header("l5d-dst-override", "admin.internal.svc.cluster.local:80")
            .header("cnimesh-dst-override", "admin.internal.svc.cluster.local:80")
            .body(())
            .unwrap();
        assert!(matches!(conn.decide(&mut req), Decision::Forward(_)));
        for header in ["l5d-dst-override", "cnimesh-dst-override"] {
            assert!(!req.headers().contains_key(header), "{header} stripped: {:?}", req.headers());
        }
    }
}
