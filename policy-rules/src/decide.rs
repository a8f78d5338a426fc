//! The authorization decision: which of a policy's authorizations admits a client (its address,
//! and its mTLS identity when it proved one), why each of the others refused it, and which
//! route a request takes. [`authorized`], what the proxy calls per connection, allocates
//! nothing: identities are compared as `&str`, networks by prefix.

use std::net::IpAddr;

use crate::model::{Authn, Authz, Network, PathMatch, Route, RouteMatch};
use crate::path_prefix::segment_prefix;

/// What the proxy knows of a client: its address, and the identity its mTLS certificate proved
/// (none for plaintext).
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    pub ip: IpAddr,
    pub identity: Option<&'a str>,
}

/// Why an authorization does not admit a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It requires mTLS and the client proved no identity.
    NeedsMeshTls,
    /// The client's identity is neither listed nor under a listed suffix.
    IdentityNotListed,
    /// The client's address is in none of its networks (or in an exception).
    AddressOutside,
}

impl Authz {
    /// Why this authorization refuses a client with `identity` at `ip`, or `None` when it admits
    /// it. An unknown address (`None`, the CLI asked about an identity alone) is not checked.
    pub fn refusal(&self, identity: Option<&str>, ip: Option<IpAddr>) -> Option<Refusal> {
        if matches!(self.authn, Authn::MeshTls { .. }) && identity.is_none() {
            return Some(Refusal::NeedsMeshTls);
        }
        if !self.authn.permits(identity) {
            return Some(Refusal::IdentityNotListed);
        }
        match ip {
            Some(ip) if !self.networks.iter().any(|n| n.contains(ip)) => Some(Refusal::AddressOutside),
            _ => None,
        }
    }
}

/// The first authorization that admits `client`, if any (an empty list admits nobody).
pub fn authorized<'p>(authzs: &'p [Authz], client: Client<'_>) -> Option<&'p Authz> {
    authzs.iter().find(|a| a.refusal(client.identity, Some(client.ip)).is_none())
}

/// The decision with its reasons: the index of the first authorization that admits the client
/// (as [`authorized`] finds it), and why each one before it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed_by: Option<usize>,
    pub refused: Vec<(usize, Refusal)>,
}

/// [`authorized`], explained; `ip` may be unknown (then only identities decide).
pub fn decide(authzs: &[Authz], identity: Option<&str>, ip: Option<IpAddr>) -> Decision {
    let mut refused = Vec::new();
    for (i, a) in authzs.iter().enumerate() {
        match a.refusal(identity, ip) {
            Some(why) => refused.push((i, why)),
            None => return Decision { allowed_by: Some(i), refused },
        }
    }
    Decision { allowed_by: None, refused }
}

impl Network {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.net.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) is matched as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Authn {
    pub fn permits(&self, identity: Option<&str>) -> bool {
        match self {
            Self::Unauthenticated => true,
            Self::MeshTls { identities, suffixes } => identity.is_some_and(|id| {
                identities.iter().any(|i| **i == *id)
                    || suffixes.iter().any(|s| s.is_empty() || id.ends_with(&**s) || id == &s[1..])
            }),
        }
    }
}

/// The index of the first route of `routes` that `method` and `path` match.
pub fn route_for(routes: &[Route], method: &http::Method, path: &str) -> Option<usize> {
    routes.iter().position(|r| r.matches.iter().any(|m| m.matches(method, path)))
}

impl RouteMatch {
    fn matches(&self, method: &http::Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method) && self.path.matches(path)
    }
}

impl PathMatch {
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(p) => **p == *path,
            Self::Prefix(p) => segment_prefix(p, path),
        }
    }
}

#[cfg(test)]
mod tests;
