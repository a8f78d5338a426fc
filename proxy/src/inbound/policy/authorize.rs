//! The authorization decision, pure: which of a policy's authorizations admits a client (its
//! address, and its mTLS identity when it proved one), and which route a request takes. The
//! rules are the shared crate's ([`cnimesh_policy_rules`]), the same code the CLI explains
//! policies with; this module is where the proxy's request path finds them.

pub use cnimesh_policy_rules::{Client, authorized, route_for};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::policy::model::DefaultPolicy;

    const WEB: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";

    fn client<'a>(ip: &str, identity: Option<&'a str>) -> Client<'a> {
        Client { ip: ip.parse().unwrap(), identity }
    }

    #[test]
    fn defaults() {
        let cluster = ["10.0.0.0/8".parse().unwrap()];
        let check = |d: DefaultPolicy, c| authorized(&d.policy(&cluster).authorizations, c).is_some();
        assert!(check(DefaultPolicy::AllUnauthenticated, client("192.0.2.1", None)));
        assert!(!check(DefaultPolicy::AllAuthenticated, client("10.0.0.1", None)));
        assert!(check(DefaultPolicy::AllAuthenticated, client("192.0.2.1", Some(WEB))));
        assert!(check(DefaultPolicy::ClusterAuthenticated, client("10.0.0.1", Some(WEB))));
        assert!(!check(DefaultPolicy::ClusterAuthenticated, client("192.0.2.1", Some(WEB))));
        assert!(!check(DefaultPolicy::Deny, client("10.0.0.1", Some(WEB))));
    }
}
