//! Egress hostnames bound to the addresses they resolve to, as Cilium's `toFQDNs` binds them: a
//! hostname (a TLS SNI, an HTTP Host) is believed for a connection only when the connection's
//! original destination is among the addresses the proxy itself resolved for that name through
//! the pod's resolver ([`super::dns`]). Otherwise the name is the client's word only, and the
//! connection is seen, allowed or refused, and counted by its IP address.
//!
//! Answers are kept for their TTL, bounded to [`MIN_TTL`]..[`MAX_TTL`], per name, the addresses
//! of every answer within their TTL together (a name whose answers rotate stays bound to the
//! addresses the application may have been given). A destination not among them is asked about
//! again, at most once per [`REQUERY_AFTER`] per name, so a client trying addresses costs at most
//! one question a second per name. A resolver that cannot be read or does not answer binds
//! nothing: fail closed.
//!
//! Only egress uses this: traffic inside the cluster never asks.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::dns::{self, DnsError, ResolvConf};
use cnimesh_common::log_limit::LogLimit;

/// The pod's resolver configuration, as the application's own resolver reads it.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
/// An answer's addresses stay bound at least this long (a TTL of 0 still covers the
/// application's connection right after its own lookup)...
pub const MIN_TTL: Duration = Duration::from_secs(5);
/// ...and at most this long, whatever the TTL says.
pub const MAX_TTL: Duration = Duration::from_secs(300);
/// A name is asked about again for an unknown destination at most this often.
pub const REQUERY_AFTER: Duration = Duration::from_secs(1);
/// Names kept at once; beyond, expired ones go first, then the least recently asked.
pub const MAX_NAMES: usize = 1000;
/// How often the resolver configuration is read again (it may change under a running pod).
const CONF_RELOAD: Duration = Duration::from_secs(30);

static DNS_LOG: LogLimit = LogLimit::new(Duration::from_secs(10));

#[derive(Debug)]
struct Entry {
    /// Each address with when it stops being bound.
    addrs: Vec<(IpAddr, Instant)>,
    asked: Instant,
}

/// The bound names of one proxy.
#[derive(Debug)]
pub struct Names {
    conf_path: PathBuf,
    conf: Mutex<Option<(Instant, Result<ResolvConf, String>)>>,
    cache: Mutex<HashMap<String, Entry>>,
}

impl Default for Names {
    fn default() -> Self {
        Self::new(PathBuf::from(RESOLV_CONF))
    }
}

impl Names {
    /// Names resolved through the nameservers of the resolver configuration at `conf_path`.
    pub fn new(conf_path: PathBuf) -> Self {
        Self { conf_path, conf: Mutex::default(), cache: Mutex::default() }
    }

    /// Whether `host` (a hostname or an IP literal, as a client wrote it) names `ip`: an IP
    /// literal when it is `ip`, a hostname when `ip` is among the addresses it resolves to.
    pub async fn bound(&self, host: &str, ip: IpAddr) -> bool {
        let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(named) = literal.parse::<IpAddr>() {
            return named == ip || named.to_canonical() == ip.to_canonical();
        }
        let Ok(name) = dns::normalize(host) else { return false };
        let now = Instant::now();
        match self.cached(&name, ip, now) {
            Some(known) => known,
            None => match self.resolve(&name, now).await {
                Ok(addrs) => addrs.contains(&ip.to_canonical()),
                Err(e) => {
                    if let Some(left_out) = DNS_LOG.allow() {
                        tracing::warn!(%name, %ip, left_out, "egress: cannot resolve the name to bind it: {e}");
                    }
                    false
                }
            },
        }
    }

    /// `Some` when the cache decides: bound, or asked about too recently to ask again.
    fn cached(&self, name: &str, ip: IpAddr, now: Instant) -> Option<bool> {
        let cache = self.cache.lock();
        let entry = cache.get(name)?;
        if entry.addrs.iter().any(|(a, until)| *a == ip.to_canonical() && *until > now) {
            return Some(true);
        }
        (now.saturating_duration_since(entry.asked) < REQUERY_AFTER).then_some(false)
    }

    /// Asks the nameservers about `name`; the addresses bound to it afterwards.
    async fn resolve(&self, name: &str, now: Instant) -> Result<Vec<IpAddr>, DnsError> {
        let conf = self.conf(now)?;
        let answer = dns::lookup(&conf, name).await;
        let mut cache = self.cache.lock();
        if !cache.contains_key(name) && cache.len() >= MAX_NAMES {
            make_room(&mut cache, now);
        }
        let entry = cache.entry(name.to_string()).or_insert_with(|| Entry { addrs: Vec::new(), asked: now });
        entry.asked = now;
        entry.addrs.retain(|(_, until)| *until > now);
        for (ip, ttl) in answer? {
            let until = now + Duration::from_secs(ttl.into()).clamp(MIN_TTL, MAX_TTL);
            let ip = ip.to_canonical();
            match entry.addrs.iter_mut().find(|(a, _)| *a == ip) {
                Some((_, old)) => *old = (*old).max(until),
                None => entry.addrs.push((ip, until)),
            }
        }
        Ok(entry.addrs.iter().map(|(a, _)| *a).collect())
    }

    fn conf(&self, now: Instant) -> Result<ResolvConf, DnsError> {
        let mut conf = self.conf.lock();
        let stale = conf.as_ref().is_none_or(|(read, _)| now.saturating_duration_since(*read) >= CONF_RELOAD);
        if stale {
            *conf = Some((now, ResolvConf::read(&self.conf_path).map_err(|e| e.to_string())));
        }
        match conf.as_ref().map(|(_, c)| c) {
            Some(Ok(c)) => Ok(c.clone()),
            Some(Err(e)) => Err(DnsError::Config {
                path: self.conf_path.display().to_string(),
                source: std::io::Error::other(e.clone()),
            }),
            None => Err(DnsError::NoNameserver),
        }
    }
}

/// Drops the names whose addresses have all expired; if none has, the least recently asked.
fn make_room(cache: &mut HashMap<String, Entry>, now: Instant) {
    cache.retain(|_, e| e.addrs.iter().any(|(_, until)| *until > now));
    if cache.len() >= MAX_NAMES
        && let Some(oldest) = cache.iter().min_by_key(|(_, e)| e.asked).map(|(k, _)| k.clone())
    {
        cache.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nameserver on loopback answering every A question for `name` with `addrs` (TTL 60)
    /// and every other question with no address; counts the questions.
    async fn nameserver(
        name: &'static str,
        addrs: Vec<[u8; 4]>,
    ) -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = asked.clone();
        tokio::spawn(async move {
            let mut buf = [0; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut msg = buf[..n].to_vec();
                let qtype = u16::from_be_bytes([msg[n - 4], msg[n - 3]]);
                let asked_for = dns::question(0, name, 0);
                let qname_matches = msg[12..n - 4] == asked_for[12..asked_for.len() - 4];
                msg[2] = 0x81;
                msg[3] = 0x80;
                let records: &[[u8; 4]] = if qtype == dns::TYPE_A && qname_matches { &addrs } else { &[] };
                msg[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
                for a in records {
                    msg.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                    msg.extend_from_slice(a);
                }
                let _ = socket.send_to(&msg, from).await;
            }
        });
        (addr, asked)
    }

    /// Names asking `server` (a nameserver on another port than 53: a test's liberty).
    fn names_asking(server: std::net::SocketAddr) -> Names {
        let names = Names::new(PathBuf::from("/nonexistent/resolv.conf"));
        let conf = ResolvConf { nameservers: vec![server], timeout: Duration::from_secs(1), attempts: 1 };
        *names.conf.lock() = Some((Instant::now(), Ok(conf)));
        names
    }

    #[tokio::test]
    async fn a_name_binds_only_the_addresses_it_resolves_to_and_asks_again_at_most_once_a_second() {
        let (server, asked) = nameserver("api.example.test", vec![[203, 0, 113, 10]]).await;
        let names = names_asking(server);
        let legit: IpAddr = "203.0.113.10".parse().unwrap();
        let attacker: IpAddr = "203.0.113.66".parse().unwrap();
        assert!(names.bound("api.example.test", legit).await);
        assert!(names.bound("API.example.test.", legit).await, "the cached answer, whatever the spelling");
        assert!(names.bound("api.example.test", "::ffff:203.0.113.10".parse().unwrap()).await);
        let after_first = asked.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(after_first, 2, "one A and one AAAA question");
        for _ in 0..20 {
            assert!(!names.bound("api.example.test", attacker).await);
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), after_first, "a fresh answer decides misses");
        assert!(!names.bound("other.example.test", legit).await, "a name without addresses binds nothing");
        assert!(names.bound("203.0.113.66", attacker).await, "an IP literal names itself");
        assert!(names.bound("[::1]", "::1".parse().unwrap()).await);
        assert!(!names.bound("203.0.113.10", attacker).await);
        assert!(!names.bound("bad name", legit).await);
    }

    #[tokio::test]
    async fn without_a_resolver_nothing_is_bound() {
        let names = Names::new(PathBuf::from("/nonexistent/resolv.conf"));
        assert!(!names.bound("api.example.test", "203.0.113.10".parse().unwrap()).await);
    }
}
