//! Commit → frame latency: subscribers on the top of the room list by recency
//! (the loadgen's WebSocket subscribers, `ordo_bench::live::subscriber`), and
//! one writer sending transactions to PostgreSQL at a steady rate. Each row it
//! updates carries its send time in `recency` (microseconds of the process
//! clock the subscribers read too) and an update number in `last_seq`, so a
//! subscriber times each update once, from the transaction sent to PostgreSQL
//! to the frame that shows it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_bench::live::stats::Clock;
use ordo_bench::live::subscriber::{DeliveryCounters, Subscriber, SubscriberOutcome, SubscriberSpec, UpdateMarks};
use ordo_bench::live::wire::ItemFields;
use ordo_bench::live::{Result, CONNECT_CONCURRENCY, FIRST_FRAMES_TIMEOUT, SETTLE_QUIET, SETTLE_TIMEOUT};
use ordo_pgsource::ConnectConfig;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::options::{Lists, Options};
use crate::postgres::connect;
use crate::updates::{due_after, latency_update_number, numbered_update, RowPicker, TABLE};

pub struct LatencyResult {
    pub counters: Arc<DeliveryCounters>,
    pub outcomes: Vec<SubscriberOutcome>,
    pub transactions: u64,
    pub write_seconds: f64,
    /// How late the writer sent its latest transaction at worst (PostgreSQL
    /// slower than the schedule shows here, not in the latency).
    pub max_send_delay: Duration,
    pub subscribe_seconds: f64,
}

const MARKS: UpdateMarks = UpdateMarks {
    number: |fields: &ItemFields| fields.last_seq.map(latency_update_number),
    stamp_us: |fields: &ItemFields| fields.recency,
};

/// Subscriber `index`'s list: the top rooms, or with `--lists own` the top of
/// its own rooms (`owner` = `index`).
fn subscriber_spec(options: &Options, authority: &str, index: usize) -> SubscriberSpec {
    let transactions = (options.transactions_per_second() * options.seconds).ceil() as u64 + 1;
    SubscriberSpec {
        authority: authority.to_owned(),
        collection: TABLE.to_owned(),
        sort_field: "recency",
        window_limit: options.window,
        marks: MARKS,
        max_update_number: transactions * options.batch as u64,
        auth: None,
        filter: (options.lists == Lists::Own).then(|| format!(r#"{{"field":"owner","op":"eq","value":{index}}}"#)),
        fields: options.fields,
    }
}

/// Waits for every subscription's first frame; the first failure otherwise.
async fn wait_subscribed(counters: &DeliveryCounters, n_subscribers: usize) -> Result<f64> {
    let started = Instant::now();
    loop {
        let subscribed = counters.subscribed.load(Ordering::Relaxed) as usize;
        let failed = counters.failed.load(Ordering::Relaxed);
        if subscribed == n_subscribers {
            return Ok(started.elapsed().as_secs_f64());
        }
        if failed > 0 || started.elapsed() > FIRST_FRAMES_TIMEOUT {
            return Err(format!(
                "{subscribed} of {n_subscribers} subscriptions got their first frame ({failed} failed within {FIRST_FRAMES_TIMEOUT:?})"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends the phase's transactions on their schedule; returns how many, and the worst delay.
async fn write_paced(options: &Options, config: &ConnectConfig, clock: Clock) -> Result<(u64, Duration)> {
    let mut connection = connect(config).await?;
    let mut picker = RowPicker::new(options.seed ^ 0x1a7e, 0, 1, options.rows);
    let phase = Duration::from_secs_f64(options.seconds);
    let started = tokio::time::Instant::now();
    let mut max_delay = Duration::ZERO;
    let mut index = 0u64;
    loop {
        let due = due_after(index, options.transactions_per_second());
        if due >= phase {
            // The phase's whole length, so the achieved rate is over the same interval as the asked one.
            tokio::time::sleep_until(started + phase).await;
            return Ok((index, max_delay));
        }
        tokio::time::sleep_until(started + due).await;
        max_delay = max_delay.max(started.elapsed().saturating_sub(due));
        let rows = picker.pick(options.batch);
        // Numbers from 1: 0 marks a row the phase has not updated.
        let first_number = 1 + index * options.batch as u64;
        connection.execute(&numbered_update(&rows, clock.now_us(), first_number)).await?;
        index += 1;
    }
}

/// Frames still on their way are part of the run: waits until none came for a while.
async fn settle(counters: &DeliveryCounters) {
    let started = Instant::now();
    let mut last_frames = counters.frames.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    while started.elapsed() < SETTLE_TIMEOUT && quiet_since.elapsed() < SETTLE_QUIET {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let frames = counters.frames.load(Ordering::Relaxed);
        if frames != last_frames {
            last_frames = frames;
            quiet_since = Instant::now();
        }
    }
}

/// Subscribes, writes at the options' rate for the phase's length, settles,
/// and returns what the subscribers saw.
pub async fn run(
    options: &Options,
    config: &ConnectConfig,
    authority: &str,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<LatencyResult> {
    let counters = Arc::new(DeliveryCounters::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let connect_gate = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let handles: Vec<JoinHandle<SubscriberOutcome>> = (0..options.subscribers)
        .map(|index| {
            let subscriber = Subscriber::new(subscriber_spec(options, authority, index));
            let run = subscriber.run(Arc::clone(&counters), clock, Arc::clone(&connect_gate), stop_rx.clone());
            subscriber_runtime.spawn(run)
        })
        .collect();
    let subscribed = wait_subscribed(&counters, options.subscribers).await;
    let mut written = None;
    if subscribed.is_ok() {
        let (rate, batch, seconds) = (options.rate, options.batch, options.seconds);
        println!("  writing {rate:.0} rows/s in transactions of {batch} for {seconds:.1} s...");
        let started = Instant::now();
        let paced = write_paced(options, config, clock).await.map(|paced| (paced, started.elapsed().as_secs_f64()));
        if paced.is_ok() {
            settle(&counters).await;
        }
        written = Some(paced);
    }
    let _ = stop_tx.send(true);
    let mut outcomes = Vec::with_capacity(handles.len());
    for handle in handles {
        outcomes.push(handle.await?);
    }
    let subscribe_seconds = subscribed?;
    let ((transactions, max_send_delay), write_seconds) = written.expect("written once subscribed")?;
    Ok(LatencyResult { counters, outcomes, transactions, write_seconds, max_send_delay, subscribe_seconds })
}
