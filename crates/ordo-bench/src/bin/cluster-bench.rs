//! `cluster-bench`: the figures of issue 16 (docs/BENCHMARKS.md, "Cluster").
//!
//! ```text
//! cargo build --release -p ordo-server --bin ordo -p ordo-bench --bin cluster-bench
//! target/release/cluster-bench --ordo-bin target/release/ordo                 # every phase
//! target/release/cluster-bench --ordo-bin target/release/ordo --phase latency --runs 5
//! ```
//!
//! It starts `nats-server` processes (`--nats-bin`, else `$ORDO_NATS_SERVER`, else
//! `<repo>/.tools/bin/nats-server`; `make nats-server` installs it) as a
//! JetStream cluster on loopback, and `ordo serve` processes, each with a fresh
//! data directory, and measures:
//!
//! - **latency**: write acknowledgement latency (one HTTP batch of one upsert,
//!   keep-alive connections, a fixed rate) against a single-node server and
//!   against a cluster node, the same load in the same run, alternating, each
//!   `--runs` times; prints p50/p99 of each and the cluster/single ratio.
//! - **apply**: the store's apply ceiling without NATS: one-upsert entries
//!   committed one per group against 256 per group (relaxed durability, as a
//!   cluster node's own log).
//! - **catchup**: writes `--catchup-entries` entries through one cluster node,
//!   then starts a node with an empty data directory and measures how fast it
//!   applies the stream (entries per second, from `/v1/health`'s
//!   `cluster.applied_seq`), against the goal of 200 000/s, and its CPU time
//!   per 100 000 entries by thread (`/proc`: steadier than wall time on a
//!   shared machine); `--catchup-nodes` new nodes, one after another, on one fill.
//!
//! Benchmarks are not tests: nothing here asserts a time. Every figure is
//! printed next to its peer from the same run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const USAGE: &str = "cluster-bench [options]
  --ordo-bin PATH        the `ordo` binary (default: target/release/ordo of this workspace)
  --nats-bin PATH        nats-server (default: $ORDO_NATS_SERVER, else <repo>/.tools/bin/nats-server)
  --nats-nodes N         NATS servers in the JetStream cluster, 1 or 3 (default 3; the stream has as many replicas)
  --phase latency|apply|catchup|all   (default all; apply: the store's apply ceiling, no NATS)
  --runs N               alternating single/cluster runs of the latency phase (default 3)
  --seconds N            length of each latency run (default 10)
  --rate N               writes per second in the latency phase, all connections together (default 500)
  --connections N        keep-alive HTTP connections writing at once (default 8)
  --catchup-entries N    entries in the stream before the new node starts (default 100000)
  --catchup-nodes N      new nodes started one after another on the same stream, each from an empty
                         data directory (default 3): one fill, N catch-up figures and their median
  --catchup-wrap CMD     runs each new node under CMD (split on spaces; `{n}` is the node's number),
                         e.g. `perf record -g -o /tmp/catchup-{n}.data --` (CPU is then read from its child)";

struct Options {
    ordo_bin: PathBuf,
    nats_bin: PathBuf,
    nats_nodes: usize,
    phase: String,
    runs: usize,
    seconds: f64,
    rate: f64,
    connections: usize,
    catchup_entries: u64,
    catchup_nodes: usize,
    catchup_wrap: Option<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Options {
    fn parse() -> Result<Options> {
        let mut options = Options {
            ordo_bin: repo_root().join("target/release/ordo"),
            nats_bin: std::env::var_os("ORDO_NATS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join(".tools/bin/nats-server")),
            nats_nodes: 3,
            phase: "all".into(),
            runs: 3,
            seconds: 10.0,
            rate: 500.0,
            connections: 8,
            catchup_entries: 100_000,
            catchup_nodes: 3,
            catchup_wrap: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = |value: &str| value.parse::<f64>().map_err(|_| format!("{flag}: `{value}` is not a number"));
            match flag.as_str() {
                "--ordo-bin" => options.ordo_bin = value.into(),
                "--nats-bin" => options.nats_bin = value.into(),
                "--nats-nodes" => options.nats_nodes = number(&value)? as usize,
                "--phase" => options.phase = value,
                "--runs" => options.runs = (number(&value)? as usize).clamp(1, 50),
                "--seconds" => options.seconds = number(&value)?.clamp(0.5, 600.0),
                "--rate" => options.rate = number(&value)?.clamp(1.0, 100_000.0),
                "--connections" => options.connections = (number(&value)? as usize).clamp(1, 256),
                "--catchup-entries" => options.catchup_entries = (number(&value)? as u64).clamp(1, 10_000_000),
                "--catchup-nodes" => options.catchup_nodes = (number(&value)? as usize).clamp(1, 50),
                "--catchup-wrap" => options.catchup_wrap = Some(value),
                _ => return Err(format!("unknown flag {flag}\n{USAGE}").into()),
            }
        }
        if !matches!(options.nats_nodes, 1 | 3) {
            return Err("--nats-nodes is 1 or 3".into());
        }
        if !matches!(options.phase.as_str(), "latency" | "apply" | "catchup" | "all") {
            return Err("--phase is latency, apply, catchup or all".into());
        }
        for (what, path) in [("ordo", &options.ordo_bin), ("nats-server", &options.nats_bin)] {
            if !path.is_file() {
                return Err(format!(
                    "no {what} binary at {} (build it: `cargo build --release -p ordo-server`; nats-server: `make \
                     nats-server`, or pass --ordo-bin / --nats-bin)",
                    path.display()
                )
                .into());
            }
        }
        Ok(options)
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn temp_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    std::env::temp_dir().join(format!("ordo-cluster-bench-{}-{what}-{nanos}", std::process::id()))
}

/// A process of ours, stopped (SIGINT, then SIGKILL) and its directory removed on drop.
struct Process {
    child: Child,
    dir: PathBuf,
}

impl Process {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill sends a signal to our own child's pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A JetStream cluster of 1 or 3 `nats-server`s on loopback.
struct Nats {
    /// Held so that they stop (and their directories go) when the cluster is dropped.
    _servers: Vec<Process>,
    urls: Vec<String>,
}

impl Nats {
    fn start(binary: &Path, n: usize) -> Result<Nats> {
        let client_ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_>>()?;
        let route_ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_>>()?;
        let monitor_ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_>>()?;
        let mut servers = Vec::new();
        for i in 0..n {
            let dir = temp_dir(&format!("nats{i}"));
            std::fs::create_dir_all(&dir)?;
            let mut config = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\njetstream {{ store_dir: \"{}\" }}\n",
                client_ports[i],
                monitor_ports[i],
                dir.join("js").display()
            );
            if n > 1 {
                let routes: Vec<String> =
                    (0..n).filter(|&j| j != i).map(|j| format!("\"nats://127.0.0.1:{}\"", route_ports[j])).collect();
                config += &format!(
                    "cluster {{ name: ordo-bench, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                    route_ports[i],
                    routes.join(", ")
                );
            }
            let config_path = dir.join("nats.conf");
            std::fs::write(&config_path, config)?;
            let child = Command::new(binary)
                .arg("-c")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
            servers.push(Process { child, dir });
        }
        // JetStream is ready (a meta leader elected) when every /healthz says so.
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in &monitor_ports {
            loop {
                if let Ok((200, _)) = http_once(port, "GET", "/healthz", "") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("nats-server on monitor port {port} not healthy within 30 s").into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let urls = client_ports.iter().map(|port| format!("nats://127.0.0.1:{port}")).collect();
        Ok(Nats { _servers: servers, urls })
    }
}

/// An `ordo serve` process; `port` is where it listens.
struct Ordo {
    process: Process,
    port: u16,
}

impl Ordo {
    /// `cluster`: the NATS URLs and the stream's replicas, or single-node mode.
    fn start(binary: &Path, name: &str, cluster: Option<(&Nats, usize)>, extra: &[String]) -> Result<Ordo> {
        Ordo::start_wrapped(&[], binary, name, cluster, extra)
    }

    /// `start`, run under `wrap` (a profiler's command line) when not empty.
    fn start_wrapped(
        wrap: &[String],
        binary: &Path,
        name: &str,
        cluster: Option<(&Nats, usize)>,
        extra: &[String],
    ) -> Result<Ordo> {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir)?;
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&dir).args(extra);
        if let Some((nats, replicas)) = cluster {
            command.args(["--cluster", &nats.urls.join(","), "--node-name", name]);
            command.args(["--stream-replicas", &replicas.to_string()]);
        }
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = command.spawn().map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let stdout = child.stdout.take().ok_or("stdout not piped")?;
        let process = Process { child, dir };
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    if let (Some(sender), Ok(port)) = (port_tx.take(), digits.parse::<u16>()) {
                        let _ = sender.send(port);
                    }
                }
            }
        });
        let port = port_rx
            .recv_timeout(Duration::from_secs(120))
            .map_err(|_| format!("`ordo serve` ({name}) printed no listening line within 120 s"))?;
        Ok(Ordo { process, port })
    }

    fn health(&self) -> Result<serde_json::Value> {
        let (status, body) = http_once(self.port, "GET", "/v1/health", "")?;
        if status != 200 {
            return Err(format!("/v1/health answered {status}: {body}").into());
        }
        Ok(serde_json::from_str(&body)?)
    }

    fn applied_seq(&self) -> Result<u64> {
        let health = self.health()?;
        Ok(health["cluster"]["applied_seq"].as_u64().or(health["last_seq"].as_u64()).unwrap_or(0))
    }
}

/// One keep-alive HTTP/1.1 connection (bodies with Content-Length only, as `ordo serve` sends them).
struct Http {
    stream: BufReader<TcpStream>,
}

impl Http {
    fn connect(port: u16) -> Result<Http> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Http { stream: BufReader::new(stream) })
    }

    fn request(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        let head =
            format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        self.stream.get_mut().write_all(head.as_bytes())?;
        let mut line = String::new();
        self.stream.read_line(&mut line)?;
        let status: u16 = line.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or("no HTTP status line")?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse()?;
                }
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body)?;
        Ok((status, String::from_utf8(body)?))
    }
}

fn http_once(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    Http::connect(port)?.request(method, path, body)
}

fn create_collection(port: u16) -> Result<()> {
    let schema = r#"{"fields":[{"name":"recency","type":"u64"},{"name":"name","type":"string"}]}"#;
    let (status, body) = http_once(port, "PUT", "/v1/collections/rooms", schema)?;
    if !matches!(status, 200 | 201) {
        return Err(format!("creating `rooms` answered {status}: {body}").into());
    }
    Ok(())
}

fn write_body(n: u64) -> String {
    format!(
        r#"{{"ops":[{{"op":"upsert","id":"r{}","fields":{{"recency":{n},"name":"room {}"}}}}]}}"#,
        n % 10_000,
        n % 10_000
    )
}

/// `connections` threads write at `rate` in all for `seconds`; each write's
/// latency (send to answer) in microseconds, sorted.
fn measure_writes(port: u16, connections: usize, rate: f64, seconds: f64) -> Result<Vec<u64>> {
    let interval = Duration::from_secs_f64(connections as f64 / rate);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..connections)
        .map(|thread| {
            std::thread::spawn(move || -> Result<Vec<u64>> {
                let mut http = Http::connect(port)?;
                let mut latencies = Vec::new();
                // Staggered, so the connections do not all send at once.
                let mut next = started + interval.mul_f64(thread as f64 / connections as f64);
                let mut n = thread as u64;
                while next < end {
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let sent = Instant::now();
                    let (status, body) = http.request("POST", "/v1/collections/rooms/batch", &write_body(n))?;
                    if status != 200 {
                        return Err(format!("a write answered {status}: {body}").into());
                    }
                    latencies.push(sent.elapsed().as_micros() as u64);
                    n += connections as u64;
                    next += interval;
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for thread in threads {
        all.extend(thread.join().map_err(|_| "a writer thread panicked")??);
    }
    all.sort_unstable();
    Ok(all)
}

fn quantile_ms(sorted: &[u64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * quantile).round() as usize] as f64 / 1000.0
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn latency_phase(options: &Options) -> Result<()> {
    println!(
        "\n== write acknowledgement latency: {} writes/s over {} connections, {} s per run, {} runs ==",
        options.rate, options.connections, options.seconds, options.runs
    );
    println!(
        "single node: --durability full (fdatasync per group commit); cluster: {} NATS servers, R{} stream, \
              default sync_interval, the node's own log relaxed",
        options.nats_nodes, options.nats_nodes
    );
    let (mut single_p50, mut single_p99, mut cluster_p50, mut cluster_p99, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..options.runs {
        let single = Ordo::start(&options.ordo_bin, "single", None, &[])?;
        create_collection(single.port)?;
        let single_latencies = measure_writes(single.port, options.connections, options.rate, options.seconds)?;
        drop(single);
        let nats = Nats::start(&options.nats_bin, options.nats_nodes)?;
        let node = Ordo::start(&options.ordo_bin, "node-a", Some((&nats, options.nats_nodes)), &[])?;
        create_collection(node.port)?;
        let cluster_latencies = measure_writes(node.port, options.connections, options.rate, options.seconds)?;
        drop(node);
        drop(nats);
        let (s50, s99) = (quantile_ms(&single_latencies, 0.5), quantile_ms(&single_latencies, 0.99));
        let (c50, c99) = (quantile_ms(&cluster_latencies, 0.5), quantile_ms(&cluster_latencies, 0.99));
        println!(
            "run {}: single p50 {s50:.2} ms p99 {s99:.2} ms ({} writes) | cluster p50 {c50:.2} ms p99 {c99:.2} ms \
             ({} writes) | cluster/single p99 {:.2}x",
            run + 1,
            single_latencies.len(),
            cluster_latencies.len(),
            c99 / s99
        );
        single_p50.push(s50);
        single_p99.push(s99);
        cluster_p50.push(c50);
        cluster_p99.push(c99);
        ratios.push(c99 / s99);
    }
    println!(
        "median: single p50 {:.2} ms p99 {:.2} ms | cluster p50 {:.2} ms p99 {:.2} ms | cluster/single p99 {:.2}x \
         (goal: at most 4x)",
        median(&mut single_p50),
        median(&mut single_p99),
        median(&mut cluster_p50),
        median(&mut cluster_p99),
        median(&mut ratios)
    );
    Ok(())
}

/// Fills the stream through `node` as fast as `connections` writers go; returns the last seq.
fn fill(node: &Ordo, entries: u64, connections: usize) -> Result<u64> {
    let port = node.port;
    let per_thread = entries.div_ceil(connections as u64);
    let threads: Vec<_> = (0..connections as u64)
        .map(|thread| {
            std::thread::spawn(move || -> Result<()> {
                let mut http = Http::connect(port)?;
                for i in 0..per_thread {
                    let (status, body) =
                        http.request("POST", "/v1/collections/rooms/batch", &write_body(thread * per_thread + i))?;
                    if status != 200 {
                        return Err(format!("a write answered {status}: {body}").into());
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a writer thread panicked")??;
    }
    node.applied_seq()
}

fn catchup_phase(options: &Options) -> Result<()> {
    println!("\n== catch-up of a new node: {} entries (one upsert each) ==", options.catchup_entries);
    let nats = Nats::start(&options.nats_bin, options.nats_nodes)?;
    let node_a = Ordo::start(&options.ordo_bin, "node-a", Some((&nats, options.nats_nodes)), &[])?;
    create_collection(node_a.port)?;
    let filled = Instant::now();
    let target = fill(&node_a, options.catchup_entries, options.connections.max(16))?;
    let fill_seconds = filled.elapsed().as_secs_f64();
    println!(
        "filled: {target} entries through node-a in {fill_seconds:.1} s ({:.0} entries/s: the write path's \
         throughput with {} connections)",
        target as f64 / fill_seconds,
        options.connections.max(16)
    );
    let (mut from_start, mut while_applying, mut cpu_per_100k) = (Vec::new(), Vec::new(), Vec::new());
    for n in 1..=options.catchup_nodes {
        let caught_up = catch_up_once(options, &nats, n, target)?;
        from_start.push(caught_up.from_start);
        while_applying.extend(caught_up.while_applying);
        cpu_per_100k.push(caught_up.cpu_seconds * 100_000.0 / target as f64);
    }
    println!(
        "median of {} new nodes: {:.0} entries/s from process start, {:.0} entries/s while applying, {:.3} CPU-s \
         per 100 000 entries (goal: 200 000/s)",
        options.catchup_nodes,
        median(&mut from_start),
        median(&mut while_applying),
        median(&mut cpu_per_100k)
    );
    println!("node-a pid {}", node_a.process.pid());
    Ok(())
}

struct CaughtUp {
    from_start: f64,
    while_applying: Option<f64>,
    cpu_seconds: f64,
}

/// Starts new node `n` with an empty data directory and waits until it applied
/// the stream up to `target`; prints its rates and its CPU time by thread.
fn catch_up_once(options: &Options, nats: &Nats, n: usize, target: u64) -> Result<CaughtUp> {
    let wrap: Vec<String> = options
        .catchup_wrap
        .as_deref()
        .map(|wrap| wrap.split_whitespace().map(|word| word.replace("{n}", &n.to_string())).collect())
        .unwrap_or_default();
    let name = format!("node-b{n}");
    let spawned = Instant::now();
    let node_b = Ordo::start_wrapped(&wrap, &options.ordo_bin, &name, Some((nats, options.nats_nodes)), &[])?;
    let listening = spawned.elapsed();
    let at_listening = node_b.applied_seq()?;
    let mut first_progress: Option<(Instant, u64)> = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        let applied = node_b.applied_seq()?;
        if first_progress.is_none() && applied > at_listening {
            first_progress = Some((Instant::now(), applied));
        }
        if applied >= target {
            break Instant::now();
        }
        if Instant::now() > deadline {
            return Err(format!("{name} applied {applied} of {target} entries in 600 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Read at once: the node idles from here on.
    let pid = if wrap.is_empty() { node_b.process.pid() } else { child_of(node_b.process.pid())? };
    let (cpu_seconds, by_thread) = cpu_of(pid)?;
    let total = done - spawned;
    let from_start = target as f64 / total.as_secs_f64();
    println!(
        "{name}: listening after {:.2} s (applied {at_listening} by then), all {target} applied {:.2} s after \
         start: {from_start:.0} entries/s from process start",
        listening.as_secs_f64(),
        total.as_secs_f64(),
    );
    let while_applying = first_progress.map(|(at, applied)| {
        let rate = (target - applied) as f64 / (done - at).as_secs_f64().max(1e-3);
        println!("{name}: {rate:.0} entries/s while applying (from the first progress seen by /v1/health)");
        rate
    });
    let per_100k = |seconds: f64| seconds * 100_000.0 / target as f64;
    let threads: Vec<String> =
        by_thread.iter().map(|(thread, seconds)| format!("{thread} {:.3}", per_100k(*seconds))).collect();
    println!(
        "{name}: {:.3} CPU-s per 100 000 entries from process start (by thread: {})",
        per_100k(cpu_seconds),
        threads.join(", ")
    );
    Ok(CaughtUp { from_start, while_applying, cpu_seconds })
}

/// The first child of `pid` (the node a wrapper such as `perf record` started),
/// or `pid` itself when it has none (a wrapper that `exec`s the node).
fn child_of(pid: u32) -> Result<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(children.split_whitespace().next().map_or(Ok(pid), str::parse)?)
}

/// User + system CPU seconds of `pid` (every thread, live or exited) and of its
/// live threads by name (`/proc/<pid>/task/*/stat`), the busiest first.
fn cpu_of(pid: u32) -> Result<(f64, Vec<(String, f64)>)> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let read = |path: String| -> Result<(String, f64)> {
        let stat = std::fs::read_to_string(path)?;
        let open = stat.find('(').ok_or("no ( in stat")?;
        let close = stat.rfind(')').ok_or("no ) in stat")?;
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields 14 and 15 of proc(5) (utime, stime); `fields` starts at field 3.
        let utime: f64 = fields.get(11).ok_or("short stat")?.parse()?;
        let stime: f64 = fields.get(12).ok_or("short stat")?.parse()?;
        Ok((stat[open + 1..close].to_owned(), (utime + stime) / ticks))
    };
    let (_, total) = read(format!("/proc/{pid}/stat"))?;
    let mut by_thread: Vec<(String, f64)> = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let (name, seconds) = read(format!("{}/stat", task?.path().display()))?;
        match by_thread.iter_mut().find(|(known, _)| *known == name) {
            Some((_, sum)) => *sum += seconds,
            None => by_thread.push((name, seconds)),
        }
    }
    let live: f64 = by_thread.iter().map(|(_, seconds)| seconds).sum();
    by_thread.push(("exited threads".to_owned(), (total - live).max(0.0)));
    by_thread.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((total, by_thread))
}

/// The apply side's ceiling, without NATS: `entries` one-upsert batches into a
/// store with the cluster's durability (relaxed: the stream is the durable
/// copy), one `Database::write` (one log append, one group) per entry against
/// `write_group` of `group` entries. A catching-up node's writer can do no
/// better than this; the gap between the two says what batching entries per
/// writer command and per group commit is worth.
fn apply_phase(options: &Options) -> Result<()> {
    use ordo_core::{Batch, FieldType, NullSink, Schema, Value};
    use ordo_store::{Database, Durability, PendingWrite, StoreOptions};
    let entries = options.catchup_entries;
    println!("\n== apply ceiling (store only, relaxed durability): {entries} one-upsert entries ==");
    let run = |group: usize| -> Result<f64> {
        let dir = temp_dir(&format!("apply-{group}"));
        let store_options = StoreOptions { durability: Durability::Relaxed, ..StoreOptions::default() };
        let (mut database, _) = Database::open(&dir, store_options, &mut |_| {})?;
        let schema = Schema::new().with_field("recency", FieldType::U64).with_field("name", FieldType::String);
        let rooms = database.create_collection("rooms", schema)?;
        let mut pending: Vec<PendingWrite> = (0..group).map(|_| PendingWrite::new(rooms, Batch::new())).collect();
        let names: Vec<String> = (0..10_000).map(|i| format!("room {i}")).collect();
        let ids: Vec<String> = (0..10_000).map(|i| format!("r{i}")).collect();
        let started = Instant::now();
        let mut n = 0u64;
        while n < entries {
            let n_now = (group as u64).min(entries - n) as usize;
            for (k, write) in pending[..n_now].iter_mut().enumerate() {
                let i = (n as usize + k) % 10_000;
                write.batch.clear();
                write.batch.upsert(&ids[i]).set("recency", Value::U64(n + k as u64)).set("name", Value::Str(&names[i]));
                write.result = None;
            }
            database.write_group(&mut pending[..n_now], &mut NullSink);
            for write in &mut pending[..n_now] {
                write.result.take().ok_or("no result")??;
            }
            n += n_now as u64;
        }
        let seconds = started.elapsed().as_secs_f64();
        drop(database);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(entries as f64 / seconds)
    };
    for _ in 0..options.runs {
        let (one, grouped) = (run(1)?, run(256)?);
        println!(
            "one entry per group commit: {one:.0} entries/s | 256 per group commit: {grouped:.0} entries/s ({:.1}x) \
             (goal for catch-up: 200 000/s)",
            grouped / one
        );
    }
    Ok(())
}

fn main() {
    let result = Options::parse().and_then(|options| {
        println!(
            "cluster-bench: {} cores here; other processes on the machine share them",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        if matches!(options.phase.as_str(), "latency" | "all") {
            latency_phase(&options)?;
        }
        if matches!(options.phase.as_str(), "apply" | "all") {
            apply_phase(&options)?;
        }
        if matches!(options.phase.as_str(), "catchup" | "all") {
            catchup_phase(&options)?;
        }
        Ok(())
    });
    if let Err(error) = result {
        eprintln!("cluster-bench: {error}");
        std::process::exit(1);
    }
}
