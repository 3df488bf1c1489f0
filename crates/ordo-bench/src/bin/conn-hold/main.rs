//! `conn-hold`: how many subscribed WebSockets one `ordo serve` holds, and
//! what each costs it.
//!
//! ```text
//! cargo build --release -p ordo-server --bin ordo
//! cargo run --release -p ordo-bench --bin conn-hold -- --quick      # CI smoke run, ~10 s
//! cargo run --release -p ordo-bench --bin conn-hold                 # 100 000 connections, 30 s
//! ```
//!
//! It starts `ordo serve` on a fresh data directory (port 0, its address read
//! from its output), fills a collection `board` of `--groups` groups of
//! `--items-per-group` items, then opens `--connections` WebSockets from
//! loopback source addresses of their own (127.0.0.2, .3, …: one address has
//! only ~28 000 ephemeral ports), each waiting after `welcome`; once all are
//! open, connection i subscribes to the top `--window` of group i mod GROUPS
//! by `score` (a user's own list, as a room list is). While they are held for
//! `--seconds`, `--rate` updates per second each move the first item of a
//! random group (a trickle), then a sweep moves every group's once, and every
//! connection must receive its group's last update. `/v1/health` is asked
//! every 10 ms throughout. Reported: the server's RSS before, with the
//! connections open, with them subscribed and at its peak (so the cost of a
//! connection and of a subscription apart), the kernel's socket memory,
//! `/v1/health` latency during the trickle and during the sweep (when every
//! connection gets a frame at once), and the delivery. It exits non-zero if a
//! connection failed or missed its update; the goals are printed, not enforced.
//!
//! Descriptors: the client and the server each need one per connection, each
//! under its own `RLIMIT_NOFILE`. The soft and hard limits are raised to fit
//! (raising the hard one needs `CAP_SYS_RESOURCE`); the server inherits them
//! and keeps 128 for its own files.

mod board;
mod frames;
mod holder;
mod options;
mod report;

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Method;
use ordo_bench::live::http::HttpConnection;
use ordo_bench::live::procfs::memory_bytes;
use ordo_bench::live::serve_process::ServeProcess;
use ordo_bench::live::stats::XorShift64;
use ordo_bench::live::Result;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use board::expect_ok;
use holder::{Plan, Progress, Signals};
use options::Options;
use report::{Delivery, HealthLatency, Memory, Report};

/// Connections per loopback source address: well below its ~28 000 ephemeral
/// ports, since the kernel's search for a free port of one address slows down
/// as they fill.
const CONNECTIONS_PER_SOURCE: usize = 5_000;
/// Handshakes in flight at once: a burst of SYNs past the listen backlog turns
/// into one-second retransmit stalls.
const CONNECT_CONCURRENCY: usize = 256;
/// Descriptors of this process beyond one per connection: its HTTP
/// connections, the runtime's.
const DESCRIPTOR_MARGIN: u64 = 256;
const HEALTH_EVERY: Duration = Duration::from_millis(10);
/// How long after the last update every connection must have it.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let options = Options::from_command_line();
    let outcome = raise_descriptor_limit(options.connections as u64 + DESCRIPTOR_MARGIN).and_then(|()| {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(options.client_threads).enable_all().build()?;
        runtime.block_on(measure(&options))
    });
    match outcome {
        Ok(report) => {
            report.print(&options);
            if report.is_whole() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("conn-hold: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Sets the soft and hard descriptor limits to at least `needed`.
fn raise_descriptor_limit(needed: u64) -> Result<()> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    let raised = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err("getrlimit(RLIMIT_NOFILE) failed".into());
        }
        let wanted = libc::rlimit { rlim_cur: needed.max(limit.rlim_cur), rlim_max: needed.max(limit.rlim_max) };
        libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0
    };
    if raised {
        return Ok(());
    }
    Err(format!(
        "cannot raise RLIMIT_NOFILE to {needed} (now {} soft, {} hard; a higher hard limit needs CAP_SYS_RESOURCE): \
         raise `ulimit -Hn` where that is allowed, or hold fewer --connections",
        limit.rlim_cur, limit.rlim_max
    )
    .into())
}

async fn measure(options: &Options) -> Result<Report> {
    let mut args = vec!["--max-connections".to_owned(), (options.connections + 64).to_string()];
    args.extend(options.server_args.iter().cloned());
    let server = ServeProcess::start(&options.server_bin, "conn-hold", &args)?;
    let mut http = HttpConnection::connect(&server.authority).await?;
    board::load(&mut http, options.groups, options.items_per_group).await?;
    let pid = server.pid();
    let mut memory = Memory { before: rss(&pid)?, ..Memory::default() };

    let (subscribe_tx, subscribe_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let signals = Signals { subscribe: subscribe_rx, stop: stop_rx };
    let progress = Arc::new(Progress::default());
    let seen: Arc<Vec<AtomicU64>> = Arc::new((0..options.connections).map(|_| AtomicU64::new(0)).collect());
    let plan = Arc::new(Plan { server: server.authority.parse()?, groups: options.groups, window: options.window });
    let mut holders = spawn_holders(options.connections, &plan, &signals, &seen, &progress);
    let connect_seconds = wait_for("open", options.connections, &progress, |progress| &progress.connected).await?;
    memory.connected = rss(&pid)?;
    subscribe_tx.send(true)?;
    let subscribe_seconds =
        wait_for("subscribed", options.connections, &progress, |progress| &progress.subscribed).await?;
    memory.subscribed = rss(&pid)?;

    let (stop_probe, probe_stopped) = watch::channel(false);
    let probe = tokio::spawn(probe_health(server.authority.clone(), probe_stopped));
    let mut last_of_group = vec![0u64; options.groups];
    let trickle = trickle(options, &mut http, &pid, &mut last_of_group).await?;
    let sweep = sweep(options, &mut http, &mut last_of_group, &seen).await?;
    memory.peak = trickle.peak_rss.max(memory.subscribed).max(rss(&pid)?);
    memory.kernel_sockets = report::kernel_socket_bytes();
    // The probe may have ended on its own error, which its join shows.
    let _ = stop_probe.send(true);
    let samples = probe.await??;
    stop_tx.send(true)?;
    let errors = join_holders(&mut holders).await;
    Ok(Report {
        connections: options.connections,
        groups: options.groups,
        failed: progress.failed.load(Ordering::Relaxed),
        errors,
        connect_seconds,
        subscribe_seconds,
        memory,
        trickle_updates: trickle.updates,
        health_trickle: HealthLatency::between(&samples, trickle.started, trickle.ended),
        health_sweep: HealthLatency::between(&samples, sweep.started, sweep.ended),
        delivery: sweep.delivery,
    })
}

fn rss(pid: &str) -> Result<u64> {
    Ok(memory_bytes(pid).ok_or("cannot read the server's memory from /proc")?.0)
}

fn spawn_holders(
    connections: usize,
    plan: &Arc<Plan>,
    signals: &Signals,
    seen: &Arc<Vec<AtomicU64>>,
    progress: &Arc<Progress>,
) -> JoinSet<Result<()>> {
    let handshakes = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let mut holders = JoinSet::new();
    for index in 0..connections {
        let (plan, signals, seen, progress) = (plan.clone(), signals.clone(), seen.clone(), progress.clone());
        let handshakes = handshakes.clone();
        holders.spawn(async move {
            let permit = handshakes.acquire_owned().await?;
            let source = source_address(index);
            let held = holder::hold(plan, index, source, signals, &seen[index], &progress, permit).await;
            if held.is_err() {
                progress.failed.fetch_add(1, Ordering::Relaxed);
            }
            held
        });
    }
    holders
}

/// 127.0.0.2 for the first `CONNECTIONS_PER_SOURCE` connections, then .3, …
fn source_address(index: usize) -> Ipv4Addr {
    let source = 2 + (index / CONNECTIONS_PER_SOURCE) as u32;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 0)) + source)
}

/// Waits until every connection reached a step (or failed), printing
/// progress; the seconds it took.
async fn wait_for(
    step: &str,
    connections: usize,
    progress: &Progress,
    counter: fn(&Progress) -> &AtomicU64,
) -> Result<f64> {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let reached = counter(progress).load(Ordering::Relaxed);
        let failed = progress.failed.load(Ordering::Relaxed);
        if reached + failed >= connections as u64 {
            let seconds = started.elapsed().as_secs_f64();
            println!("  {step}: {reached} of {connections} in {seconds:.1} s ({failed} failed)");
            return Ok(seconds);
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            let rate = reached as f64 / started.elapsed().as_secs_f64();
            println!("  {step}: {reached} of {connections} ({rate:.0}/s, {failed} failed)");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Trickle {
    started: Instant,
    ended: Instant,
    updates: u64,
    peak_rss: u64,
}

/// `--rate` updates per second for `--seconds`, each moving a random group's
/// first item with the next update number (kept in `last_of_group`).
async fn trickle(
    options: &Options,
    http: &mut HttpConnection,
    pid: &str,
    last_of_group: &mut [u64],
) -> Result<Trickle> {
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(options.seconds);
    let mut random = XorShift64::new(0xC0FFEE);
    let mut updates = 0;
    let mut peak_rss = 0;
    let mut last_rss = started;
    while options.rate > 0.0 && Instant::now() < end {
        tokio::time::sleep_until((started + Duration::from_secs_f64(updates as f64 / options.rate)).into()).await;
        updates += 1;
        let group = random.below(options.groups as u64) as usize;
        last_of_group[group] = updates;
        board::move_items(http, &[(group, updates)]).await?;
        if last_rss.elapsed() >= Duration::from_secs(1) {
            peak_rss = peak_rss.max(rss(pid)?);
            last_rss = Instant::now();
        }
    }
    tokio::time::sleep_until(end.into()).await;
    Ok(Trickle { started, ended: Instant::now(), updates, peak_rss })
}

struct Sweep {
    started: Instant,
    ended: Instant,
    delivery: Delivery,
}

/// Moves every group's first item once more, then waits for every connection
/// to have its group's last number.
async fn sweep(
    options: &Options,
    http: &mut HttpConnection,
    last_of_group: &mut [u64],
    seen: &[AtomicU64],
) -> Result<Sweep> {
    let first = last_of_group.iter().max().copied().unwrap_or(0) + 1;
    let moves: Vec<(usize, u64)> = (0..options.groups).map(|group| (group, first + group as u64)).collect();
    for &(group, number) in &moves {
        last_of_group[group] = number;
    }
    let started = Instant::now();
    board::move_items(http, &moves).await?;
    let missing = || {
        (0..seen.len())
            .filter(|&index| seen[index].load(Ordering::Relaxed) < last_of_group[index % options.groups])
            .count()
    };
    let deadline = started + DELIVERY_TIMEOUT;
    while missing() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ended = Instant::now();
    let missed = missing();
    let seconds = if missed == 0 { ended.duration_since(started).as_secs_f64() } else { f64::NAN };
    // The health probe goes on a little after the last frame, so the sweep's figure covers the whole of it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(Sweep { started, ended, delivery: Delivery { missed, seconds } })
}

/// `GET /v1/health` every `HEALTH_EVERY` on a connection of its own, until
/// stopped: when each was sent, and its latency.
async fn probe_health(authority: String, mut stopped: watch::Receiver<bool>) -> Result<Vec<(Instant, u64)>> {
    let mut http = HttpConnection::connect(&authority).await?;
    let mut samples = Vec::new();
    let mut ticks = tokio::time::interval(HEALTH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stopped.borrow_and_update() {
        ticks.tick().await;
        let sent = Instant::now();
        expect_ok(http.request(Method::GET, "/v1/health", Vec::new(), None).await?, "/v1/health")?;
        samples.push((sent, sent.elapsed().as_micros() as u64));
    }
    Ok(samples)
}

/// Every holder's end; the first few errors, told apart, for the report.
async fn join_holders(holders: &mut JoinSet<Result<()>>) -> Vec<String> {
    let mut errors: Vec<String> = Vec::new();
    while let Some(joined) = holders.join_next().await {
        let error = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(panic) => panic.to_string(),
        };
        if errors.len() < 5 && !errors.contains(&error) {
            errors.push(error);
        }
    }
    errors
}
