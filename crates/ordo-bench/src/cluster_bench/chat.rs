//! `--phase chat`: loadgen's chat scenario ([`crate::live::chat`]) on a
//! single-node server and split across cluster nodes, with what each node costs.
//!
//! Every run measures, each on fresh processes and the same load:
//! - `single`: one `ordo serve` (no cluster), all `--users` subscribers, all
//!   `--chat-rate` updates/s;
//! - `single, no subscribers`: the same writes, nobody subscribed: what taking
//!   and applying the writes costs, so that the rest of `single` is the cost
//!   of serving its subscribers;
//! - `cluster K` for each K of `--nodes`: 3 NATS servers (`sync_interval:
//!   always`, as `make cluster`), an R3 stream, K nodes, user `i`'s subscriber
//!   on node `i mod K`, the writes spread evenly over the K nodes (a node's
//!   HTTP connections take turns), plus an **observer** node with no
//!   subscribers and no writes: its CPU is what following the log costs every
//!   node (decode and apply every entry), so a node's CPU minus the observer's
//!   is what serving its subscribers and taking its share of the writes costs.
//!
//! CPU is user + system time from `/proc/<pid>/stat` over the write phase,
//! divided by its wall time (cores). Correctness is loadgen's: every
//! subscriber's list must end equal to a one-shot query of its window **on its
//! own node**, no acknowledged update lost, no seq gap, no protocol error; the
//! run fails otherwise, so the figures are of a working system.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::procs::{Nats, Ordo, Sync};
use super::{load_average, median, Options};
use crate::live::chat::{chat_collection, chat_losses_of, chat_marks, load_chat, ChatLayout, ChatUpdates};
use crate::live::http::HttpPool;
use crate::live::phase::{run_live_phase, LivePlan, LiveResult};
use crate::live::procfs::raise_open_files_limit;
use crate::live::stats::Clock;
use crate::live::subscriber::{SubscriberOutcome, SubscriberSpec};
use crate::live::verify::verify_lists;
use crate::live::writer::max_update_number;
use crate::live::Result;

/// The update stream's seed (loadgen's default).
const SEED: u64 = 1;

/// What one configuration runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Single { subscribers: bool },
    Cluster { nodes: usize, subscribers: bool },
}

impl Setup {
    fn label(self) -> String {
        match self {
            Setup::Single { subscribers: true } => "single".into(),
            Setup::Single { subscribers: false } => "single, no subscribers".into(),
            Setup::Cluster { nodes, subscribers: true } => format!("cluster {nodes}"),
            Setup::Cluster { nodes, subscribers: false } => format!("cluster {nodes}, no subscribers"),
        }
    }
}

/// One configuration's figures (cores = CPU seconds per second of the write phase).
struct Figures {
    setup: Setup,
    /// Per serving node: subscribers on it and its cores.
    nodes: Vec<(usize, f64)>,
    /// The observer's cores (cluster only).
    observer: Option<f64>,
    /// All NATS servers' cores together (cluster only).
    nats: Option<f64>,
    /// Acknowledged updates per second over the write phase.
    rate: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    /// Entries per stream message the nodes published during the write phase (cluster only).
    entries_per_message: Option<f64>,
    load: String,
}

/// The stream messages (groups) the nodes published so far, and the entries in them.
fn published_groups(nodes: &[Ordo]) -> Result<(f64, f64)> {
    let (mut groups, mut entries) = (0.0, 0.0);
    for node in nodes {
        groups += node.metric("ordo_cluster_publish_groups_total")?;
        entries += node.metric("ordo_cluster_publish_group_entries_total")?;
    }
    Ok((groups, entries))
}

impl Figures {
    fn mean_node_cores(&self) -> f64 {
        self.nodes.iter().map(|&(_, cores)| cores).sum::<f64>() / self.nodes.len() as f64
    }

    /// Serving cost per 1 000 subscribers on a node (mean over the nodes): its
    /// cores less what the same writes cost without subscribers. `writes`:
    /// single: the server's cores without subscribers (taking and applying
    /// every write); cluster: a node's cores less the observer's, without
    /// subscribers, with all the writes (taking them: parse, publish, wait),
    /// of which a node here takes 1/K; the observer stands for applying.
    fn serve_per_1000_subscribers(&self, writes: f64) -> f64 {
        let k = self.nodes.len() as f64;
        let per_node: Vec<f64> = self
            .nodes
            .iter()
            .map(|&(subscribers, cores)| {
                let without = match self.observer {
                    Some(observer) => observer + writes / k,
                    None => writes,
                };
                (cores - without) / (subscribers as f64 / 1000.0)
            })
            .collect();
        per_node.iter().sum::<f64>() / per_node.len() as f64
    }
}

/// Starts `setup`'s processes, runs the chat load on them, checks every list.
fn run_setup(
    options: &Options,
    setup: Setup,
    runtime: &tokio::runtime::Runtime,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<Figures> {
    let (nats, nodes, observer) = match setup {
        Setup::Single { .. } => (None, vec![Ordo::start(&options.ordo_bin, "single", None, &[])?], None),
        Setup::Cluster { nodes, .. } => {
            let nats = Nats::start(&options.nats_bin, 3, Sync::Always)?;
            let mut started = Vec::new();
            for i in 0..nodes {
                started.push(Ordo::start(
                    &options.ordo_bin,
                    &format!("node-{i}"),
                    Some((&nats, 3)),
                    &options.node_args,
                )?);
            }
            let observer = Ordo::start(&options.ordo_bin, "observer", Some((&nats, 3)), &options.node_args)?;
            (Some(nats), started, Some(observer))
        }
    };
    let authorities: Vec<String> = nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)).collect();
    let k = nodes.len();
    let subscribed = matches!(setup, Setup::Single { subscribers: true } | Setup::Cluster { subscribers: true, .. });
    let (users, rooms, window) = (options.users, options.rooms, options.window);
    let per_user = options.subscribers_per_user;

    let live: (LiveResult, (f64, f64)) = runtime.block_on(async {
        // Set-up through the first node; in a cluster every node (and the
        // observer) must have applied it before its subscribers ask for it.
        let mut admin = HttpPool::connect(&authorities[0], 8, None).await?;
        load_chat(&mut admin, users, rooms, SEED).await?;
        if matches!(setup, Setup::Cluster { .. }) {
            let target = nodes[0].applied_seq()?;
            let deadline = Instant::now() + std::time::Duration::from_secs(120);
            for node in nodes.iter().chain(observer.iter()) {
                while node.applied_seq()? < target {
                    if Instant::now() > deadline {
                        return Err(format!("a node did not apply the set-up (seq {target}) within 120 s").into());
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
        let max_number = max_update_number(options.chat_rate, options.seconds);
        // Subscriber i watches user i / per_user's list, on node i mod K.
        let specs = (0..users * per_user)
            .filter(|_| subscribed)
            .map(|subscriber| SubscriberSpec {
                authority: authorities[subscriber % k].clone(),
                collection: chat_collection(subscriber / per_user),
                sort_field: "recency",
                window_limit: window,
                marks: chat_marks(),
                max_update_number: max_number,
                auth: None,
                filter: None,
                fields: None,
            })
            .collect();
        let mut watched_pids: Vec<String> = nodes.iter().map(|node| node.process.pid().to_string()).collect();
        watched_pids.extend(observer.iter().map(|node| node.process.pid().to_string()));
        watched_pids.extend(nats.iter().flat_map(Nats::pids).map(|pid| pid.to_string()));
        let plan = LivePlan {
            specs,
            rate: options.chat_rate,
            seconds: options.seconds,
            n_collections: users,
            write_token: None,
            watched_pids,
        };
        let mut writers = HttpPool::connect_spread(&authorities, options.connections, None).await?;
        let mut source = ChatUpdates::new(SEED, users, rooms, ChatLayout::PerUser);
        let before = published_groups(&nodes)?;
        let live =
            run_live_phase(plan, &mut source, &mut writers, options.tick, None, subscriber_runtime, clock).await?;
        let after = published_groups(&nodes)?;
        Ok::<_, crate::live::BoxError>((live, (after.0 - before.0, after.1 - before.1)))
    })?;
    let (live, (groups, group_entries)) = live;

    let write_seconds = live.write.write_seconds;
    let acked = live.stats.acked.load(Ordering::Relaxed);
    let cores: Vec<f64> = live.watched_cpu_seconds.iter().map(|cpu| cpu.unwrap_or(f64::NAN) / write_seconds).collect();
    let failures = check(&live, &authorities, runtime, window, subscribed, per_user)?;
    let n_subscribers = users * per_user;
    let figures = Figures {
        setup,
        nodes: (0..k).map(|j| (if subscribed { (n_subscribers + k - 1 - j) / k } else { 0 }, cores[j])).collect(),
        observer: observer.as_ref().map(|_| cores[k]),
        nats: nats.as_ref().map(|_| cores[k + 1..].iter().sum()),
        rate: acked as f64 / write_seconds,
        latency_p50_ms: live.counters.latency_us.quantile(0.5) as f64 / 1000.0,
        latency_p99_ms: live.counters.latency_us.quantile(0.99) as f64 / 1000.0,
        entries_per_message: (nats.is_some() && groups > 0.0).then(|| group_entries / groups),
        load: load_average(),
    };
    drop(nodes);
    drop(observer);
    drop(nats);
    if failures > 0 {
        return Err(
            format!("{}: {failures} correctness failures (see above); no figures from it", setup.label()).into()
        );
    }
    Ok(figures)
}

/// loadgen's checks; prints them and returns the number of failures.
fn check(
    live: &LiveResult,
    authorities: &[String],
    runtime: &tokio::runtime::Runtime,
    window: usize,
    subscribed: bool,
    per_user: usize,
) -> Result<u64> {
    let write_failures = live.stats.failed_requests.load(Ordering::Relaxed);
    if let Some(failure) = live.stats.first_failure.lock().expect("no panics while holding it").as_ref() {
        println!("    write failures: {write_failures} requests; first: {failure}");
    }
    if !subscribed {
        return Ok(write_failures);
    }
    let losses = chat_losses_of(&live.outcomes, &live.stats, |subscriber| subscriber / per_user);
    let sum = |field: fn(&SubscriberOutcome) -> u64| live.outcomes.iter().map(field).sum::<u64>();
    let (gaps, protocol_errors) = (sum(|o| o.seq_gaps), sum(|o| o.protocol_errors));
    let closed = live.outcomes.iter().filter(|outcome| outcome.closed.is_some()).count() as u64;
    // Each subscriber against its own node's window: subscriber i is on node
    // i mod k and watches user i / per_user.
    let k = authorities.len();
    let (mut mismatches, mut first_mismatch) = (0, None);
    for (j, authority) in authorities.iter().enumerate() {
        let subscribers: Vec<usize> = (j..live.outcomes.len()).step_by(k).collect();
        // The node's outcomes as one slice: index i is subscriber j + i k.
        let outcomes: Vec<&SubscriberOutcome> = subscribers.iter().map(|&s| &live.outcomes[s]).collect();
        let (n, first) = runtime.block_on(async {
            let mut pool = HttpPool::connect(authority, 4, None).await?;
            verify_lists(&mut pool, &outcomes, |i| chat_collection((j + i * k) / per_user), "recency", window).await
        })?;
        mismatches += n as u64;
        first_mismatch = first_mismatch.or(first);
    }
    println!(
        "    checks: {mismatches} of {} lists differ from their node's window; lost {} of {} acknowledged updates \
         ({} resets after the first frame, in {} subscriptions, {} updates unseen there); {gaps} seq gaps, \
         {protocol_errors} protocol errors, {closed} closed early",
        live.outcomes.len(),
        losses.lost,
        live.stats.acked.load(Ordering::Relaxed),
        losses.resets,
        losses.reset_collections,
        losses.missing_in_reset_collections
    );
    if let Some(mismatch) = first_mismatch {
        println!("    first mismatch: {mismatch}");
    }
    if let Some(problem) = live.outcomes.iter().find_map(|o| o.closed.as_ref().or(o.first_problem.as_ref())) {
        println!("    first problem: {problem}");
    }
    Ok(write_failures + mismatches + losses.lost + gaps + protocol_errors + closed)
}

fn print_figures(figures: &Figures, options: &Options) {
    let nodes: Vec<String> = figures
        .nodes
        .iter()
        .map(|&(subscribers, cores)| {
            if subscribers == 0 {
                format!("{cores:.3} cores")
            } else {
                format!(
                    "{cores:.3} cores, {subscribers} subs: {:.3} per 1 000 subs",
                    cores / (subscribers as f64 / 1000.0)
                )
            }
        })
        .collect();
    let mut line = format!(
        "  {:<22} {:.0} updates/s of {:.0}; per node [{}]; mean node {:.3} per 1 000 updates/s",
        figures.setup.label(),
        figures.rate,
        options.chat_rate,
        nodes.join(" | "),
        figures.mean_node_cores() / (figures.rate / 1000.0)
    );
    if let Some(observer) = figures.observer {
        line +=
            &format!("; observer {observer:.3} cores ({:.3} per 1 000 updates/s)", observer / (figures.rate / 1000.0));
    }
    if let Some(nats) = figures.nats {
        line += &format!("; NATS ×3 {nats:.3} cores ({:.3} per 1 000 updates/s)", nats / (figures.rate / 1000.0));
    }
    if let Some(entries) = figures.entries_per_message {
        line += &format!("; {entries:.1} entries per stream message");
    }
    if figures.nodes[0].0 > 0 {
        line += &format!("; end-to-end p50 {:.2} ms p99 {:.2} ms", figures.latency_p50_ms, figures.latency_p99_ms);
    }
    println!("{line}; load {}", figures.load);
}

pub fn chat_phase(options: &Options) -> Result<()> {
    println!(
        "\n== chat split across cluster nodes: {} users × {} rooms, {} subscriber(s) per user on its top {} by \
         recency; {:.0} updates/s for {:.1} s; cluster sizes {:?}, 3 NATS servers (sync_interval: always), R3 ==",
        options.users,
        options.rooms,
        options.subscribers_per_user,
        options.window,
        options.chat_rate,
        options.seconds,
        options.nodes
    );
    println!("  cores = CPU seconds (user + system, /proc/<pid>/stat) per second of the write phase");
    let open_files = raise_open_files_limit();
    let n_subscribers = options.users * options.subscribers_per_user;
    if open_files < n_subscribers as u64 + 256 {
        println!("  warning: {open_files} open files allowed, about {} needed", n_subscribers + 256);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let subscriber_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("chat-subs").enable_all().build()?;
    let clock = Clock { origin: Instant::now() };
    // Index 0, 1, 2: single, single without subscribers, cluster 1 without subscribers.
    let mut setups = vec![
        Setup::Single { subscribers: true },
        Setup::Single { subscribers: false },
        Setup::Cluster { nodes: 1, subscribers: false },
    ];
    setups.extend(options.nodes.iter().map(|&nodes| Setup::Cluster { nodes, subscribers: true }));
    // The same K nodes without subscribers: serving then reads directly as the
    // difference, without assuming that taking writes costs a node 1/K of what
    // it costs one node (fewer writes per node batch less).
    setups.extend(
        options.nodes.iter().filter(|&&nodes| nodes > 1).map(|&nodes| Setup::Cluster { nodes, subscribers: false }),
    );
    // Per setup, one Figures per run.
    let mut all: Vec<Vec<Figures>> = setups.iter().map(|_| Vec::new()).collect();
    for run in 0..options.runs {
        println!("run {}:", run + 1);
        for (s, &setup) in setups.iter().enumerate() {
            let figures = run_setup(options, setup, &runtime, subscriber_runtime.handle(), clock)?;
            print_figures(&figures, options);
            all[s].push(figures);
        }
        // Serving cost per subscriber against the single node's, same run.
        let single = all[0][run].serve_per_1000_subscribers(all[1][run].mean_node_cores());
        let taking = taking_writes(&all[2][run]);
        let mut line = format!(
            "  serving cost per 1 000 subscribers (node less the same writes without subscribers): single {single:.3}"
        );
        for (figures, setup) in all.iter().zip(&setups).skip(3) {
            let Setup::Cluster { nodes, subscribers: true } = *setup else { continue };
            let cluster = figures[run].serve_per_1000_subscribers(taking);
            line += &format!(" | {} {cluster:.3} ({:.2}x single", figures[run].setup.label(), cluster / single);
            if let Some(direct) = direct_serve(&setups, &all, nodes, run) {
                line += &format!("; direct {direct:.3}, {:.2}x", direct / single);
            }
            line += ")";
        }
        println!("{line}");
    }
    summarise(&setups, &all, options);
    subscriber_runtime.shutdown_background();
    Ok(())
}

/// Serving cost per 1 000 subscribers on a node of the K-node cluster in run
/// `run`, read directly: its cores less those of the same K nodes taking the
/// same writes without subscribers. `None` when that setup was not measured.
fn direct_serve(setups: &[Setup], all: &[Vec<Figures>], nodes: usize, run: usize) -> Option<f64> {
    let index = |subscribers| setups.iter().position(|&setup| setup == Setup::Cluster { nodes, subscribers });
    let (with, without) = (&all[index(true)?][run], &all[index(false)?][run]);
    let subscribers = with.nodes.iter().map(|&(n, _)| n).sum::<usize>() as f64;
    Some((with.mean_node_cores() - without.mean_node_cores()) * nodes as f64 / (subscribers / 1000.0))
}

/// A cluster node's cores for taking all the writes (parse, publish, wait for
/// the PubAck), from the 1-node cluster without subscribers: node less observer.
fn taking_writes(figures: &Figures) -> f64 {
    figures.mean_node_cores() - figures.observer.unwrap_or(f64::NAN)
}

/// Medians over the runs, and the projection to N nodes they give.
fn summarise(setups: &[Setup], all: &[Vec<Figures>], options: &Options) {
    let med = |values: Vec<f64>| median(&mut values.clone());
    println!("medians of {} run(s) (cores; per 1 000 subscribers on the node; per 1 000 updates/s):", options.runs);
    let single_serve =
        med(all[0].iter().zip(&all[1]).map(|(f, w)| f.serve_per_1000_subscribers(w.mean_node_cores())).collect());
    let taking: Vec<f64> = all[2].iter().map(taking_writes).collect();
    let mut follow_cluster = Vec::new();
    let mut serve_cluster = Vec::new();
    for (setup, runs) in setups.iter().zip(all) {
        let rate = med(runs.iter().map(|f| f.rate).collect());
        let node = med(runs.iter().map(Figures::mean_node_cores).collect());
        let subscribers = runs[0].nodes[0].0;
        let mut line = format!("  {:<22} node {node:.3} cores", setup.label());
        if subscribers > 0 {
            line += &format!(", {:.3} per 1 000 subs", node / (subscribers as f64 / 1000.0));
        }
        line += &format!(", {:.3} per 1 000 updates/s ({rate:.0} updates/s)", node / (rate / 1000.0));
        if let Setup::Cluster { .. } = setup {
            let observer = med(runs.iter().map(|f| f.observer.unwrap_or(f64::NAN)).collect());
            let nats = med(runs.iter().map(|f| f.nats.unwrap_or(f64::NAN)).collect());
            line += &format!(
                "; observer {observer:.3} cores ({:.3} per 1 000 updates/s); NATS ×3 {nats:.3} cores ({:.3} per 1 000 \
                 updates/s)",
                observer / (rate / 1000.0),
                nats / (rate / 1000.0),
            );
        }
        if let Setup::Cluster { subscribers: true, .. } = setup {
            let observer = med(runs.iter().map(|f| f.observer.unwrap_or(f64::NAN)).collect());
            let serve = med(runs.iter().zip(&taking).map(|(f, &t)| f.serve_per_1000_subscribers(t)).collect());
            line += &format!(
                "; serving {serve:.3} per 1 000 subs ({:.2}x single's {single_serve:.3}; goal within 10 %)",
                serve / single_serve
            );
            if let Setup::Cluster { nodes, .. } = setup {
                let direct: Vec<f64> =
                    (0..runs.len()).filter_map(|run| direct_serve(setups, all, *nodes, run)).collect();
                if !direct.is_empty() {
                    let direct = med(direct);
                    line += &format!("; direct {direct:.3} ({:.2}x single)", direct / single_serve);
                }
            }
            follow_cluster.push(observer / rate);
            // Per update, all its subscribers: per subscriber and update × subscribers per user.
            let updates_per_subscriber = rate / options.users as f64;
            serve_cluster.push(serve / 1000.0 / updates_per_subscriber * options.subscribers_per_user as f64);
        }
        let loads: Vec<&str> = runs.iter().map(|f| f.load.as_str()).collect();
        println!("{line}; load {}", loads.join(" / "));
    }
    if follow_cluster.is_empty() {
        return;
    }
    // Per update, in CPU seconds: every node follows it (a), the node that
    // takes it pays c, the nodes of its subscribers b together.
    let a = med(follow_cluster);
    let b = med(serve_cluster);
    let rate = med(all[2].iter().map(|f| f.rate).collect());
    let c = med(taking) / rate;
    let per_user = options.chat_rate / options.users as f64;
    let subscribers_per_user = options.subscribers_per_user as f64;
    println!(
        "projection (from the medians; writes and subscribers spread evenly): per update, every node pays {:.1} µs of \
         CPU to follow the log, the node that takes it {:.1} µs, the nodes of its {subscribers_per_user} subscriber(s) \
         {:.1} µs; at {per_user:.2} updates/s per user, one core per node holds:",
        a * 1e6,
        c * 1e6,
        b * 1e6,
    );
    for n in [1usize, 2, 3, 5, 10] {
        // cores per node = per_user × users × (a + (b + c) / n) ≤ 1
        let users = 1.0 / (per_user * (a + (b + c) / n as f64));
        println!(
            "  {n:>2} nodes: {users:.0} users ({:.0} updates/s through the stream, {:.0} subscribers per node)",
            users * per_user,
            users * subscribers_per_user / n as f64
        );
    }
    println!(
        "  limit: {:.0} updates/s (one core / follow cost) however many nodes; the stream's own ceiling: --phase ceiling",
        1.0 / a
    );
}
