//! The proxy's listeners, bound by the agent (root) before the rules go in and held for the
//! agent's whole life, so no local user can take the proxy's ports (above 1024) while the proxy is
//! down and receive other users' redirected connections. Every proxy the agent starts inherits
//! them systemd-style: fds 3.. with `LISTEN_FDS` and `LISTEN_FDNAMES` (no `LISTEN_PID`: the
//! child's pid is not known before it runs; the variables are the child's own environment), and
//! adopts them instead of binding.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;

use command_fds::FdMapping;

/// The first inherited descriptor (after stdin, stdout, stderr), as in systemd's protocol.
const FIRST_FD: i32 = 3;

#[derive(Debug, thiserror::Error)]
#[error("binding the proxy's {name} listener {addr}: {source}")]
pub struct BindError {
    name: &'static str,
    addr: SocketAddr,
    source: std::io::Error,
}

/// The listening sockets handed to each proxy: inbound on every address, outbound on loopback
/// (the proxy's default listeners), IPv6 ones only where the host has IPv6.
pub struct ProxyListeners {
    sockets: Vec<(&'static str, std::net::TcpListener)>,
}

impl ProxyListeners {
    /// Binds `0.0.0.0:inbound`, `[::]:inbound`, `127.0.0.1:outbound` and `[::1]:outbound`.
    pub fn bind(inbound: u16, outbound: u16) -> Result<Self, BindError> {
        let wanted = [
            ("inbound", SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), inbound)),
            ("inbound", SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), inbound)),
            ("outbound", SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), outbound)),
            ("outbound", SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), outbound)),
        ];
        let mut sockets = Vec::new();
        for (name, addr) in wanted {
            match listen(addr) {
                Ok(listener) => sockets.push((name, listener)),
                // A host without IPv6 gets IPv4 listeners only (the proxy skips the same ones).
                Err(e)
                    if addr.is_ipv6() && matches!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)) =>
                {
                    tracing::warn!(%addr, error = %e, "IPv6 is not available here; no listener");
                }
                Err(source) => return Err(BindError { name, addr, source }),
            }
        }
        Ok(Self { sockets })
    }

    /// The bound addresses, in the order they are handed down.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.sockets.iter().filter_map(|(_, l)| l.local_addr().ok()).collect()
    }

    /// Copies of the sockets, mapped to fds 3.. in the child.
    pub fn mappings(&self) -> std::io::Result<Vec<FdMapping>> {
        (FIRST_FD..)
            .zip(&self.sockets)
            .map(|(child_fd, (_, l))| Ok(FdMapping { parent_fd: OwnedFd::from(l.try_clone()?), child_fd }))
            .collect()
    }

    /// `LISTEN_FDS`, `LISTEN_FDS_FIRST_FD` and `LISTEN_FDNAMES` for the child.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let names: Vec<&str> = self.sockets.iter().map(|(n, _)| *n).collect();
        vec![
            ("LISTEN_FDS".into(), self.sockets.len().to_string().into()),
            ("LISTEN_FDS_FIRST_FD".into(), FIRST_FD.to_string().into()),
            ("LISTEN_FDNAMES".into(), names.join(":").into()),
        ]
    }
}

/// A listening socket on `addr`: IPv6 wildcards v6-only so they coexist with IPv4 ones; no
/// SO_REUSEPORT, so no other socket can share the port.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, sockopt};
    let family = if addr.is_ipv6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
    let fd = nix::sys::socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    nix::sys::socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        nix::sys::socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(addr))?;
    nix::sys::socket::listen(&fd, Backlog::new(1024).map_err(std::io::Error::from)?)?;
    Ok(std::net::TcpListener::from(fd))
}
