//! The result lines every scenario prints the same way.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use ordo_bench::live::http::metric;
use ordo_bench::live::phase::LiveResult;
use ordo_bench::live::stats::{megabytes, ms};
use ordo_bench::live::subscriber::SubscriberOutcome;

/// The goal of a run with `--auth` against one without (`SCENARIOS.md`).
const AUTH_GOAL: &str = "auth goal: p99 and server CPU within 5 % of the same run without --auth";

/// The lines both scenarios print the same way.
pub fn print_common(live: &LiveResult, rate_target: f64, n_subscribers: usize) {
    let write = &live.write;
    let acked = live.stats.acked.load(Ordering::Relaxed);
    let requests = live.stats.requests.load(Ordering::Relaxed).max(1);
    let seconds = write.write_seconds;
    println!(
        "  writes: {:.0} updates/s achieved of {rate_target:.0} ({acked} acknowledged in {seconds:.2} s; {} requests of ~{:.0} ops; {} refused; {} ticks without an idle connection)",
        acked as f64 / seconds,
        requests,
        write.generated as f64 / requests as f64,
        live.stats.refused.load(Ordering::Relaxed),
        write.stalled_ticks,
    );
    println!(
        "  write ack latency: p50 {}, p99 {}, max {}",
        ms(live.stats.ack_latency_us.quantile(0.50)),
        ms(live.stats.ack_latency_us.quantile(0.99)),
        ms(live.stats.ack_latency_us.max()),
    );
    if let Some(failure) = live.stats.first_failure.lock().expect("no panics while holding it").as_ref() {
        println!("  write failures: {} requests; first: {failure}", live.stats.failed_requests.load(Ordering::Relaxed));
    }
    let delivered = live.delivered;
    println!(
        "  delivered: {:.0} frames/s, {:.0} diffs/s, {}/s to all subscribers ({:.1} kB/s each); settled {:.2} s after the last write",
        delivered.frames as f64 / seconds,
        delivered.diffs as f64 / seconds,
        megabytes(delivered.bytes as f64 / seconds),
        delivered.bytes as f64 / seconds / n_subscribers as f64 / 1e3,
        live.settle_seconds,
    );
    let latency = &live.counters.latency_us;
    println!(
        "  end-to-end latency: p50 {}, p90 {}, p99 {}, max {} ({} updates received, counted once per subscriber)",
        ms(latency.quantile(0.50)),
        ms(latency.quantile(0.90)),
        ms(latency.quantile(0.99)),
        ms(latency.max()),
        latency.len(),
    );
}

/// Correctness failures seen in any scenario (lost updates, lists unequal to a
/// query, sequence gaps, protocol errors): the run exits non-zero if there are any.
/// Timings are never checked.
pub static CORRECTNESS_FAILURES: AtomicU64 = AtomicU64::new(0);

pub fn count_failures(n: u64) {
    CORRECTNESS_FAILURES.fetch_add(n, Ordering::Relaxed);
}

pub fn print_checks(live: &LiveResult, n_mismatches: usize, first_mismatch: Option<String>) {
    let sum = |field: fn(&SubscriberOutcome) -> u64| live.outcomes.iter().map(field).sum::<u64>();
    let n_closed = live.outcomes.iter().filter(|outcome| outcome.closed.is_some()).count();
    count_failures(n_mismatches as u64 + sum(|outcome| outcome.seq_gaps) + sum(|outcome| outcome.protocol_errors));
    println!(
        "  checks: {n_mismatches} mismatches of {} lists against a query; {} seq gaps, {} protocol errors, {} error frames, {n_closed} connections closed early",
        live.outcomes.len(),
        sum(|outcome| outcome.seq_gaps),
        sum(|outcome| outcome.protocol_errors),
        sum(|outcome| outcome.error_frames),
    );
    if let Some(mismatch) = first_mismatch {
        println!("    first mismatch: {mismatch}");
    }
    if let Some(problem) = live.outcomes.iter().find_map(|outcome| outcome.first_problem.as_ref()) {
        println!("    first problem: {problem}");
    }
    if let Some(closed) = live.outcomes.iter().find_map(|outcome| outcome.closed.as_ref()) {
        println!("    first closed connection: {closed}");
    }
}

pub fn print_costs(live: &LiveResult) {
    match (&live.server_cpu, live.server_memory) {
        (Some(cpu), Some((rss, hwm))) => println!(
            "  server: {cpu} over the write phase; VmRSS {}, VmHWM {}",
            megabytes(rss as f64),
            megabytes(hwm as f64)
        ),
        _ => println!("  server: CPU and memory not measured (not started by loadgen)"),
    }
    if let Some(cpu) = &live.loadgen_cpu {
        println!("  loadgen: {cpu} over the write phase (`loadgen`: the writer; `loadgen-subs`: the subscribers)");
    }
    if let Some(delays) = &live.wake_delays {
        println!(
            "  machine: a thread sleeping 1 ms woke late by p50 {}, p99 {}, p99.9 {}, max {} ({} wake-ups; each hop of the pipeline is such a wake-up)",
            ms(delays.quantile(0.5)),
            ms(delays.quantile(0.99)),
            ms(delays.quantile(0.999)),
            ms(delays.max()),
            delays.len()
        );
    }
    if let Some(machine) = &live.machine_cores {
        let others = machine.others.map_or(String::new(), |others| format!("; {others:.2} by other processes"));
        println!(
            "  machine: {:.2} cores busy over the write phase{others}; {:.2} cores stolen by the hypervisor",
            machine.busy, machine.steal
        );
    }
}

/// With `--auth`: tokens the server refused over the whole run (any is a
/// failure: every token loadgen sends is valid), and the goal.
pub fn print_auth(live: &LiveResult, auth: bool) {
    if !auth {
        return;
    }
    let refused: Option<f64> = live.metrics_after.as_ref().map(|metrics| {
        metrics.iter().filter(|(name, _)| name.starts_with("ordo_auth_failures_total")).map(|(_, value)| value).sum()
    });
    match refused {
        Some(refused) => {
            count_failures(refused as u64);
            println!("  auth: {refused:.0} tokens refused by the server over the whole run (ordo_auth_failures_total)");
        }
        None => println!("  auth: refused tokens unknown (/metrics unavailable)"),
    }
    println!("  {AUTH_GOAL}");
}

pub fn print_metric_deltas(live: &LiveResult, names: &[&str]) {
    if live.metrics_before.is_none() || live.metrics_after.is_none() {
        println!("  server /metrics: unavailable");
        return;
    }
    let mut line = String::from("  server /metrics Δ (write phase + settle):");
    for name in names {
        match (metric(&live.metrics_before, name), metric(&live.metrics_after, name)) {
            (Some(before), Some(after)) => write!(line, " {name} {:.0};", after - before).expect("writing to a String"),
            _ => write!(line, " {name} absent;").expect("writing to a String"),
        }
    }
    println!("{}", line.trim_end_matches(';'));
}

/// The server's `ordo_stage_seconds` histograms over the write phase: where a
/// write's latency goes, step by step. Quantiles are bucket upper bounds.
pub fn print_stage_latencies(live: &LiveResult) {
    const STAGES: [&str; 5] = ["write_queue", "log_append", "apply", "frame_queue", "socket_write"];
    let (Some(before), Some(after)) = (&live.metrics_before, &live.metrics_after) else { return };
    println!("  server stages (count, mean, p50 ≤, p99 ≤, p99.9 ≤, max ≤; ms):");
    for stage in STAGES {
        let prefix = format!("ordo_stage_seconds_bucket{{stage=\"{stage}\",le=\"");
        // (upper bound in seconds, cumulative count in the write phase)
        let buckets: Vec<(f64, f64)> = after
            .iter()
            .filter_map(|(name, value)| {
                let bound = name.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let bound = if bound == "+Inf" { f64::INFINITY } else { bound.parse().ok()? };
                let earlier = before.iter().find(|(other, _)| other == name).map_or(0.0, |(_, value)| *value);
                Some((bound, value - earlier))
            })
            .collect();
        let Some(&(_, count)) = buckets.last() else { continue };
        if count == 0.0 {
            println!("    {stage:>13}: none");
            continue;
        }
        let quantile = |q: f64| {
            let bound = buckets.iter().find(|(_, cumulative)| *cumulative >= q * count).map_or(f64::INFINITY, |b| b.0);
            if bound.is_finite() {
                format!("{:.3}", bound * 1e3)
            } else {
                "inf".to_owned()
            }
        };
        let sum_name = format!("ordo_stage_seconds_sum{{stage=\"{stage}\"}}");
        let sum = metric(&live.metrics_after, &sum_name).unwrap_or(0.0)
            - metric(&live.metrics_before, &sum_name).unwrap_or(0.0);
        println!(
            "    {stage:>13}: {count:>8.0}  {:>7.3}  {:>7}  {:>7}  {:>7}  {:>7}",
            sum / count * 1e3,
            quantile(0.5),
            quantile(0.99),
            quantile(0.999),
            quantile(1.0)
        );
    }
}
