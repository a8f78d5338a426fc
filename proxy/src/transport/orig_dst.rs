//! The original destination of a redirected connection (SO_ORIGINAL_DST).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;

use nix::sys::socket::{getsockopt, sockopt};

/// The address the client dialled before capture redirected it, or `None` if the connection was
/// not redirected (then it must not be proxied: forwarding it would loop back to us).
pub fn original_dst(stream: &tokio::net::TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    let fd = stream.as_fd();
    let dst = if local.is_ipv6() {
        let sa = getsockopt(&fd, sockopt::Ip6tOriginalDst).ok()?;
        SocketAddr::from((Ipv6Addr::from(sa.sin6_addr.s6_addr), u16::from_be(sa.sin6_port)))
    } else {
        let sa = getsockopt(&fd, sockopt::OriginalDst).ok()?;
        SocketAddr::from((Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)), u16::from_be(sa.sin_port)))
    };
    // Without NAT the conntrack "original" destination is the listener itself.
    (dst != local).then_some(dst)
}
