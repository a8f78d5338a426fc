//! A validated rule: matches, filters, backends, timeouts and retry.

use super::backends::Backend;
use super::defaults::RouteDefaults;
use super::filters::Filter;
use super::matching::Matches;
use super::retry::{Retry, Timeouts};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Never empty: a rule without matches gets the Gateway API default (every request).
    pub matches: Matches,
    pub filters: Vec<Filter>,
    /// Empty: the parent Service itself (Gateway API: a rule without backends).
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    pub retry: Option<Retry>,
}

impl Rule {
    /// The rule with `defaults` (its Service's) filling the retry and request timeout that
    /// neither the rule nor its route set; borrowed when there is nothing to fill.
    pub fn with_defaults(&self, defaults: &RouteDefaults) -> std::borrow::Cow<'_, Rule> {
        let retry = self.retry.is_none() && defaults.retry.is_some();
        let timeout = self.timeouts.request.is_none() && defaults.request_timeout.is_some();
        if !retry && !timeout {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut rule = self.clone();
        if retry {
            rule.retry.clone_from(&defaults.retry);
        }
        if timeout {
            rule.timeouts.request = defaults.request_timeout;
        }
        std::borrow::Cow::Owned(rule)
    }
}
