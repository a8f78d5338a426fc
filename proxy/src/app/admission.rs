//! Connection admission: how many connections each direction serves at once, and how many of the
//! inbound ones one client address may hold. A flood of connections is shed at accept (closed at
//! once with a reset) instead of taking the descriptors that admitted traffic needs for its
//! upstream connects; without limits, 10 000 idle connections from one pod left the proxy
//! answering every normal request with a 502 "Too many open files".
//!
//! Defaults come from the descriptor limit (RLIMIT_NOFILE, which the binary raises to its hard
//! limit at start): a reserve stays out of the budget for listeners, the admin server, control
//! plane channels, pooled upstream connections and the runtime; every admitted connection may hold
//! two descriptors (its own and its upstream's); each direction gets half of the rest, so both
//! directions full still leave the reserve untouched.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::app::config::Config;
use crate::serve::metrics::{AcceptError, Direction};

/// Descriptors that admitted connections may not use, at least this many.
const MIN_RESERVE: u64 = 64;
/// ... or this fraction of the limit, for larger limits (pools grow with traffic).
const RESERVE_DIVISOR: u64 = 16;
/// An inbound client address may hold this fraction of the inbound limit by default, so one
/// flooding pod cannot take the inbound side from every other client.
const PER_SOURCE_DIVISOR: usize = 4;

/// How many connections are served at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub inbound: usize,
    pub outbound: usize,
    /// Inbound connections from one client IP. Outbound connections all come from this pod's
    /// own application, so they have no per-source limit.
    pub inbound_per_source: usize,
}

impl Limits {
    /// The most connections one direction may hold with `nofile` descriptors: each takes up to
    /// two, after the reserve.
    pub fn direction_budget(nofile: u64) -> usize {
        let reserve = (nofile / RESERVE_DIVISOR).max(MIN_RESERVE);
        usize::try_from(nofile.saturating_sub(reserve) / 2).unwrap_or(usize::MAX).max(1)
    }

    /// The defaults for a descriptor limit of `nofile`: each direction half of the budget, so
    /// both full at once stay within it.
    pub fn for_fd_limit(nofile: u64) -> Self {
        let direction = (Self::direction_budget(nofile) / 2).max(1);
        Self { inbound: direction, outbound: direction, inbound_per_source: (direction / PER_SOURCE_DIVISOR).max(1) }
    }

    /// `config`'s limits where set, the defaults for `nofile` elsewhere. A configured limit the
    /// descriptors cannot back is lowered to what they can, with a warning: a limit above the
    /// budget would bring back the failure it exists to prevent.
    pub fn resolve(config: &Config, nofile: u64) -> Self {
        let defaults = Self::for_fd_limit(nofile);
        let budget = Self::direction_budget(nofile);
        let pick = |var: &str, set: Option<usize>, default: usize, cap: usize| match set {
            Some(n) if n > cap => {
                tracing::warn!(
                    var,
                    configured = n,
                    used = cap,
                    nofile,
                    "connection limit above what the open-file limit allows; lowered"
                );
                cap
            }
            Some(n) => n,
            None => default.min(cap),
        };
        let inbound =
            pick("CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS", config.inbound_max_connections, defaults.inbound, budget);
        let outbound =
            pick("CNIMESH_PROXY_OUTBOUND_MAX_CONNECTIONS", config.outbound_max_connections, defaults.outbound, budget);
        let inbound_per_source = pick(
            "CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS_PER_SOURCE",
            config.inbound_max_connections_per_source,
            (inbound / PER_SOURCE_DIVISOR).max(1),
            inbound,
        );
        Self { inbound, outbound, inbound_per_source }
    }
}

/// The process's current descriptor limit (the soft one, which is what accept() runs into).
pub fn fd_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft)
}

/// Open connections of one direction, and per client address where that is limited.
#[derive(Debug)]
struct Gate {
    max: usize,
    per_source: Option<usize>,
    open: AtomicUsize,
    by_source: Mutex<HashMap<IpAddr, usize>>,
}

impl Gate {
    fn new(max: usize, per_source: Option<usize>) -> Arc<Self> {
        Arc::new(Self { max, per_source, open: AtomicUsize::new(0), by_source: Mutex::default() })
    }

    fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Permit, AcceptError> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(AcceptError::connection_limit);
        }
        let Some(per_source) = self.per_source else {
            return Ok(Permit { gate: self.clone(), source: None });
        };
        let mut by_source = self.by_source.lock();
        let held = by_source.entry(source).or_default();
        if *held >= per_source {
            drop(by_source);
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(AcceptError::source_limit);
        }
        *held += 1;
        Ok(Permit { gate: self.clone(), source: Some(source) })
    }
}

/// One admitted connection; its place is given back when dropped.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    source: Option<IpAddr>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(source) = self.source {
            let mut by_source = self.gate.by_source.lock();
            if let Some(held) = by_source.get_mut(&source) {
                *held -= 1;
                if *held == 0 {
                    by_source.remove(&source);
                }
            }
        }
        self.gate.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The proxy's admission: one gate per direction.
#[derive(Debug)]
pub struct Admission {
    pub limits: Limits,
    inbound: Arc<Gate>,
    outbound: Arc<Gate>,
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            inbound: Gate::new(limits.inbound, Some(limits.inbound_per_source)),
            outbound: Gate::new(limits.outbound, None),
        }
    }

    /// A place for a connection from `source`, or why there is none
    /// ([`AcceptError::connection_limit`] or [`AcceptError::source_limit`]).
    pub fn admit(&self, direction: Direction, source: IpAddr) -> Result<Permit, AcceptError> {
        match direction {
            Direction::inbound => self.inbound.admit(source),
            Direction::outbound => self.outbound.admit(source),
        }
    }

    /// Connections admitted and still open in `direction`.
    pub fn open(&self, direction: Direction) -> usize {
        match direction {
            Direction::inbound => self.inbound.open.load(Ordering::Acquire),
            Direction::outbound => self.outbound.open.load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_keep_both_directions_within_the_descriptors() {
        let l = Limits::for_fd_limit(20_000);
        // 1 250 reserved, 18 750 for connections of two descriptors each, half per direction.
        assert_eq!(l, Limits { inbound: 4687, outbound: 4687, inbound_per_source: 1171 });
        assert!(2 * (l.inbound + l.outbound) as u64 + 20_000 / 16 <= 20_000);
        let small = Limits::for_fd_limit(256);
        assert_eq!(small, Limits { inbound: 48, outbound: 48, inbound_per_source: 12 });
        assert_eq!(Limits::for_fd_limit(10).inbound, 1, "never zero");
    }

    #[test]
    fn configured_limits_win_but_never_beyond_the_descriptors() {
        let config = Config {
            inbound_max_connections: Some(50),
            outbound_max_connections: Some(1_000_000),
            inbound_max_connections_per_source: Some(500),
            ..Config::default()
        };
        let l = Limits::resolve(&config, 256);
        assert_eq!(l, Limits { inbound: 50, outbound: 96, inbound_per_source: 50 });
        let only_inbound = Config { inbound_max_connections: Some(40), ..Config::default() };
        assert_eq!(Limits::resolve(&only_inbound, 20_000).inbound_per_source, 10, "a share of the configured limit");
    }

    #[test]
    fn sheds_beyond_each_limit_and_gives_places_back() {
        let a = Admission::new(Limits { inbound: 3, outbound: 1, inbound_per_source: 2 });
        let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = a.admit(Direction::inbound, one).unwrap();
        let _second = a.admit(Direction::inbound, one).unwrap();
        assert_eq!(a.admit(Direction::inbound, one).unwrap_err(), AcceptError::source_limit);
        let _other = a.admit(Direction::inbound, two).unwrap();
        assert_eq!(a.admit(Direction::inbound, two).unwrap_err(), AcceptError::connection_limit);
        assert_eq!(a.open(Direction::inbound), 3);
        drop(first);
        assert_eq!(a.open(Direction::inbound), 2);
        let _again = a.admit(Direction::inbound, one).expect("a freed place is reused");
        // Outbound: one place, no per-source limit.
        let _out = a.admit(Direction::outbound, one).unwrap();
        assert_eq!(a.admit(Direction::outbound, two).unwrap_err(), AcceptError::connection_limit);
        assert!(a.inbound.by_source.lock().len() <= 2, "no entries for sources without connections");
    }
}
