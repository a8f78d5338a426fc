//! Inbound policy discovery in-process, against a mock `InboundServerPolicies` on loopback: which
//! ports are watched and when, the bound on undeclared ports (never falling open), and the
//! default the control plane states becoming the fallback of unanswered ports.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_proxy::inbound::policy::discover::{MAX_UNDECLARED, Policies};
use cnimesh_proxy::inbound::policy::model::DefaultPolicy;
use linkerd2_proxy_api::inbound::inbound_server_policies_server::{InboundServerPolicies, InboundServerPoliciesServer};
use linkerd2_proxy_api::inbound::{PortSpec, ProxyProtocol, Server, proxy_protocol};
use parking_lot::Mutex;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Answers the ports it has an answer for (then keeps the stream open); never answers the
/// others. Records every port watched.
#[derive(Clone, Default)]
struct Mock {
    answers: Arc<HashMap<u32, Server>>,
    watched: Arc<Mutex<Vec<u32>>>,
}

#[tonic::async_trait]
impl InboundServerPolicies for Mock {
    type WatchPortStream = Pin<Box<dyn Stream<Item = Result<Server, Status>> + Send>>;

    async fn get_port(&self, _: Request<PortSpec>) -> Result<Response<Server>, Status> {
        Err(Status::unimplemented("the proxy watches"))
    }

    async fn watch_port(&self, req: Request<PortSpec>) -> Result<Response<Self::WatchPortStream>, Status> {
        let port = req.into_inner().port;
        self.watched.lock().push(port);
        let first = self.answers.get(&port).cloned().map(Ok);
        let stream = tokio_stream::StreamExt::chain(tokio_stream::iter(first), tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }
}

/// What cnimesh-control sends for a port without a Server: the default, by name.
fn default_server(name: &str) -> Server {
    let labels = [("group", ""), ("kind", "default"), ("name", name)];
    Server {
        protocol: Some(ProxyProtocol { kind: Some(proxy_protocol::Kind::Opaque(proxy_protocol::Opaque {})) }),
        server_ips: vec![],
        authorizations: vec![],
        labels: labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

async fn policies(mock: Mock, default: DefaultPolicy, declared: &[u16], first_answer: Duration) -> Policies {
    let incoming = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(InboundServerPoliciesServer::new(mock))
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let streams = Default::default();
    Policies::new(
        channel,
        "shop:api-0".into(),
        default,
        vec![],
        declared,
        (first_answer, Duration::from_millis(50)),
        &streams,
    )
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("not within 5 s: {what}");
}

#[tokio::test]
async fn declared_ports_are_watched_from_start_up_and_ready_waits_for_their_answers() {
    let mock = Mock { answers: Arc::new([(80, default_server("deny"))].into()), ..Mock::default() };
    let watched = mock.watched.clone();
    let p = policies(mock, DefaultPolicy::AllUnauthenticated, &[80, 81], Duration::from_millis(50)).await;
    eventually("both declared ports watched without a connection", || {
        let mut w = watched.lock().clone();
        w.sort_unstable();
        w == [80, 81]
    })
    .await;
    assert!(!p.declared_answered(Duration::from_millis(300)).await, "81 is never answered: bounded wait");
    assert_eq!(p.unanswered(), [81]);
    assert_eq!(p.undeclared_watched(), 0, "declared ports are not counted against the bound");
}

/// Unfixed, the 129th port got `all-unauthenticated` whatever its policy.
#[tokio::test]
async fn a_full_table_evicts_an_idle_watch_and_refuses_when_every_watch_is_in_use() {
    let mock = Mock::default();
    let p = policies(mock, DefaultPolicy::Deny, &[], Duration::ZERO).await;
    let mut held = Vec::new();
    for port in 1..=MAX_UNDECLARED as u16 {
        held.push(p.port(port).await.unwrap());
    }
    let full = p.port(1000).await.err().expect("every watch has an open connection: refused");
    assert_eq!(full.port, 1000);
    held.remove(4);
    let watch = p.port(1000).await.expect("port 5's watch is idle now: evicted");
    assert_eq!(&*watch.current().server.name, "deny", "unanswered: the configured default");
    assert_eq!(p.undeclared_watched(), MAX_UNDECLARED);
    drop((held, watch));
    for port in 2000..3000 {
        let w = p.port(port).await.unwrap();
        assert_eq!(&*w.current().server.name, "deny");
    }
    assert_eq!(p.undeclared_watched(), MAX_UNDECLARED, "a thousand ports churned, the bound held");
}

/// Unfixed, an unanswered port got the proxy's local default whatever the control plane said.
#[tokio::test]
async fn the_default_the_control_plane_states_becomes_the_fallback_of_unanswered_ports() {
    let mock = Mock { answers: Arc::new([(80, default_server("deny"))].into()), ..Mock::default() };
    let p = policies(mock, DefaultPolicy::AllUnauthenticated, &[80], Duration::ZERO).await;
    assert!(p.declared_answered(Duration::from_secs(5)).await);
    let unanswered = p.port(81).await.unwrap();
    assert!(!unanswered.answered());
    assert_eq!(&*unanswered.current().server.name, "deny");
    assert_eq!(&*p.fallback().server.name, "deny");
}
