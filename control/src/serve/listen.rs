//! The listeners `serve` accepts on: bound by the caller (tests and benchmarks bind port 0 to
//! know the address first) or bound here from an address (the command line).

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;

/// A listening socket, or where to open one.
pub enum Listener {
    Bound(TcpListener),
    /// Bound when serving starts; with `reuse_port`, SO_REUSEPORT lets several replicas on one
    /// host share the address (local mode's HA, the rolling-restart test).
    Addr {
        addr: SocketAddr,
        reuse_port: bool,
    },
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Bound(listener)
    }
}

impl Listener {
    pub async fn bind(self) -> anyhow::Result<TcpListener> {
        match self {
            Listener::Bound(listener) => Ok(listener),
            Listener::Addr { addr, reuse_port } => bind(addr, reuse_port).await,
        }
    }
}

async fn bind(addr: SocketAddr, reuse_port: bool) -> anyhow::Result<TcpListener> {
    if !reuse_port {
        return TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"));
    }
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() };
    let bound = socket.and_then(|socket| {
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    });
    bound.with_context(|| format!("binding {addr} with SO_REUSEPORT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replicas_share_an_address_only_with_reuse_port() {
        let first = bind("127.0.0.1:0".parse().unwrap(), true).await.unwrap();
        let addr = first.local_addr().unwrap();
        let _second = bind(addr, true).await.expect("a second replica on the same address");
        let error = format!("{:#}", bind(addr, false).await.unwrap_err());
        assert!(error.contains(&addr.to_string()), "{error}");
    }
}
