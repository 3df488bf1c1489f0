//! `nats-sync`: what JetStream's `sync_interval` costs a writer. Cluster mode's
//! write path waits for a PubAck (the entry committed by a quorum of an R3 file
//! stream) before it answers (docs/SCALING.md). A nats-server fsyncs stream
//! files only every `sync_interval` (2 min by default) unless configured with
//! `jetstream { sync_interval: always }`, which fsyncs every write before the
//! server acknowledges it. This binary starts a local 3-node NATS cluster once
//! per setting (fresh data directories each time, on the repo's disk, not a
//! tmpfs), creates the same R3 file stream, and measures publish-to-PubAck
//! latency, sequential (one publish in flight, as one client's write) and with
//! `--inflight` publishes in flight (several clients at once), plus the
//! throughput of that concurrent run. The two settings alternate `--runs`
//! times; medians are printed, with the ratio always/default of each figure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Publish};
use bytes::Bytes;
use clap::Parser;
use ordo_bench::cli::count;
use ordo_bench::cluster_bench::procs::{numbers, reserve_ports, ReservedPort};

/// Publish-to-PubAck latency of an R3 file stream on a local 3-node NATS cluster,
/// `sync_interval` default against `always`.
#[derive(Parser)]
#[command(name = "nats-sync")]
struct Cli {
    /// Publishes per measured phase [default: 3000]
    #[arg(long, value_parser = count)]
    n: Option<usize>,
    /// Publishes in flight in the concurrent phase
    #[arg(long, default_value_t = 32, value_parser = count)]
    inflight: usize,
    /// Runs of each setting, alternating; medians reported [default: 3]
    #[arg(long, value_parser = count)]
    runs: Option<usize>,
    /// Payload size in bytes (300: a small Ordo write entry)
    #[arg(long, value_name = "BYTES", default_value_t = 300, value_parser = count)]
    size: usize,
    /// The binary (default $ORDO_NATS_SERVER, else <repo>/.tools/bin/nats-server;
    /// `make nats-server` installs it)
    #[arg(long, value_name = "PATH")]
    nats_server: Option<PathBuf>,
    /// Where the clusters keep their data (default <repo>/target/nats-sync; removed
    /// after each run). Keep it on the disk you want measured.
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// --n 300 --runs 1 unless they are given (a smoke run)
    #[arg(long)]
    quick: bool,
}

struct Args {
    n: usize,
    inflight: usize,
    runs: usize,
    size: usize,
    nats_server: Option<PathBuf>,
    dir: Option<PathBuf>,
}

fn parse() -> Args {
    let cli = Cli::parse();
    Args {
        n: cli.n.unwrap_or(if cli.quick { 300 } else { 3000 }),
        inflight: cli.inflight,
        runs: cli.runs.unwrap_or(if cli.quick { 1 } else { 3 }),
        size: cli.size,
        nats_server: cli.nats_server,
        dir: cli.dir,
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The same lookup as the cluster tests: `$ORDO_NATS_SERVER`, else the one
/// `make nats-server` installs; never a silent fallback to whatever is on PATH.
fn nats_server_bin(flag: Option<PathBuf>) -> Result<PathBuf, String> {
    let path = flag
        .or_else(|| std::env::var_os("ORDO_NATS_SERVER").map(PathBuf::from))
        .unwrap_or_else(|| repo_root().join(".tools/bin/nats-server"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("nats-server not found at {}: run `make nats-server` (or set ORDO_NATS_SERVER)", path.display()))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Sync {
    /// No `sync_interval` line: nats-server's default (fsync every 2 minutes).
    Default,
    /// `sync_interval: always`: fsync before every acknowledgement.
    Always,
}

impl Sync {
    fn name(self) -> &'static str {
        match self {
            Sync::Default => "default (2 min)",
            Sync::Always => "always",
        }
    }
}

/// Three nats-server processes in one cluster; dropped = killed and their data removed.
struct Cluster {
    children: Vec<Child>,
    client_urls: Vec<String>,
    dir: PathBuf,
    /// The servers' ports, held while they run so that no other process takes one first.
    _ports: Vec<ReservedPort>,
}

impl Cluster {
    fn start(bin: &Path, dir: &Path, sync: Sync) -> Result<Cluster, String> {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let reserved = reserve_ports(6).map_err(|e| e.to_string())?;
        let ports = numbers(&reserved);
        let (client, route) = ports.split_at(3);
        let routes = route.iter().map(|p| format!("nats-route://127.0.0.1:{p}")).collect::<Vec<_>>().join(", ");
        let sync_line = match sync {
            Sync::Default => "",
            Sync::Always => "  sync_interval: always\n",
        };
        let mut cluster =
            Cluster { children: Vec::new(), client_urls: Vec::new(), dir: dir.to_owned(), _ports: reserved };
        for i in 0..3 {
            let node = dir.join(format!("n{i}"));
            fs::create_dir_all(&node).map_err(|e| e.to_string())?;
            let conf = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{}\njetstream {{\n  store_dir: \"{}\"\n{sync_line}}}\n\
                 cluster {{\n  name: nats-sync\n  listen: 127.0.0.1:{}\n  routes: [{routes}]\n}}\n",
                client[i],
                node.join("js").display(),
                route[i],
            );
            let conf_path = node.join("nats.conf");
            fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
            let log = fs::File::create(node.join("nats.log")).map_err(|e| e.to_string())?;
            let child = Command::new(bin)
                .arg("-c")
                .arg(&conf_path)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("start {}: {e}", bin.display()))?;
            cluster.children.push(child);
            cluster.client_urls.push(format!("nats://127.0.0.1:{}", client[i]));
        }
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[derive(Clone, Copy, Default)]
struct Figures {
    seq_p50_us: f64,
    seq_p99_us: f64,
    conc_p50_us: f64,
    conc_p99_us: f64,
    conc_per_s: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// One publish with a `Nats-Msg-Id` (as Ordo's writes carry), timed to its PubAck.
async fn publish_timed(js: &jetstream::Context, id: u64, payload: Bytes) -> Result<u64, String> {
    let start = Instant::now();
    let publish = Publish::build().payload(payload).message_id(format!("bench/{id}"));
    let ack = js.send_publish("natssync.log", publish).await.map_err(|e| format!("publish: {e}"))?;
    ack.await.map_err(|e| format!("PubAck: {e}"))?;
    Ok(start.elapsed().as_micros() as u64)
}

async fn measure(urls: &[String], args: &Args) -> Result<Figures, String> {
    // The client talks to the first node, as an Ordo node talks to its local NATS
    // server; the stream's leader may be any of the three (that is the real case too).
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        match async_nats::connect(urls[0].as_str()).await {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => return Err(format!("connect {}: {e}", urls[0])),
        }
    };
    let js = jetstream::new(client);
    // The stream a cluster-mode Ordo creates (`ordo.log`-like), under a bench name.
    ordo_bench::cluster_bench::ceiling::create_stream(&js, "NATSSYNC", "natssync.log", 3)
        .await
        .map_err(|error| error.to_string())?;
    let payload = Bytes::from(vec![b'x'; args.size]);
    let ids = Arc::new(AtomicU64::new(0));

    // Warm-up: connections, the stream leader's first blocks.
    for _ in 0..args.n.min(200) {
        publish_timed(&js, ids.fetch_add(1, Ordering::Relaxed), payload.clone()).await?;
    }

    let mut seq = Vec::with_capacity(args.n);
    for _ in 0..args.n {
        seq.push(publish_timed(&js, ids.fetch_add(1, Ordering::Relaxed), payload.clone()).await?);
    }
    seq.sort_unstable();

    // Concurrent: `inflight` tasks, each a sequential writer, n publishes in all.
    let per_task = args.n.div_ceil(args.inflight);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.inflight {
        let (js, ids, payload) = (js.clone(), ids.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                lat.push(publish_timed(&js, ids.fetch_add(1, Ordering::Relaxed), payload.clone()).await?);
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut conc = Vec::with_capacity(per_task * args.inflight);
    for task in tasks {
        conc.extend(task.await.map_err(|e| e.to_string())??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    conc.sort_unstable();

    Ok(Figures {
        seq_p50_us: percentile(&seq, 0.50),
        seq_p99_us: percentile(&seq, 0.99),
        conc_p50_us: percentile(&conc, 0.50),
        conc_p99_us: percentile(&conc, 0.99),
        conc_per_s: conc.len() as f64 / elapsed,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn medians(runs: &[Figures]) -> Figures {
    let pick = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
    Figures {
        seq_p50_us: pick(|f| f.seq_p50_us),
        seq_p99_us: pick(|f| f.seq_p99_us),
        conc_p50_us: pick(|f| f.conc_p50_us),
        conc_p99_us: pick(|f| f.conc_p99_us),
        conc_per_s: pick(|f| f.conc_per_s),
    }
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1000.0)
}

fn main() -> ExitCode {
    let args = parse();
    let bin = match nats_server_bin(args.nats_server.clone()) {
        Ok(b) => b,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let dir = args.dir.clone().unwrap_or_else(|| repo_root().join("target/nats-sync"));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    println!(
        "nats-sync: {} publishes per phase, {} in flight when concurrent, {} B payload, {} run(s) per setting, data in {}",
        args.n,
        args.inflight,
        args.size,
        args.runs,
        dir.display()
    );
    let mut results: [Vec<Figures>; 2] = [Vec::new(), Vec::new()];
    for run in 0..args.runs {
        for (slot, sync) in [Sync::Default, Sync::Always].into_iter().enumerate() {
            let cluster = match Cluster::start(&bin, &dir, sync) {
                Ok(c) => c,
                Err(msg) => {
                    eprintln!("error: {msg}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(measure(&cluster.client_urls, &args)) {
                Ok(f) => {
                    println!(
                        "run {} {:<16} sequential p50 {} p99 {} | {} in flight p50 {} p99 {}, {:.0} acks/s",
                        run + 1,
                        sync.name(),
                        ms(f.seq_p50_us),
                        ms(f.seq_p99_us),
                        args.inflight,
                        ms(f.conc_p50_us),
                        ms(f.conc_p99_us),
                        f.conc_per_s
                    );
                    results[slot].push(f);
                }
                Err(msg) => {
                    eprintln!("error ({}): {msg}; logs were in {}", sync.name(), cluster.dir.display());
                    return ExitCode::FAILURE;
                }
            }
            drop(cluster);
        }
    }
    let d = medians(&results[0]);
    let a = medians(&results[1]);
    println!("\nmedians of {} run(s)           default (2 min)   always   always/default", args.runs);
    let row = |name: &str, x: f64, y: f64, fmt: &dyn Fn(f64) -> String| {
        println!("{name:<30} {:>15} {:>8}   {:.2}x", fmt(x), fmt(y), y / x);
    };
    row("sequential PubAck p50", d.seq_p50_us, a.seq_p50_us, &ms);
    row("sequential PubAck p99", d.seq_p99_us, a.seq_p99_us, &ms);
    row(&format!("{} in flight PubAck p50", args.inflight), d.conc_p50_us, a.conc_p50_us, &ms);
    row(&format!("{} in flight PubAck p99", args.inflight), d.conc_p99_us, a.conc_p99_us, &ms);
    row(&format!("{} in flight acks/s", args.inflight), d.conc_per_s, a.conc_per_s, &|v| format!("{v:.0}"));
    ExitCode::SUCCESS
}
