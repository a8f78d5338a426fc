//! What the background reader ([`super::api::run_sampler`]) keeps: every `--interval` it lists the
//! pods and Services and reads every meshed proxy's metrics exactly as `cnimesh stat` does
//! ([`crate::stat::Sources`]); this keeps the last two readings (a window's rates come from them), and appends each workload's golden
//! metrics to a ten-minute history for the page's sparklines. Every value carries the time it was
//! observed; a failed round keeps the last good data (marked stale by its age) and the error.
//! For the page's time ranges it also keeps one reading every [`KEEP_EVERY`] for the longest
//! range: a range's rates are the counters' deltas between the reading that starts it and the last.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::problem::ApiError;
use crate::stat::compute::{self, Query, Scrapes};
use crate::stat::mesh::{Mesh, Resource};
use crate::stat::{Readings, join};

/// How much history the sparklines get.
pub const HISTORY: Duration = Duration::from_secs(600);
/// How far apart the readings kept for time ranges are.
pub const KEEP_EVERY: Duration = Duration::from_secs(15);
/// The longest time range the page offers.
pub const LONGEST_RANGE: Duration = Duration::from_secs(15 * 60);

/// The kinds whose rows are kept in the history (what the workloads page lists).
pub const HISTORY_KINDS: [&str; 3] = ["deploy", "sts", "ds"];

/// One point of a workload's sparkline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// Unix seconds.
    pub t: f64,
    pub rps: f64,
    pub success_rate: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// What the last rounds read.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The pods and Services of the last good round.
    pub mesh: Mesh,
    /// The last reading alone (what `edges` reads) and when it was taken.
    pub latest: Option<(SystemTime, Readings)>,
    /// The last two readings and the time between them (what `stat` reads), once there are two.
    pub window: Option<(SystemTime, Duration, Scrapes)>,
    /// Why the last round failed, if it did.
    pub error: Option<ApiError>,
    /// By `namespace/kind/name`, oldest first.
    pub history: BTreeMap<String, VecDeque<Point>>,
    /// Readings [`KEEP_EVERY`] apart over the [`LONGEST_RANGE`], oldest first.
    pub kept: VecDeque<(SystemTime, Readings)>,
}

impl Snapshot {
    /// Takes one round's result: `Ok` the mesh and its reading at `at`, `Err` why not.
    pub fn record(&mut self, at: SystemTime, result: Result<(Mesh, Readings), ApiError>) {
        let (mesh, readings) = match result {
            Ok(round) => round,
            Err(error) => {
                self.error = Some(error);
                return;
            }
        };
        self.error = None;
        if let Some((then, before)) = self.latest.take() {
            let window = at.duration_since(then).unwrap_or_default();
            let scrapes = join(before, &readings);
            self.append_history(at, &mesh, &scrapes, window);
            self.window = Some((at, window, scrapes));
        }
        self.mesh = mesh;
        if self.kept.back().is_none_or(|(last, _)| at.duration_since(*last).unwrap_or_default() >= KEEP_EVERY) {
            self.kept.push_back((at, readings.clone()));
        }
        // The reading just older than the longest range stays: it starts that range.
        while self.kept.get(1).is_some_and(|(t, _)| at.duration_since(*t).unwrap_or_default() >= LONGEST_RANGE) {
            self.kept.pop_front();
        }
        self.latest = Some((at, readings));
    }

    /// The scrapes over about the last `range`: from the newest kept reading at least `range`
    /// old (the oldest kept while the dashboard has run for less) to the last one, with the
    /// window they actually span. `None` before two readings.
    pub fn over(&self, range: Duration) -> Option<(SystemTime, Duration, Scrapes)> {
        let (at, latest) = self.latest.as_ref()?;
        let age = |t: &SystemTime| at.duration_since(*t).unwrap_or_default();
        let start = self.kept.iter().rev().find(|(t, _)| age(t) >= range).or_else(|| self.kept.front())?;
        let window = age(&start.0);
        if window.is_zero() {
            return None;
        }
        Some((*at, window, join(start.1.clone(), latest)))
    }

    fn append_history(&mut self, at: SystemTime, mesh: &Mesh, scrapes: &Scrapes, window: Duration) {
        let t = unix(at);
        for kind in HISTORY_KINDS {
            let query = Query {
                resource: kind.parse::<Resource>().expect("a known kind"),
                namespace: None,
                from: None,
                to: None,
                window,
            };
            for row in compute::stat(mesh, scrapes, &query) {
                let key = format!("{}/{}/{}", row.namespace, row.kind, row.name);
                let points = self.history.entry(key).or_default();
                points.push_back(Point {
                    t,
                    rps: row.rps,
                    success_rate: row.success_rate,
                    p99_ms: row.latency_ms.map(|l| l.p99),
                });
            }
        }
        let oldest = t - HISTORY.as_secs_f64();
        for points in self.history.values_mut() {
            while points.front().is_some_and(|p| p.t < oldest) {
                points.pop_front();
            }
        }
        self.history.retain(|_, points| !points.is_empty());
    }
}

/// Unix seconds of `at`.
pub fn unix(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
