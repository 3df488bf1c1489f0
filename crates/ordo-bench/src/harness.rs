//! The timing harness shared by Ordo and the peers.
//!
//! # How an operation is timed
//! [`time_ops`] runs a closure `op(i)` for `i = 0, 1, 2, …`: first a warm-up
//! (untimed), then timed operations until either `max_ops` were timed, or at
//! least `min_ops` were timed and the time budget is spent. **Each operation
//! is timed on its own** with [`Instant::now`] before and after (no batching),
//! so median and p99 are true per-operation figures for every system; the
//! cost of the two clock reads (about 20–40 ns on Linux, see
//! [`timer_overhead_ns`]) is included in every sample and is not subtracted.
//!
//! The closure returns `(diffs, keep)`: `diffs` is the number of diffs the
//! operation produced (0 for systems without diffs), and `keep` is any value
//! whose drop must not be timed (an old pipeline, a freshly created view…):
//! it is dropped after the clock is read.
//!
//! Allocations are read from the counting allocator just before and just
//! after each operation; `allocs_per_op` is their total over the timed
//! operations divided by their number.
//!
//! Operation `i` of every system uses the same input (e.g. `updates[i]`), so
//! the inputs must hold at least [`OpPlan::inputs`] entries.

use std::time::{Duration, Instant};

use ordo_test_kit::alloc as alloc_counter;

/// How many operations to run and for how long; identical for every system
/// of one (scenario, N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpPlan {
    /// Untimed operations first (cut short once half the budget is spent,
    /// but at least one is run).
    pub warmup: usize,
    /// Timed operations never stop before this many.
    pub min_ops: usize,
    /// Timed operations never go beyond this many.
    pub max_ops: usize,
    /// Past this much wall time (warm-up included), stop as soon as
    /// `min_ops` are timed.
    pub budget: Duration,
}

impl OpPlan {
    /// The most operation indices `time_ops` can pass to `op`:
    /// `warmup + max_ops`. Size input streams (updates…) to this.
    pub fn inputs(&self) -> usize {
        self.warmup + self.max_ops
    }
}

/// Raw per-operation samples of one timed run.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Index passed to `op` for the first timed sample.
    pub first_index: usize,
    /// Nanoseconds per operation.
    pub ns: Vec<u64>,
    /// Allocations per operation.
    pub allocs: Vec<u64>,
    /// Diffs per operation.
    pub diffs: Vec<u64>,
}

/// The figures reported for one system in one (scenario, N, dist).
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Number of timed operations.
    pub ops: usize,
    /// Median ns per operation.
    pub ns_median: u64,
    /// 99th percentile (nearest rank) ns per operation.
    pub ns_p99: u64,
    /// Heap allocations per operation (mean).
    pub allocs_per_op: f64,
    /// Diffs per operation (mean); `None` for systems that produce no diffs.
    pub diffs_per_op: Option<f64>,
    /// Extra named figures (e.g. memory per collection in `many-lists`),
    /// printed as extra columns / JSON fields.
    pub extra: Vec<(&'static str, f64)>,
}

impl Measurement {
    /// Adds an extra figure.
    pub fn with_extra(mut self, name: &'static str, value: f64) -> Self {
        self.extra.push((name, value));
        self
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Samples {
    /// Number of timed operations.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether nothing was timed.
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    fn measure_indices(&self, idx: impl Iterator<Item = usize>, with_diffs: bool) -> Measurement {
        let idx: Vec<usize> = idx.collect();
        let mut ns: Vec<u64> = idx.iter().map(|&j| self.ns[j]).collect();
        ns.sort_unstable();
        let ops = ns.len();
        let per_op = |v: &[u64]| {
            if ops == 0 {
                0.0
            } else {
                idx.iter().map(|&j| v[j]).sum::<u64>() as f64 / ops as f64
            }
        };
        Measurement {
            ops,
            ns_median: percentile(&ns, 0.5),
            ns_p99: percentile(&ns, 0.99),
            allocs_per_op: per_op(&self.allocs),
            diffs_per_op: with_diffs.then(|| per_op(&self.diffs)),
            extra: Vec::new(),
        }
    }

    /// All samples as one measurement. `with_diffs` is false for systems
    /// that produce no diffs (the naive peers).
    pub fn measurement(&self, with_diffs: bool) -> Measurement {
        self.measure_indices(0..self.len(), with_diffs)
    }

    /// One measurement per operation kind, where operation `i` is of kind
    /// `i % kinds` (e.g. the 18 steps of `load-more`, the 4 switches of
    /// `filter-switch`).
    pub fn grouped(&self, kinds: usize, with_diffs: bool) -> Vec<Measurement> {
        (0..kinds)
            .map(|k| {
                let idx = (0..self.len()).filter(|j| (self.first_index + j) % kinds == k);
                self.measure_indices(idx, with_diffs)
            })
            .collect()
    }
}

/// Runs `op` according to `plan`; see the module documentation.
pub fn time_ops<T>(plan: &OpPlan, mut op: impl FnMut(usize) -> (usize, T)) -> Samples {
    let start = Instant::now();
    let mut i = 0;
    while i < plan.warmup {
        let _keep = op(i);
        i += 1;
        if start.elapsed() > plan.budget / 2 {
            break;
        }
    }
    let mut s = Samples {
        first_index: i,
        ns: Vec::with_capacity(plan.max_ops),
        allocs: Vec::with_capacity(plan.max_ops),
        diffs: Vec::with_capacity(plan.max_ops),
    };
    while s.ns.len() < plan.max_ops {
        let a0 = alloc_counter::allocations();
        let t0 = Instant::now();
        let (diffs, keep) = op(i);
        let t1 = Instant::now();
        let a1 = alloc_counter::allocations();
        drop(keep);
        s.ns.push((t1 - t0).as_nanos() as u64);
        s.allocs.push(a1 - a0);
        s.diffs.push(diffs as u64);
        i += 1;
        if s.ns.len() >= plan.min_ops && start.elapsed() > plan.budget {
            break;
        }
    }
    s
}

/// Median cost in ns of one `Instant::now()` pair, as included in every
/// sample.
pub fn timer_overhead_ns() -> u64 {
    let mut v: Vec<u64> = (0..1001)
        .map(|_| {
            let t0 = Instant::now();
            let t1 = Instant::now();
            (t1 - t0).as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Resident set size of this process in bytes, from `/proc/self/statm`
/// (assumes 4 KiB pages); `None` where that file does not exist.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: glibc's malloc_trim only releases free memory to the OS.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

/// Memory probe for `many-lists`: the RSS and live-heap growth while a
/// system builds its collections.
#[derive(Debug, Clone, Copy)]
pub struct MemProbe {
    rss: Option<u64>,
    heap: i64,
}

impl MemProbe {
    /// Takes the "before" reading (after returning free heap pages to the OS,
    /// so that memory freed by an earlier system does not hide this one's).
    pub fn start() -> Self {
        trim_heap();
        MemProbe { rss: rss_bytes(), heap: alloc_counter::live_bytes() }
    }

    /// Memory growth since `start`, divided by `units`. Call it right after
    /// building, before the timed operations.
    pub fn per_unit(&self, units: usize) -> MemFigures {
        let units = units.max(1) as f64;
        let rss = match (self.rss, rss_bytes()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / units),
            _ => None,
        };
        let heap = (alloc_counter::live_bytes() - self.heap) as f64 / units;
        MemFigures { rss, heap }
    }
}

/// Memory per unit (per collection in `many-lists`), from [`MemProbe`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemFigures {
    /// RSS growth per unit (bytes), where `/proc/self/statm` exists.
    pub rss: Option<f64>,
    /// Live-heap growth per unit (bytes, requested sizes).
    pub heap: f64,
}

impl MemFigures {
    /// Adds `rss_bytes_per_collection` and `heap_bytes_per_collection` to `m`.
    pub fn attach(self, m: Measurement) -> Measurement {
        let m = match self.rss {
            Some(r) => m.with_extra("rss_bytes_per_collection", r),
            None => m,
        };
        m.with_extra("heap_bytes_per_collection", self.heap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
    }

    #[test]
    fn time_ops_respects_plan_and_groups() {
        let plan = OpPlan { warmup: 3, min_ops: 8, max_ops: 8, budget: Duration::from_secs(10) };
        let mut seen = Vec::new();
        let s = time_ops(&plan, |i| {
            seen.push(i);
            (i % 2, ())
        });
        assert_eq!(seen, (0..11).collect::<Vec<_>>());
        assert_eq!(s.first_index, 3);
        assert_eq!(s.len(), 8);
        let g = s.grouped(2, true);
        // Indices 3..11: odd ones produce 1 diff.
        assert_eq!(g[0].diffs_per_op, Some(0.0));
        assert_eq!(g[1].diffs_per_op, Some(1.0));
        assert_eq!(g[0].ops + g[1].ops, 8);
        assert_eq!(s.measurement(false).diffs_per_op, None);
    }

    #[test]
    fn budget_stops_after_min_ops() {
        let plan = OpPlan { warmup: 0, min_ops: 2, max_ops: 1000, budget: Duration::from_millis(1) };
        let s = time_ops(&plan, |_| {
            std::thread::sleep(Duration::from_millis(1));
            (0, ())
        });
        assert_eq!(s.len(), 2);
    }
}
