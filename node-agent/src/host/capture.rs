//! The capture rules in the agent's own network namespace (the host's): the same [`Ruleset`] the CNI plugin
//! installs in a pod's netns (one rule model, one nftables encoding), applied, checked and removed
//! here through the plugin library's backend, and a watch on nf_tables changes so a flushed or
//! edited table is put back at once.

use std::time::Duration;

use cnimesh_cni::backend::{Backend, BackendError};
use cnimesh_cni::nft::{NftError, NftEvents};
use cnimesh_cni::rules::Ruleset;
use cnimesh_cni::spec::RedirectSpec;
use tokio::sync::mpsc;

/// The capture of this host: the desired ruleset, programmed in the calling thread's netns (no
/// `setns`, so the agent needs CAP_NET_ADMIN and not CAP_SYS_ADMIN). nftables only: the ruleset
/// goes in as one transaction, so a refused one leaves nothing behind.
pub struct HostCapture {
    ruleset: Ruleset,
}

impl HostCapture {
    pub fn new(spec: &RedirectSpec) -> Self {
        Self { ruleset: Ruleset::from_spec(spec) }
    }

    pub fn ruleset(&self) -> &Ruleset {
        &self.ruleset
    }

    /// Replaces `table inet cnimesh` with the desired ruleset, atomically.
    pub fn install(&self) -> Result<(), BackendError> {
        Backend::Nftables.apply_here(&self.ruleset)
    }

    /// What differs between the live table and the desired ruleset; empty when they agree.
    pub fn drift(&self) -> Result<Vec<String>, BackendError> {
        Backend::Nftables.drift_here(&self.ruleset)
    }

    /// Removes the table; succeeds when there is none.
    pub fn remove(&self) -> Result<(), BackendError> {
        remove_here()
    }

    /// Puts the rules back if they drifted; returns the drift that was repaired (empty when
    /// nothing had to be done).
    pub fn repair(&self) -> Result<Vec<String>, BackendError> {
        let drift = self.drift()?;
        if !drift.is_empty() {
            self.install()?;
        }
        Ok(drift)
    }
}

/// Removes `table inet cnimesh` from the calling thread's netns; succeeds when there is none.
pub fn remove_here() -> Result<(), BackendError> {
    Backend::Nftables.remove_here()
}

/// Sends `()` on every nf_tables change of this network namespace (ours included: re-checking
/// after our own write finds no drift and stops there). Runs on its own thread, blocked in the
/// kernel between changes, so an idle host does no work. If the subscription fails or breaks,
/// the channel closes and the caller falls back to its periodic look.
pub fn watch_changes() -> Result<mpsc::UnboundedReceiver<()>, NftError> {
    let mut events = NftEvents::subscribe()?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("nft-events".into())
        .spawn(move || {
            loop {
                match events.wait() {
                    Ok(()) => {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "nf_tables change notifications failed; checking the rules periodically");
                        return;
                    }
                }
            }
        })
        .map_err(NftError::Socket)?;
    Ok(rx)
}

/// Several changes in a burst (a script of `nft` commands, our own replace) are looked at once.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
