//! A packet capture inside a pod's namespace (AF_PACKET, as tcpdump does it), keeping the TCP
//! payloads exchanged between two addresses: what an observer on the pod network sees.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType, sockopt};

pub struct Sniffer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<u8>>>,
}

/// The TCP payload of an IPv4 packet between `a` and `b` (either way), if it is one.
fn payload(packet: &[u8], a: Ipv4Addr, b: Ipv4Addr) -> Option<&[u8]> {
    let version_ihl = *packet.first()?;
    if version_ihl >> 4 != 4 || packet.get(9) != Some(&6) {
        return None;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?])).min(packet.len());
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst = Ipv4Addr::new(*packet.get(16)?, packet[17], packet[18], *packet.get(19)?);
    if !((src == a && dst == b) || (src == b && dst == a)) {
        return None;
    }
    let tcp = packet.get(ihl..total)?;
    let offset = usize::from(tcp.get(12)? >> 4) * 4;
    tcp.get(offset..)
}

impl Sniffer {
    /// Starts capturing in `netns` every TCP payload between `a` and `b`.
    pub fn start(netns: &Path, a: Ipv4Addr, b: Ipv4Addr) -> anyhow::Result<Self> {
        // The socket belongs to the namespace it is created in; it keeps capturing there.
        let fd: OwnedFd = cnimesh_cni::netns::run_in(netns, || {
            socket::socket(AddressFamily::Packet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, SockProtocol::EthAll)
        })??;
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(0, 50_000))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !flag.load(Ordering::SeqCst) {
                if let Ok(n) = socket::recv(fd.as_raw_fd(), &mut buf, socket::MsgFlags::empty())
                    && let Some(p) = payload(&buf[..n], a, b)
                {
                    seen.extend_from_slice(p);
                }
            }
            seen
        });
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Stops and returns every payload byte seen, in capture order.
    pub fn stop(mut self) -> Vec<u8> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Whether `bytes` contain `needle`.
pub fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}
