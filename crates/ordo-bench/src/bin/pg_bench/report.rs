//! The figures, each beside its goal on this kind of machine and, at the end,
//! the published reference.

use crate::cpu::CpuUse;
use crate::latency::LatencyResult;
use crate::options::{Lists, Options};
use crate::stream::StreamResult;

pub const COPY_GOAL_ROWS_PER_SECOND: f64 = 200_000.0;
pub const STREAMING_GOAL_ROWS_PER_SECOND: f64 = 50_000.0;
pub const LATENCY_GOAL_P99_MS: f64 = 20.0;
const REFERENCE: &str = "ElectricSQL's published figure: 20 000 updates/s delivered under 100 ms (for Trigger.dev)";

fn verdict(met: bool, options: &Options) -> &'static str {
    match (met, options.quick) {
        (true, _) => "met",
        (false, false) => "MISSED",
        (false, true) => "missed (quick sizes: not held to it)",
    }
}

/// `12345678.9` → `12 345 679`: figures of six or seven digits read at a glance.
pub fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut text = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            text.push(' ');
        }
        text.push(digit);
    }
    text
}

pub fn copy(options: &Options, copy_seconds: f64) {
    let rate = options.rows as f64 / copy_seconds;
    println!(
        "initial copy: {} rows in {copy_seconds:.2} s (process start to `following PostgreSQL`) = {} rows/s   goal ≥ {} rows/s: {}",
        grouped(options.rows as f64),
        grouped(rate),
        grouped(COPY_GOAL_ROWS_PER_SECOND),
        verdict(rate >= COPY_GOAL_ROWS_PER_SECOND, options)
    );
}

pub fn streaming(options: &Options, result: &StreamResult, cores: &CpuUse) {
    let batch = options.batch as f64;
    let applied_rate = result.applied_in_phase as f64 * batch / result.seconds;
    let committed_rate = result.committed_in_phase as f64 * batch / result.seconds;
    println!(
        "streaming: applied by Ordo {} rows/s over {:.1} s   goal ≥ {} rows/s: {}",
        grouped(applied_rate),
        result.seconds,
        grouped(STREAMING_GOAL_ROWS_PER_SECOND),
        verdict(applied_rate >= STREAMING_GOAL_ROWS_PER_SECOND, options)
    );
    let behind = result.committed_in_phase.saturating_sub(result.applied_in_phase);
    println!(
        "  PostgreSQL committed {} rows/s ({} writers, {} rows per transaction); at the end Ordo was {behind} transactions behind \
         (lag {} bytes, {:.3} s) and applied the last of {} {:.2} s later; `ordo serve` used {}; the machine: {}",
        grouped(committed_rate),
        options.writers,
        options.batch,
        grouped(result.at_end.lag_bytes as f64),
        result.at_end.lag_seconds,
        result.committed,
        result.drain_seconds,
        cores.ordo,
        cores.machine,
    );
    // With the writers stopped, PostgreSQL's backends no longer compete with
    // the server for the cores: the backlog's rate is the follower's own.
    let backlog = result.committed.saturating_sub(result.applied_in_phase);
    if backlog > 0 && result.drain_seconds > 0.0 {
        println!(
            "  Ordo applied the backlog of {backlog} transactions, once the writers stopped, at {} rows/s",
            grouped(backlog as f64 * batch / result.drain_seconds)
        );
    }
}

/// Prints the latency figures; returns the number of subscribers with a problem.
pub fn latency(options: &Options, result: &LatencyResult, cores: &CpuUse) -> usize {
    let histogram = &result.counters.latency_us;
    let ms = |us: u64| us as f64 / 1000.0;
    let p99 = ms(histogram.quantile(0.99));
    println!(
        "commit → frame: p50 {:.2} ms, p99 {p99:.2} ms, max {:.2} ms over {} updates seen, {} subscribers ({}) at {} rows/s   goal p99 ≤ {LATENCY_GOAL_P99_MS} ms: {}",
        ms(histogram.quantile(0.5)),
        ms(histogram.max()),
        grouped(histogram.len() as f64),
        options.subscribers,
        match options.lists {
            Lists::Shared => "all on the same top rooms",
            Lists::Own => "each on its own rooms",
        },
        grouped(options.rate),
        verdict(!histogram.is_empty() && p99 <= LATENCY_GOAL_P99_MS, options)
    );
    let achieved = result.transactions as f64 * options.batch as f64 / result.write_seconds;
    let expected = match options.lists {
        // All rows of a transaction share its send time: the window shows as many of them as it holds.
        Lists::Shared => result.transactions * options.batch.min(options.window) as u64 * options.subscribers as u64,
        // A row goes to the top of its owner's list, and only there (a
        // transaction holds fewer rows of one owner than a window holds).
        Lists::Own => result.transactions * options.batch as u64,
    };
    let delivered = result.counters.snapshot();
    println!(
        "  sent {} rows/s in {} transactions (latest send {:.1} ms behind schedule); updates seen {} of {} expected; \
         {} frames ({:.0} MB/s); first frames after {:.2} s; `ordo serve` used {}, pg-bench (its subscribers) {}; the machine: {}",
        grouped(achieved),
        result.transactions,
        result.max_send_delay.as_secs_f64() * 1000.0,
        grouped(histogram.len() as f64),
        grouped(expected as f64),
        grouped(delivered.frames as f64),
        delivered.bytes as f64 / 1e6 / result.write_seconds,
        result.subscribe_seconds,
        cores.ordo,
        cores.own,
        cores.machine,
    );
    problems(result)
}

fn problems(result: &LatencyResult) -> usize {
    let troubled: Vec<_> = result
        .outcomes
        .iter()
        // A Reset after the first frame is no problem: the server may send one
        // when a transaction replaces the whole window, and it shows every item.
        .filter(|outcome| {
            outcome.protocol_errors + outcome.seq_gaps + outcome.error_frames > 0
                || outcome.closed.is_some()
                || !outcome.subscribed
        })
        .collect();
    if let Some(first) = troubled.first() {
        let problem = first.first_problem.clone().or_else(|| first.closed.clone()).unwrap_or_default();
        println!("  {} subscribers had a problem; the first: {problem}", troubled.len());
    }
    troubled.len()
}

pub fn reference() {
    println!("reference: {REFERENCE}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_figures_are_grouped_by_thousands() {
        assert_eq!(grouped(0.4), "0");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1_000.0), "1 000");
        assert_eq!(grouped(200_000.0), "200 000");
        assert_eq!(grouped(1_234_567.8), "1 234 568");
    }
}
