//! Which outbound endpoints are meshed, and the identity each must prove, from static
//! configuration: for destinations discovery does not resolve (a pod IP's profile and a
//! service's endpoints carry their own identity).

use std::collections::HashMap;
use std::net::SocketAddr;

use cnimesh_identity::Name;

/// A meshed endpoint: one address, or every port of an IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndpointMatch {
    Addr(SocketAddr),
    Ip(std::net::IpAddr),
}

impl std::str::FromStr for EndpointMatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse()
            .map(Self::Addr)
            .or_else(|_| s.parse().map(Self::Ip))
            .map_err(|_| format!("{s:?} is neither ip:port nor ip"))
    }
}

/// Fixed at start: no lock on the per-connection lookup.
#[derive(Debug, Default)]
pub struct MeshedEndpoints {
    map: HashMap<EndpointMatch, Name>,
}

impl MeshedEndpoints {
    pub fn new(entries: impl IntoIterator<Item = (EndpointMatch, Name)>) -> Self {
        Self { map: entries.into_iter().collect() }
    }

    /// The identity expected at `target`: an exact address first, then its IP.
    pub fn identity(&self, target: SocketAddr) -> Option<Name> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&EndpointMatch::Addr(target)).or_else(|| self.map.get(&EndpointMatch::Ip(target.ip()))).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_address_wins_over_ip() {
        let a: Name = "a.b".parse().unwrap();
        let c: Name = "c.d".parse().unwrap();
        let m = MeshedEndpoints::new([
            (EndpointMatch::Ip("10.0.0.1".parse().unwrap()), a.clone()),
            (EndpointMatch::Addr("10.0.0.1:80".parse().unwrap()), c.clone()),
        ]);
        assert_eq!(m.identity("10.0.0.1:80".parse().unwrap()), Some(c));
        assert_eq!(m.identity("10.0.0.1:81".parse().unwrap()), Some(a));
        assert_eq!(m.identity("10.0.0.2:80".parse().unwrap()), None);
    }
}
