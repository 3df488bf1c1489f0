//! The live phase, common to every scenario: subscribe, write while
//! measuring, let frames settle, collect what every subscriber saw.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use super::http::{fetch_metrics, HttpPool};
use super::procfs::{machine_cpu_seconds, memory_bytes, CpuSample};
use super::stats::{Clock, Histogram};
use super::subscriber::{DeliveryCounters, DeliverySnapshot, Subscriber, SubscriberOutcome, SubscriberSpec};
use super::writer::{run_write_loop, UpdateSource, WritePace, WriteStats, WriteSummary};
use super::{BoxError, Result, CONNECT_CONCURRENCY, FIRST_FRAMES_TIMEOUT, SETTLE_QUIET, SETTLE_TIMEOUT};

pub struct LivePlan {
    pub specs: Vec<SubscriberSpec>,
    pub rate: f64,
    pub seconds: f64,
    pub n_collections: usize,
    /// With `--auth`: the writer token every live write carries.
    pub write_token: Option<Arc<str>>,
    /// More processes whose CPU time over the write phase is wanted (a
    /// cluster's nodes and NATS servers): pids as in /proc.
    pub watched_pids: Vec<String>,
}

pub struct LiveResult {
    pub outcomes: Vec<SubscriberOutcome>,
    pub write: WriteSummary,
    pub stats: Arc<WriteStats>,
    pub delivered: DeliverySnapshot,
    pub counters: Arc<DeliveryCounters>,
    pub settle_seconds: f64,
    pub server_cpu: Option<String>,
    pub server_memory: Option<(u64, u64)>,
    pub loadgen_cpu: Option<String>,
    pub metrics_before: Option<Vec<(String, f64)>>,
    pub metrics_after: Option<Vec<(String, f64)>>,
    /// How late a thread sleeping 1 ms at a time woke, in µs (`WakeMeter`).
    pub wake_delays: Option<Histogram>,
    /// Cores the whole machine was busy and stolen by the hypervisor during
    /// the write phase, and how much of the busy time neither the server nor
    /// loadgen used (other processes: a comparison of runs needs it near 0).
    pub machine_cores: Option<MachineCores>,
    /// CPU seconds (user + system) of each of the plan's `watched_pids` over
    /// the write phase, in the plan's order; `None` where /proc had no answer.
    pub watched_cpu_seconds: Vec<Option<f64>>,
}

pub struct MachineCores {
    pub busy: f64,
    pub steal: f64,
    pub others: Option<f64>,
}

/// Subscribes every spec, waits for every first frame, writes for the plan's
/// duration while measuring, waits for frames to settle, stops the subscribers
/// and returns what they and the writer saw.
pub async fn run_live_phase(
    plan: LivePlan,
    source: &mut dyn UpdateSource,
    pool: &mut HttpPool,
    tick: Duration,
    server_pid: Option<String>,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<LiveResult> {
    let n_subscribers = plan.specs.len();
    let counters = Arc::new(DeliveryCounters::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let connect_gate = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let subscribe_started = Instant::now();
    let handles: Vec<_> = plan
        .specs
        .into_iter()
        .map(|spec| {
            let subscriber = Subscriber::new(spec);
            subscriber_runtime.spawn(subscriber.run(
                Arc::clone(&counters),
                clock,
                Arc::clone(&connect_gate),
                stop_rx.clone(),
            ))
        })
        .collect();
    let stop_and_collect = |handles: Vec<tokio::task::JoinHandle<SubscriberOutcome>>| async move {
        let _ = stop_tx.send(true);
        let mut outcomes = Vec::with_capacity(handles.len());
        for handle in handles {
            outcomes.push(handle.await?);
        }
        Ok::<_, BoxError>(outcomes)
    };

    // Every subscription's first frame, or a failure, or the deadline.
    loop {
        let subscribed = counters.subscribed.load(Ordering::Relaxed);
        let failed = counters.failed.load(Ordering::Relaxed);
        if subscribed as usize == n_subscribers {
            break;
        }
        if failed > 0 || subscribe_started.elapsed() > FIRST_FRAMES_TIMEOUT {
            let outcomes = stop_and_collect(handles).await?;
            let first_problem = outcomes
                .iter()
                .find_map(|outcome| outcome.closed.clone().or_else(|| outcome.first_problem.clone()))
                .unwrap_or_else(|| format!("no first frame within {FIRST_FRAMES_TIMEOUT:?}"));
            return Err(format!(
                "{subscribed} of {n_subscribers} subscriptions got their first frame ({failed} failed): {first_problem}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let subscribe_seconds = subscribe_started.elapsed().as_secs_f64();
    println!(
        "  subscribe: {n_subscribers} WebSocket connections, every first frame (a Reset) after {subscribe_seconds:.2} s"
    );

    // The measured interval: exactly the write phase.
    println!("  writing {:.0} updates/s for {:.1} s...", plan.rate, plan.seconds);
    let stats = Arc::new(WriteStats::new(plan.n_collections));
    let metrics_before = fetch_metrics(pool).await;
    let delivered_before = counters.snapshot();
    let server_cpu_before = server_pid.as_deref().and_then(CpuSample::read);
    let loadgen_cpu_before = CpuSample::read("self");
    let machine_before = machine_cpu_seconds();
    let watched_before: Vec<Option<CpuSample>> = plan.watched_pids.iter().map(|pid| CpuSample::read(pid)).collect();
    let wake_meter = WakeMeter::start(clock, counters.clone());
    let pace = WritePace { rate: plan.rate, duration: Duration::from_secs_f64(plan.seconds), tick };
    let write = run_write_loop(pool, source, pace, clock, &stats, plan.write_token).await;
    let wake_delays = wake_meter.stop();
    let server_cpu_after = server_pid.as_deref().and_then(CpuSample::read);
    let loadgen_cpu_after = CpuSample::read("self");
    let machine_after = machine_cpu_seconds();
    let watched_cpu_seconds = plan
        .watched_pids
        .iter()
        .zip(watched_before)
        .map(|(pid, before)| Some(CpuSample::read(pid)?.total_seconds - before?.total_seconds))
        .collect();
    let machine_cores = machine_before.zip(machine_after).map(|((busy_before, steal_before), (busy, steal))| {
        let seconds = write.write_seconds;
        let used = |before: &Option<CpuSample>, after: &Option<CpuSample>| {
            Some((after.as_ref()?.total_seconds - before.as_ref()?.total_seconds) / seconds)
        };
        let ours = used(&loadgen_cpu_before, &loadgen_cpu_after)
            .map(|loadgen| loadgen + used(&server_cpu_before, &server_cpu_after).unwrap_or(0.0));
        let busy = (busy - busy_before) / seconds;
        // Without a server of ours (--server-url) the rest is not "others".
        let others = ours.filter(|_| server_pid.is_some()).map(|ours| (busy - ours).max(0.0));
        MachineCores { busy, steal: (steal - steal_before) / seconds, others }
    });
    let server_memory = server_pid.as_deref().and_then(memory_bytes);
    let delivered_after = counters.snapshot();
    let cores =
        |before: Option<CpuSample>, after: Option<CpuSample>| Some(after?.cores_since(&before?, write.write_seconds));

    // Settle: frames still on their way are part of the run.
    let settle_started = Instant::now();
    let mut last_frames = counters.frames.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    while settle_started.elapsed() < SETTLE_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let frames = counters.frames.load(Ordering::Relaxed);
        if frames != last_frames {
            last_frames = frames;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= SETTLE_QUIET {
            break;
        }
    }
    let settle_seconds = settle_started.elapsed().as_secs_f64();
    let metrics_after = fetch_metrics(pool).await;
    let outcomes = stop_and_collect(handles).await?;

    Ok(LiveResult {
        outcomes,
        delivered: DeliverySnapshot {
            frames: delivered_after.frames - delivered_before.frames,
            diffs: delivered_after.diffs - delivered_before.diffs,
            bytes: delivered_after.bytes - delivered_before.bytes,
        },
        server_cpu: cores(server_cpu_before, server_cpu_after),
        loadgen_cpu: cores(loadgen_cpu_before, loadgen_cpu_after),
        write,
        stats,
        counters,
        settle_seconds,
        server_memory,
        metrics_before,
        metrics_after,
        wake_delays,
        machine_cores,
        watched_cpu_seconds,
    })
}

/// The machine's own scheduling noise, measured during the write phase: a
/// thread that sleeps 1 ms at a time records how late it wakes. Every hop of
/// the pipeline (loadgen → network thread → writer → disk → network thread →
/// subscriber) is a wake-up like this one, so its tail bounds what the
/// end-to-end tail can be on this machine. It costs about 1 % of a core.
pub struct WakeMeter {
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<Histogram>,
}

impl WakeMeter {
    pub fn start(clock: Clock, counters: Arc<DeliveryCounters>) -> WakeMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("loadgen-wake".to_owned())
            .spawn(move || {
                let delays = Histogram::new();
                while !stopping.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    std::thread::sleep(Duration::from_millis(1));
                    let late = started.elapsed().saturating_sub(Duration::from_millis(1)).as_micros() as u64;
                    delays.record(late);
                    counters.timeline.record_wake(clock.now_us(), late);
                }
                delays
            })
            .expect("spawning the wake meter");
        WakeMeter { stop, thread }
    }

    pub fn stop(self) -> Option<Histogram> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok()
    }
}
