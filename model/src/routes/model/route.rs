//! A validated route: what both kinds share (parents, hostnames, rules, annotations' defaults).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::backends::Backend;
use super::crd;
use super::defaults::RouteDefaults;
use super::hostnames::{HostMatch, hostnames};
use super::kind::RouteKind;
use super::parents::{EgressParent, Parent, egress_parents, parents};
use super::rule::Rule;
use crate::meta::{Invalid, NsName, key_of};

/// A validated route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub kind: RouteKind,
    pub key: NsName,
    /// Gateway API precedence among routes: the oldest first, then by namespace/name.
    pub created: Option<Time>,
    /// The Services it attaches to; a route attached to none is kept but serves nothing.
    pub parents: Vec<Parent>,
    /// The EgressNetworks it attaches to: served by [`crate::egress`], not here.
    pub egress_parents: Vec<EgressParent>,
    pub hostnames: Vec<HostMatch>,
    /// Never empty.
    pub rules: Vec<Rule>,
}

impl Route {
    /// What both kinds share; a route without rules gets one default rule (Gateway API).
    pub(super) fn read<R: Default>(
        kind: RouteKind,
        meta: &ObjectMeta,
        parent_refs: &[crd::ParentReference],
        names: &[String],
        rules: &[R],
        rule: fn(&R, &NsName, &RouteDefaults) -> Result<Rule, Invalid>,
    ) -> Result<Self, Invalid> {
        let key = key_of(meta);
        let defaults = RouteDefaults::from_annotations(meta, kind)?;
        let default_rule = [R::default()];
        let rules = if rules.is_empty() { &default_rule[..] } else { rules };
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(r, &key, &defaults).map_err(|e| in_rule(i, e)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            kind,
            created: meta.creation_timestamp.clone(),
            parents: parents(parent_refs, &key)?,
            egress_parents: egress_parents(parent_refs, &key)?,
            hostnames: hostnames(names)?,
            key,
            rules,
        })
    }

    /// Whether the route attaches to this Service port.
    pub fn attaches_to(&self, service: &NsName, port: u16) -> bool {
        self.parents.iter().any(|p| p.service == *service && p.port.is_none_or(|p| p == port))
    }

    /// Backends in another namespace than the route's: each needs a ReferenceGrant.
    pub fn foreign_backends(&self) -> impl Iterator<Item = &Backend> {
        self.rules.iter().flat_map(|r| &r.backends).filter(|b| b.service.namespace != self.key.namespace)
    }
}

fn in_rule(index: usize, error: Invalid) -> Invalid {
    Invalid(format!("rules[{index}]: {}", error.0))
}
