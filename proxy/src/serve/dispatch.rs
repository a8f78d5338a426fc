//! Serving one connection once its TLS is settled and its target known: protocol detection,
//! then opaque forwarding or HTTP with the per-request proxy ([`crate::serve::forward`]). Takes any
//! [`Io`], so it runs the same over a socket and over an in-memory stream in tests.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::service::service_fn;

use crate::client::targets::Target;
use crate::inbound::policy::enforce::ConnPolicy;
use crate::inbound::policy::model::PortProtocol;
use crate::serve::forward::HttpProxy;
use crate::serve::metrics::{DecidedBy, Direction, DstKind, OpenConnection, ProtocolLabels, TcpLabels, TlsLabel};
use crate::serve::shared::Shared;
use crate::transport::Io;
use crate::transport::conn_error::ConnError;
use crate::transport::counting::CountingIo;
pub use crate::transport::detect::Known;
use crate::transport::detect::{self, Protocol};
use crate::transport::prefixed::PrefixedIo;
use crate::transport::tcp;

/// What is known of a connection once its TLS is settled.
pub struct Connection {
    pub direction: Direction,
    /// The client: the app (outbound) or the remote peer (inbound).
    pub peer: SocketAddr,
    /// The original destination.
    pub addr: SocketAddr,
    /// The client side's TLS (inbound) or the upstream's (outbound), for metrics labels.
    pub tls: TlsLabel,
    pub target: Arc<Target>,
    /// The client's protocol when known without detection (an opaque port, a silent client
    /// already waited for, an outbound policy that declares it).
    pub known: Option<Known>,
    /// Inbound with policy discovery: the port's policy, enforced on this connection.
    pub policy: Option<Arc<ConnPolicy>>,
    /// Outbound to an EgressNetwork's destination, as admitted.
    pub egress: Option<crate::outbound::egress::Admitted>,
    /// A gateway's connection: the identity its client proved, which every HTTP request it
    /// forwards carries to the target ([`crate::http::headers::GATEWAY_CLIENT_ID`]).
    pub gateway_client: Option<cnimesh_identity::Name>,
}

pub async fn serve<I: Io>(mut io: I, read: Bytes, conn: Connection, shared: &Arc<Shared>) -> Result<(), ConnError> {
    let config = &shared.config;
    let m = &shared.metrics;
    let labels = TcpLabels {
        direction: conn.direction,
        target_addr: m.target_label(conn.direction, conn.addr),
        dst_kind: DstKind::egress(conn.egress.is_some()),
        target_cluster: conn.target.cluster.clone(),
        tls: conn.tls.clone(),
    };
    let counters = tcp::Counters {
        read: m.tcp_read_bytes_total.get_or_create(&labels).clone(),
        write: m.tcp_write_bytes_total.get_or_create(&labels).clone(),
    };
    let open = OpenConnection::open(m.clone(), labels);
    let by_policy = |protocol| Some(Known { protocol, by: DecidedBy::policy });
    let policy_protocol = conn.policy.as_ref().map(|p| p.protocol());
    let known = conn.known.or_else(|| match policy_protocol? {
        // An HTTP/1 server's requests may arrive over HTTP/2 from a meshed proxy (Linkerd's
        // transport upgrade, `l5d-orig-proto`, on by default in ours too): below.
        PortProtocol::Http1 => None,
        PortProtocol::Http2 => by_policy(Protocol::Http2),
        PortProtocol::Opaque => by_policy(Protocol::Opaque),
        PortProtocol::Detect => None,
    });
    let (protocol, prefix, by) = match known {
        Some(known) => (known.protocol, read, known.by),
        // Declared HTTP/1 (a Server's proxyProtocol or a Service's appProtocol): only
        // the HTTP version is told, so a late client is still HTTP, never opaque or cut off.
        None if policy_protocol == Some(PortProtocol::Http1) => {
            let (protocol, prefix) = detect::http_version(&mut io, read, config.detect_timeout).await?;
            (protocol, prefix, DecidedBy::policy)
        }
        None => {
            let (protocol, prefix) = detect::detect(&mut io, read, config.detect_timeout).await?;
            (protocol, prefix, DecidedBy::detection)
        }
    };
    m.connection_protocol_total.get_or_create(&ProtocolLabels::new(conn.direction, protocol, by)).inc();
    if let Some(egress) = &conn.egress {
        egress
            .served(&shared.outbound.egress, protocol != Protocol::Opaque, conn.addr)
            .map_err(|denied| ConnError::EgressDenied(denied.into()))?;
    }
    if protocol == Protocol::Opaque {
        if let Some(policy) = &conn.policy
            && !policy.allow_tcp()
        {
            return Err(ConnError::PolicyDenied { addr: conn.addr });
        }
        let picked = conn.target.route.pick(None).map_err(|e| ConnError::NoEndpoint(e.into()))?;
        let connected = picked.upstream.connect().await;
        if let (Err(_), Some(load)) = (&connected, &picked.load) {
            load.fail();
        }
        let upstream = connected.map_err(ConnError::Connect)?;
        // `picked` holds the connection as load on its endpoint until it ends.
        let forward = tcp::forward(io, prefix, upstream, config.idle_timeout, counters);
        // Opaque bytes are not re-checked: the connection ends when a policy update revokes it.
        let forwarded = match &conn.policy {
            Some(policy) => tokio::select! {
                forwarded = forward => forwarded,
                () = policy.revoked() => {
                    drop((picked, open));
                    return Err(ConnError::Revoked { addr: conn.addr });
                }
            },
            None => forward.await,
        };
        drop((picked, open));
        return Ok(forwarded?);
    }
    let io = CountingIo::new(PrefixedIo::new(prefix, io), counters.read, counters.write);
    // A gateway connection was admitted for the one Service its transport header
    // named; its requests go there whatever authority they carry.
    let pinned = conn.known.is_some_and(|k| k.by == DecidedBy::transport_header);
    let proxy = Arc::new(
        HttpProxy::new(conn.direction, conn.peer, conn.addr, conn.target, conn.tls, open, shared.clone())
            .with_policy(conn.policy)
            .with_egress(conn.egress.map(|e| e.labels))
            .for_gateway(pinned, conn.gateway_client.as_ref()),
    );
    // Each request's future is boxed once, where it is made: it is several kilobytes (the whole
    // request path, nested), and hyper moves it by value (into the HTTP/2 stream's task, into
    // the task's cell, its stage rewritten at the end), copying all of it at each move; boxed,
    // each move copies a pointer, for one allocation.
    let service = service_fn(move |req| Box::pin(proxy.clone().handle(req)));
    crate::http::serve_conn::serve(
        io,
        protocol == Protocol::Http2,
        service,
        config.header_timeout,
        shared.drain.signalled(),
    )
    .await
    .map_err(|e| ConnError::Http(e.into()))
}
