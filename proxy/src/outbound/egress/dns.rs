//! A minimal DNS stub client (RFC 1035): A and AAAA questions over UDP to the nameservers of the
//! pod's own resolver configuration (`/etc/resolv.conf`), and the addresses of the answers with
//! their TTLs. Only what binding egress hostnames to addresses needs ([`super::names`]): names
//! are asked as given (absolute; no search domains, since an egress hostname is a name outside
//! the cluster), a truncated answer's addresses are taken as they are (no TCP retry), and an
//! answer counts only if it comes from the nameserver asked (a connected socket), carries the
//! question's id and repeats the question.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// glibc reads at most this many `nameserver` lines.
const MAX_NAMESERVERS: usize = 3;
/// glibc's defaults for `options timeout:` and `attempts:`; its caps for both.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_ATTEMPTS: u32 = 2;
const MAX_TIMEOUT_SECS: u64 = 30;
const MAX_ATTEMPTS: u32 = 5;
/// Record types and the class asked for.
pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const TYPE_CNAME: u16 = 5;
const CLASS_IN: u16 = 1;
/// A UDP answer is at most 512 bytes without EDNS; a little more is read to see a cut one.
const MAX_MESSAGE: usize = 4096;
/// Compression pointers followed in one name before it is called a loop.
const MAX_POINTERS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("reading the resolver configuration {path}: {source}")]
    Config { path: String, source: std::io::Error },
    #[error("the resolver configuration names no nameserver")]
    NoNameserver,
    #[error("{0:?} is not a DNS name")]
    BadName(String),
    #[error("no answer for {name} from {servers:?}")]
    NoAnswer { name: String, servers: Vec<SocketAddr> },
    #[error("the nameserver failed the question for {name} (rcode {rcode})")]
    Failed { name: String, rcode: u8 },
    #[error("malformed answer: {0}")]
    Malformed(&'static str),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// What the pod's resolver configuration says about where and how to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<SocketAddr>,
    /// Per question and nameserver.
    pub timeout: Duration,
    /// Rounds over the nameservers.
    pub attempts: u32,
}

impl ResolvConf {
    /// `nameserver ADDR` lines (the first three, as glibc) and `options timeout:N attempts:N`;
    /// everything else is left to the pod's own resolver.
    pub fn parse(text: &str) -> Result<Self, DnsError> {
        let mut conf = Self { nameservers: Vec::new(), timeout: DEFAULT_TIMEOUT, attempts: DEFAULT_ATTEMPTS };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    // A link-local IPv6 nameserver's `%zone` is not supported: skipped.
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok())
                        && conf.nameservers.len() < MAX_NAMESERVERS
                    {
                        conf.nameservers.push(SocketAddr::new(ip, 53));
                    }
                }
                Some("options") => {
                    for option in words {
                        let number = |prefix: &str| option.strip_prefix(prefix).and_then(|n| n.parse::<u64>().ok());
                        if let Some(n) = number("timeout:") {
                            conf.timeout = Duration::from_secs(n.clamp(1, MAX_TIMEOUT_SECS));
                        } else if let Some(n) = number("attempts:") {
                            conf.attempts = (n as u32).clamp(1, MAX_ATTEMPTS);
                        }
                    }
                }
                _ => {}
            }
        }
        if conf.nameservers.is_empty() {
            return Err(DnsError::NoNameserver);
        }
        Ok(conf)
    }

    pub fn read(path: &Path) -> Result<Self, DnsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| DnsError::Config { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }
}

/// `name` checked as a DNS name (letters, digits, `-`, `_`; labels of 1 to 63 bytes; at most
/// 253 bytes), lower case, without a trailing dot.
pub fn normalize(name: &str) -> Result<String, DnsError> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    let valid = !trimmed.is_empty()
        && trimmed.len() <= 253
        && trimmed.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(DnsError::BadName(name.to_string()));
    }
    Ok(trimmed.to_ascii_lowercase())
}

/// A recursive question (RD set) for `name` (normalized) of `qtype`, class IN.
pub fn question(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut msg = Vec::with_capacity(18 + name.len());
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&0x0100u16.to_be_bytes());
    msg.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        msg.push(label.len() as u8);
        msg.extend_from_slice(label.as_bytes());
    }
    msg.push(0);
    msg.extend_from_slice(&qtype.to_be_bytes());
    msg.extend_from_slice(&CLASS_IN.to_be_bytes());
    msg
}

/// Reads bytes of a message, failing rather than panicking on a short one.
struct Reader<'a> {
    msg: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DnsError> {
        let bytes = self.msg.get(self.pos..self.pos + n).ok_or(DnsError::Malformed("cut short"))?;
        self.pos += n;
        Ok(bytes)
    }

    fn u16(&mut self) -> Result<u16, DnsError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DnsError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A possibly compressed name, lower case, dot-separated; leaves the reader after it.
    fn name(&mut self) -> Result<String, DnsError> {
        let mut labels: Vec<String> = Vec::new();
        let mut pos = self.pos;
        let mut after = None;
        for _ in 0..MAX_POINTERS {
            loop {
                let len = *self.msg.get(pos).ok_or(DnsError::Malformed("name cut short"))? as usize;
                match len {
                    0 => {
                        self.pos = after.unwrap_or(pos + 1);
                        return Ok(labels.join("."));
                    }
                    1..=63 => {
                        let label =
                            self.msg.get(pos + 1..pos + 1 + len).ok_or(DnsError::Malformed("label cut short"))?;
                        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
                        pos += 1 + len;
                    }
                    l if l & 0xc0 == 0xc0 => {
                        let low = *self.msg.get(pos + 1).ok_or(DnsError::Malformed("pointer cut short"))? as usize;
                        after.get_or_insert(pos + 2);
                        pos = ((l & 0x3f) << 8) | low;
                        break;
                    }
                    _ => return Err(DnsError::Malformed("unknown label type")),
                }
            }
        }
        Err(DnsError::Malformed("name compression loop"))
    }
}

/// The addresses an answer to [`question`]`(id, name, qtype)` gives for `name` (following
/// CNAMEs within the answer), each with its TTL in seconds. A name that does not exist
/// (NXDOMAIN) has none.
pub fn answer(msg: &[u8], id: u16, name: &str, qtype: u16) -> Result<Vec<(IpAddr, u32)>, DnsError> {
    let mut r = Reader { msg, pos: 0 };
    if r.u16()? != id {
        return Err(DnsError::Malformed("another question's id"));
    }
    let flags = r.u16()?;
    if flags & 0x8000 == 0 {
        return Err(DnsError::Malformed("not an answer"));
    }
    let rcode = (flags & 0x000f) as u8;
    let (qdcount, ancount) = (r.u16()?, r.u16()?);
    r.take(4)?;
    if qdcount != 1 {
        return Err(DnsError::Malformed("not one question"));
    }
    if r.name()? != name || r.u16()? != qtype || r.u16()? != CLASS_IN {
        return Err(DnsError::Malformed("another question"));
    }
    match rcode {
        0 => {}
        3 => return Ok(Vec::new()),
        rcode => return Err(DnsError::Failed { name: name.to_string(), rcode }),
    }
    let mut records = Vec::new();
    for _ in 0..ancount {
        let owner = r.name()?;
        let (rtype, class, ttl, len) = (r.u16()?, r.u16()?, r.u32()?, r.u16()? as usize);
        let start = r.pos;
        let data = r.take(len)?;
        if class != CLASS_IN {
            continue;
        }
        let record = match (rtype, len) {
            (TYPE_A, 4) => Record::Addr(IpAddr::V4(Ipv4Addr::new(data[0], data[1], data[2], data[3])), ttl),
            (TYPE_AAAA, 16) => {
                let octets: [u8; 16] = data.try_into().map_err(|_| DnsError::Malformed("AAAA length"))?;
                Record::Addr(IpAddr::V6(Ipv6Addr::from(octets)), ttl)
            }
            (TYPE_CNAME, _) => Record::Alias(Reader { msg, pos: start }.name()?),
            _ => continue,
        };
        records.push((owner, record));
    }
    // The names that stand for `name`: itself and its aliases, in any order in the answer.
    let mut names = vec![name.to_string()];
    while let Some(alias) = records.iter().find_map(|(owner, rec)| match rec {
        Record::Alias(to) if names.contains(owner) && !names.contains(to) => Some(to.clone()),
        _ => None,
    }) {
        names.push(alias);
    }
    Ok(records
        .into_iter()
        .filter_map(|(owner, rec)| match rec {
            Record::Addr(ip, ttl) if names.contains(&owner) => Some((ip, ttl)),
            _ => None,
        })
        .collect())
}

enum Record {
    Addr(IpAddr, u32),
    Alias(String),
}

/// The IPv4 and IPv6 addresses of `name` (normalized) with their TTLs, asked of the configured
/// nameservers in turn, as the pod's own resolver would.
pub async fn lookup(conf: &ResolvConf, name: &str) -> Result<Vec<(IpAddr, u32)>, DnsError> {
    let (v4, v6) = tokio::join!(ask(conf, name, TYPE_A), ask(conf, name, TYPE_AAAA));
    match (v4, v6) {
        (Ok(mut a), Ok(aaaa)) => {
            a.extend(aaaa);
            Ok(a)
        }
        // One family answered: its addresses are enough to bind the name.
        (Ok(a), Err(_)) if !a.is_empty() => Ok(a),
        (Err(_), Ok(aaaa)) if !aaaa.is_empty() => Ok(aaaa),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

async fn ask(conf: &ResolvConf, name: &str, qtype: u16) -> Result<Vec<(IpAddr, u32)>, DnsError> {
    let mut last = None;
    for _ in 0..conf.attempts {
        for server in &conf.nameservers {
            // Unpredictable, like the socket's ephemeral port: an off-path forger must guess both.
            let mut id = [0; 2];
            cnimesh_identity::tls::random(&mut id);
            let id = u16::from_be_bytes(id);
            match tokio::time::timeout(conf.timeout, ask_one(*server, id, name, qtype)).await {
                Ok(Ok(addrs)) => return Ok(addrs),
                // A nameserver that answered that it failed: the next one may not.
                Ok(Err(e)) => last = Some(e),
                Err(_) => {}
            }
        }
    }
    Err(last.unwrap_or_else(|| DnsError::NoAnswer { name: name.to_string(), servers: conf.nameservers.clone() }))
}

async fn ask_one(server: SocketAddr, id: u16, name: &str, qtype: u16) -> Result<Vec<(IpAddr, u32)>, DnsError> {
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    socket.send(&question(id, name, qtype)).await?;
    let mut buf = vec![0; MAX_MESSAGE];
    loop {
        let n = socket.recv(&mut buf).await?;
        match answer(&buf[..n], id, name, qtype) {
            // Not the answer to this question (a late one, a forgery): keep waiting.
            Err(DnsError::Malformed(_)) => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_takes_nameservers_and_options_like_glibc() {
        let conf = ResolvConf::parse(
            "# comment\nsearch shop.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\nnameserver 1.1.1.1\nnameserver 8.8.8.8\noptions ndots:5 timeout:2 attempts:9\n",
        )
        .unwrap();
        let servers: Vec<String> = conf.nameservers.iter().map(ToString::to_string).collect();
        assert_eq!(servers, ["10.96.0.10:53", "[fd00::a]:53", "1.1.1.1:53"]);
        assert_eq!((conf.timeout, conf.attempts), (Duration::from_secs(2), MAX_ATTEMPTS));
        assert!(matches!(ResolvConf::parse("search x\n"), Err(DnsError::NoNameserver)));
    }

    #[test]
    fn names_are_checked_and_lower_cased() {
        assert_eq!(normalize("API.Example.test.").unwrap(), "api.example.test");
        for bad in ["", ".", "a..b", "a b.test", "evil.test/x", &"a".repeat(64), "[::1]"] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
    }

    /// An answer as a resolver sends it: the question, then `records` (owner, type, ttl, data),
    /// owners written as a pointer to the question's name when they are that name.
    fn reply(id: u16, rcode: u16, name: &str, qtype: u16, records: &[(&str, u16, u32, Vec<u8>)]) -> Vec<u8> {
        let mut msg = question(id, name, qtype);
        msg[2..4].copy_from_slice(&(0x8180u16 | rcode).to_be_bytes());
        msg[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for (owner, rtype, ttl, data) in records {
            if *owner == name {
                msg.extend_from_slice(&[0xc0, 12]);
            } else {
                msg.extend_from_slice(&question(0, owner, 0)[12..12 + owner.len() + 2]);
            }
            msg.extend_from_slice(&rtype.to_be_bytes());
            msg.extend_from_slice(&CLASS_IN.to_be_bytes());
            msg.extend_from_slice(&ttl.to_be_bytes());
            msg.extend_from_slice(&(data.len() as u16).to_be_bytes());
            msg.extend_from_slice(data);
        }
        msg
    }

    fn encoded(name: &str) -> Vec<u8> {
        question(0, name, 0)[12..12 + name.len() + 2].to_vec()
    }

    #[test]
    fn answers_give_the_names_addresses_through_cnames_only() {
        let name = "api.example.test";
        let msg = reply(
            7,
            0,
            name,
            TYPE_A,
            &[
                (name, TYPE_CNAME, 60, encoded("edge.cdn.test")),
                ("edge.cdn.test", TYPE_A, 30, vec![203, 0, 113, 10]),
                // An address for a name the question did not lead to is not the name's.
                ("evil.test", TYPE_A, 30, vec![198, 51, 100, 66]),
            ],
        );
        assert_eq!(answer(&msg, 7, name, TYPE_A).unwrap(), vec![("203.0.113.10".parse().unwrap(), 30)]);
        assert!(matches!(answer(&msg, 8, name, TYPE_A), Err(DnsError::Malformed(_))), "another id");
        assert!(matches!(answer(&msg, 7, "other.test", TYPE_A), Err(DnsError::Malformed(_))), "another question");
        let nx = reply(7, 3, name, TYPE_A, &[]);
        assert_eq!(answer(&nx, 7, name, TYPE_A).unwrap(), vec![]);
        let servfail = reply(7, 2, name, TYPE_A, &[]);
        assert!(matches!(answer(&servfail, 7, name, TYPE_A), Err(DnsError::Failed { rcode: 2, .. })));
        let aaaa = reply(9, 0, name, TYPE_AAAA, &[(name, TYPE_AAAA, 5, vec![0xfd; 16])]);
        assert_eq!(
            answer(&aaaa, 9, name, TYPE_AAAA).unwrap()[0].0,
            "fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn malformed_answers_are_errors_never_panics() {
        let name = "api.example.test";
        let good = reply(1, 0, name, TYPE_A, &[(name, TYPE_A, 30, vec![203, 0, 113, 10])]);
        for cut in 0..good.len() {
            assert!(answer(&good[..cut], 1, name, TYPE_A).is_err(), "cut at {cut}");
        }
        // A compression pointer to itself.
        let mut looped = good.clone();
        let at = question(1, name, TYPE_A).len();
        looped[at..at + 2].copy_from_slice(&[0xc0, at as u8]);
        assert!(matches!(answer(&looped, 1, name, TYPE_A), Err(DnsError::Malformed(_))));
    }
}
