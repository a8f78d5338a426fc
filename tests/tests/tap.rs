//! Tap on a real kernel: a meshed client and server, and a tap client holding a certificate for
//! the control plane's identity (from the control plane's issuer) observing both proxies over
//! mTLS on their admin ports while the client calls the server.

use std::time::Duration;

use cnimesh_e2e::apps;
use cnimesh_e2e::control::identity;
use cnimesh_e2e::mesh::meshed;
use cnimesh_e2e::sidecar::{grpc_in, http_in};
use cnimesh_e2e::tap_client::{self, client_tls, everything};
use cnimesh_e2e::{Network, bins, require_root};
use linkerd2_proxy_api::tap::tap_event::{self, ProxyDirection, http::Event};
use linkerd2_proxy_api::tap::{TapEvent, eos};
use serde_json::json;

const CONTROL_IDENTITY: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

fn http(e: &TapEvent) -> &Event {
    match &e.event {
        Some(tap_event::Event::Http(h)) => h.event.as_ref().expect("an HTTP event"),
        None => panic!("not an HTTP event: {e:?}"),
    }
}

fn label<'e>(meta: &'e Option<tap_event::EndpointMeta>, key: &str) -> &'e str {
    meta.as_ref().and_then(|m| m.labels.get(key)).map_or("", String::as_str)
}

/// Every event of a session, to its end.
async fn read(stream: &mut tonic::Streaming<TapEvent>) -> Vec<TapEvent> {
    let mut events = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        events.push(e);
    }
    events
}

#[test]
fn the_control_plane_taps_both_proxies_of_a_meshed_call() {
    if !require_root("the_control_plane_taps_both_proxies_of_a_meshed_call") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let m = meshed(&bins!(), &net, &[]);
    let (client_id, server_id) = (identity("shop", "client"), identity("shop", "server"));
    let tls = client_tls(&m.control, CONTROL_IDENTITY).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (mut at_client, mut at_server) = rt.block_on(async {
        let mut client = tap_client::connect(&m.client.netns.path(), tls.clone(), &client_id).await.unwrap();
        let mut server = tap_client::connect(&m.server.netns.path(), tls.clone(), &server_id).await.unwrap();
        (
            client.observe(everything(1)).await.unwrap().into_inner(),
            server.observe(everything(1)).await.unwrap().into_inner(),
        )
    });

    let server_http = format!("{}:{}", m.server.ipv4(), apps::HTTP_PORT);
    let (status, body) = http_in(&m.client.netns.path(), &server_http, "GET", "/hello", "").unwrap();
    assert_eq!(status, 200, "{body}");

    let (outbound, inbound) = rt.block_on(async {
        let limit = Duration::from_secs(20);
        let outbound = tokio::time::timeout(limit, read(&mut at_client)).await.expect("the client proxy's events end");
        let inbound = tokio::time::timeout(limit, read(&mut at_server)).await.expect("the server proxy's events end");
        (outbound, inbound)
    });
    for (events, direction) in [(&outbound, ProxyDirection::Outbound), (&inbound, ProxyDirection::Inbound)] {
        assert_eq!(events.len(), 3, "{direction:?}: {events:#?}");
        assert!(events.iter().all(|e| e.proxy_direction == direction as i32), "{events:#?}");
        let Event::RequestInit(init) = http(&events[0]) else { panic!("{events:#?}") };
        assert_eq!((init.path.as_str(), init.method.clone()), ("/hello", Some(http::Method::GET.into())));
        let Event::ResponseInit(rsp) = http(&events[1]) else { panic!("{events:#?}") };
        assert_eq!(rsp.http_status, 200);
        let Event::ResponseEnd(end) = http(&events[2]) else { panic!("{events:#?}") };
        assert!(end.since_request_init.is_some() && end.since_response_init.is_some(), "{end:?}");
        assert_eq!(end.response_bytes, body.len() as u64);
    }
    // The client's proxy sent it over mTLS to the server's identity; the server's proxy got it
    // over mTLS from the client's identity, to its own.
    let out = &outbound[0];
    assert_eq!(label(&out.destination_meta, "tls"), "true");
    assert_eq!(label(&out.destination_meta, "server_id"), server_id);
    let dst = std::net::SocketAddr::try_from(out.destination.unwrap()).unwrap();
    assert_eq!(dst.to_string(), server_http);
    let inb = &inbound[0];
    assert_eq!(label(&inb.source_meta, "tls"), "true");
    assert_eq!(label(&inb.source_meta, "client_id"), client_id);
    assert_eq!(label(&inb.destination_meta, "server_id"), server_id);
    let src = std::net::SocketAddr::try_from(inb.source.unwrap()).unwrap();
    assert_eq!(src.ip(), std::net::IpAddr::from(m.client.ipv4()));

    // A gRPC call's end carries the status from its trailers.
    let mut grpc = rt.block_on(async {
        let mut tap = tap_client::connect(&m.client.netns.path(), tls.clone(), &client_id).await.unwrap();
        tap.observe(everything(1)).await.unwrap().into_inner()
    });
    let (status, _, trailers) = grpc_in(&m.client.netns.path(), &server_http, "/grpc-fail").unwrap();
    assert_eq!((status, trailers["grpc-status"].to_str().unwrap()), (200, "13"));
    let events = rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), read(&mut grpc)).await }).unwrap();
    let Some(Event::ResponseEnd(end)) = events.last().map(http) else { panic!("{events:#?}") };
    assert_eq!(end.eos.unwrap().end, Some(eos::End::GrpcStatusCode(13)), "{end:?}");

    // The workload's own identity may not tap its neighbour.
    let intruder = client_tls(&m.control, &client_id).unwrap();
    let denied = rt.block_on(async {
        let mut tap = tap_client::connect(&m.server.netns.path(), intruder, &server_id).await.unwrap();
        tap.observe(everything(1)).await.unwrap_err()
    });
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert_eq!(m.server_proxy.metric("tap_denied_total"), 1.0);
    assert_eq!(m.server_proxy.metric("tap_sessions_open"), 0.0);
}
