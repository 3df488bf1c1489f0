//! The sustained streaming rate: writers send transactions to PostgreSQL as
//! fast as it commits them for the phase's length; Ordo's `/v1/health` counts
//! the transactions it applied over the same interval, then how long it took to
//! apply the rest.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_bench::live::stats::Clock;
use ordo_bench::live::Result;
use ordo_pgsource::ConnectConfig;
use tokio::task::JoinSet;

use crate::options::Options;
use crate::ordo::{FollowerSample, Health};
use crate::postgres::connect;
use crate::updates::{streaming_update, RowPicker};

/// What the phase measured.
pub struct StreamResult {
    pub seconds: f64,
    /// Transactions PostgreSQL committed during the phase...
    pub committed_in_phase: u64,
    /// ...and in all, with those in flight when the writers stopped.
    pub committed: u64,
    /// Applied by Ordo between the phase's start and its end.
    pub applied_in_phase: u64,
    /// The follower when the writers stopped.
    pub at_end: FollowerSample,
    /// From the writers' stop until Ordo applied the last committed transaction.
    pub drain_seconds: f64,
}

/// One writer: transactions of `batch` of its own rows, one after the other,
/// until `stop`; counts those PostgreSQL committed.
async fn write_until_stopped(
    config: ConnectConfig,
    mut picker: RowPicker,
    batch: usize,
    clock: Clock,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
) -> Result<()> {
    let mut connection = connect(&config).await?;
    while !stop.load(Ordering::Relaxed) {
        let rows = picker.pick(batch);
        connection.execute(&streaming_update(&rows, clock.now_us())).await?;
        committed.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Runs the phase; `health` reads the follower of the `ordo serve` under test.
pub async fn run(options: &Options, config: &ConnectConfig, health: &mut Health, clock: Clock) -> Result<StreamResult> {
    let applied_before = health.sample().await?.transactions_applied;
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let mut writers = JoinSet::new();
    let started = Instant::now();
    for writer in 0..options.writers {
        let picker = RowPicker::new(options.seed, writer, options.writers, options.rows);
        let task = write_until_stopped(
            config.clone(),
            picker,
            options.batch,
            clock,
            Arc::clone(&stop),
            Arc::clone(&committed),
        );
        writers.spawn(task);
    }
    let phase = Duration::from_secs_f64(options.seconds);
    let mut next_progress = Duration::from_secs(1);
    while started.elapsed() < phase {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if started.elapsed() >= next_progress {
            next_progress += Duration::from_secs(1);
            let sample = health.sample().await?;
            println!(
                "  streaming: {:.0} s, {} transactions committed, {} applied by Ordo, lag {} bytes",
                started.elapsed().as_secs_f64(),
                committed.load(Ordering::Relaxed),
                sample.transactions_applied - applied_before,
                sample.lag_bytes
            );
        }
        // A writer ends only on an error: PostgreSQL's, for the report.
        if let Some(joined) = writers.try_join_next() {
            joined??;
            return Err("a writer stopped early".into());
        }
    }
    let at_end = health.sample().await?;
    let seconds = started.elapsed().as_secs_f64();
    let committed_in_phase = committed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = writers.join_next().await {
        joined??;
    }
    // Transactions in flight at the stop committed after it: counted in the drain.
    let committed = committed.load(Ordering::Relaxed);
    let drain_timeout = Duration::from_secs(60).max(phase * 10);
    let drained = health.wait_applied(applied_before + committed, drain_timeout).await?;
    Ok(StreamResult {
        seconds,
        committed_in_phase,
        committed,
        applied_in_phase: at_end.transactions_applied - applied_before,
        at_end,
        drain_seconds: drained.at.duration_since(at_end.at).as_secs_f64(),
    })
}
