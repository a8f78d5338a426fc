//! A tiny DNS server for egress tests: answers A questions (UDP) for a fixed set of names inside
//! a pod's netns, as the cluster's resolver would for names outside the cluster; AAAA questions
//! for those names get no address, other names NXDOMAIN. And the resolver configuration a pod's
//! processes read: `ip netns exec` (how the test proxies start) bind-mounts
//! `/etc/netns/<netns>/resolv.conf` over `/etc/resolv.conf`, as a pod's runtime mounts the
//! kubelet's.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The TTL of every answer.
pub const TTL: u32 = 30;

/// A running DNS server, stopped when dropped.
pub struct DnsServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Questions answered so far.
    pub asked: Arc<AtomicUsize>,
}

impl DnsServer {
    /// Serves `records` (name → address) on `addr` (UDP) inside the netns at `netns`.
    pub fn start(netns: &Path, addr: SocketAddr, records: &[(&str, Ipv4Addr)]) -> anyhow::Result<Self> {
        let records: Vec<(String, Ipv4Addr)> = records.iter().map(|(n, a)| (n.to_ascii_lowercase(), *a)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stopping, count) = (stop.clone(), asked.clone());
        let thread = crate::netns::spawn_in(netns, move || {
            let socket = match UdpSocket::bind(addr) {
                Ok(s) => s,
                Err(e) => return drop(ready_tx.send(Err(e.to_string()))),
            };
            let _ = socket.set_read_timeout(Some(Duration::from_millis(100)));
            let _ = ready_tx.send(Ok(()));
            let mut buf = [0u8; 512];
            while !stopping.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                if let Some(reply) = answer(&buf[..n], &records) {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = socket.send_to(&reply, from);
                }
            }
        })?;
        ready_rx.recv()?.map_err(|e| anyhow::anyhow!("DNS server did not start on {addr}: {e}"))?;
        Ok(Self { stop, thread: Some(thread), asked })
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The reply to one question, `None` for anything that is not one.
fn answer(query: &[u8], records: &[(String, Ipv4Addr)]) -> Option<Vec<u8>> {
    if query.len() < 17 || query[2] & 0x80 != 0 {
        return None;
    }
    let mut labels = Vec::new();
    let mut pos = 12;
    loop {
        let len = *query.get(pos)? as usize;
        pos += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(pos..pos + len)?).to_ascii_lowercase());
        pos += len;
    }
    let qtype = u16::from_be_bytes([*query.get(pos)?, *query.get(pos + 1)?]);
    let question_end = pos + 4;
    let name = labels.join(".");
    let known: Vec<Ipv4Addr> = records.iter().filter(|(n, _)| *n == name).map(|(_, a)| *a).collect();
    let rcode = if known.is_empty() { 3 } else { 0 };
    let addrs: &[Ipv4Addr] = if qtype == 1 { &known } else { &[] };
    let mut reply = query.get(..question_end)?.to_vec();
    reply[2] = 0x81;
    reply[3] = 0x80 | rcode;
    reply[6..8].copy_from_slice(&(addrs.len() as u16).to_be_bytes());
    reply[8..12].fill(0);
    for a in addrs {
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        reply.extend_from_slice(&TTL.to_be_bytes());
        reply.extend_from_slice(&[0, 4]);
        reply.extend_from_slice(&a.octets());
    }
    Some(reply)
}

/// `/etc/netns/<netns>/resolv.conf` naming `nameserver`: what processes started with `ip netns
/// exec <netns>` read as `/etc/resolv.conf`. Removed when dropped.
pub struct ResolvConf {
    dir: PathBuf,
}

impl ResolvConf {
    pub fn write(netns: &str, nameserver: Ipv4Addr) -> anyhow::Result<Self> {
        let dir = Path::new("/etc/netns").join(netns);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("resolv.conf"), format!("nameserver {nameserver}\noptions timeout:1 attempts:2\n"))?;
        Ok(Self { dir })
    }
}

impl Drop for ResolvConf {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
