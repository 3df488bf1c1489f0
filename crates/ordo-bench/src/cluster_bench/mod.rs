//! `cluster-bench`: cluster mode's figures (docs/BENCHMARKS.md, "Cluster mode";
//! the phases are defined in `SCENARIOS.md`).
//!
//! ```text
//! cargo build --release -p ordo-server --bin ordo -p ordo-bench --bin cluster-bench
//! target/release/cluster-bench --ordo-bin target/release/ordo                 # every phase
//! target/release/cluster-bench --ordo-bin target/release/ordo --phase latency --runs 5
//! target/release/cluster-bench --ordo-bin target/release/ordo --phase chat --seconds 10 --runs 3
//! target/release/cluster-bench --phase ceiling --runs 3
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
//! - **chat**: loadgen's chat scenario (users × rooms, one WebSocket per user on
//!   its top rooms, random rooms moved to the top) against a single-node server
//!   and split across 1, 2, 3… cluster nodes (`--nodes`): the same subscribers
//!   spread evenly over the nodes, the same update rate written through them;
//!   per node the CPU time over the write phase per 1 000 subscribers and per
//!   1 000 updates/s, the cost of following the log (an observer node with no
//!   subscribers and no writes) and of serving, and the check that every list
//!   ends equal to its node's window with 0 updates lost ([`chat`]).
//! - **ceiling**: the stream's own entries/s ceiling: async-nats publishes
//!   Ordo-sized entries straight to an R3 stream with many PubAcks in flight,
//!   `sync_interval: always` against the default ([`ceiling`]).
//!
//! Benchmarks are not tests: nothing here asserts a time. Every figure is
//! printed next to its peer from the same run.

pub mod catchup;
pub mod ceiling;
pub mod chat;
pub mod latency;
pub mod procs;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::live::Result;

pub const USAGE: &str = "cluster-bench [options]
  --ordo-bin PATH        the `ordo` binary (default: target/release/ordo of this workspace)
  --nats-bin PATH        nats-server (default: $ORDO_NATS_SERVER, else <repo>/.tools/bin/nats-server)
  --nats-nodes N         NATS servers in the JetStream cluster, 1 or 3 (default 3; the stream has as many replicas)
  --phase latency|apply|catchup|chat|ceiling|all   (default all; apply: the store's apply ceiling, no NATS)
  --runs N               runs of the latency, apply, chat and ceiling phases (default 3)
  --seconds N            length of each latency run and of each chat write phase (default 10)
  --rate N               writes per second in the latency phase, all connections together (default 500)
  --connections N        keep-alive HTTP connections writing at once (default 8; chat: per node)
  --catchup-entries N    entries in the stream before the new node starts (default 100000)
  --catchup-nodes N      new nodes started one after another on the same stream, each from an empty
                         data directory (default 3): one fill, N catch-up figures and their median
  --catchup-wrap CMD     runs each new node under CMD (split on spaces; `{n}` is the node's number),
                         e.g. `perf record -g -o /tmp/catchup-{n}.data --` (CPU is then read from its child)
  --users N              chat: users = collections, over all nodes (default 1000)
  --subscribers-per-user N
                         chat: WebSockets watching each user's list, so that each update reaches N
                         subscribers and serving them outweighs taking the write (default 1)
  --rooms N              chat: rooms per user (default 200)
  --window N             chat: window length of every subscription (default 20)
  --chat-rate N          chat: updates per second written through the nodes together (default 1000)
  --nodes LIST           chat: cluster sizes to measure, e.g. 1,2,3 (default 1,2,3)
  --in-flight LIST       ceiling: PubAcks outstanding, e.g. 256,1024 (default 256,1024)
  --entry-bytes N        ceiling: payload bytes per entry (default 150, about a one-update chat entry)
  --ceiling-entries N    ceiling: entries published per measurement (default 20000)";

pub struct Options {
    pub ordo_bin: PathBuf,
    pub nats_bin: PathBuf,
    pub nats_nodes: usize,
    pub phase: String,
    pub runs: usize,
    pub seconds: f64,
    pub rate: f64,
    pub connections: usize,
    pub catchup_entries: u64,
    pub catchup_nodes: usize,
    pub catchup_wrap: Option<String>,
    pub users: usize,
    pub subscribers_per_user: usize,
    pub rooms: usize,
    pub window: usize,
    pub chat_rate: f64,
    pub nodes: Vec<usize>,
    pub tick: Duration,
    pub in_flight: Vec<usize>,
    pub entry_bytes: usize,
    pub ceiling_entries: u64,
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `1,2,3` → `[1, 2, 3]`, each in `low..=high`.
fn parse_list(flag: &str, value: &str, low: usize, high: usize) -> Result<Vec<usize>> {
    let list: Vec<usize> = value
        .split(',')
        .map(|item| item.trim().parse::<usize>().map_err(|_| format!("{flag}: `{item}` is not a number")))
        .collect::<std::result::Result<_, _>>()?;
    if list.is_empty() || list.iter().any(|&n| n < low || n > high) {
        return Err(format!("{flag}: each of `{value}` must be in {low}..={high}").into());
    }
    Ok(list)
}

impl Options {
    pub fn parse() -> Result<Options> {
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
            users: 1_000,
            subscribers_per_user: 1,
            rooms: 200,
            window: 20,
            chat_rate: 1_000.0,
            nodes: vec![1, 2, 3],
            tick: Duration::from_millis(4),
            in_flight: vec![256, 1024],
            entry_bytes: 150,
            ceiling_entries: 20_000,
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
                // Collection names are `user-NNNN` and room ids `!rNNNN:…`: four digits each.
                "--users" => options.users = (number(&value)? as usize).clamp(1, 9_999),
                "--subscribers-per-user" => options.subscribers_per_user = (number(&value)? as usize).clamp(1, 1_000),
                "--rooms" => options.rooms = (number(&value)? as usize).clamp(1, 9_999),
                // PROTOCOL.md: a window holds at most 1 000 items.
                "--window" => options.window = (number(&value)? as usize).clamp(1, 1_000),
                "--chat-rate" => options.chat_rate = number(&value)?.clamp(1.0, 100_000.0),
                "--nodes" => options.nodes = parse_list(&flag, &value, 1, 8)?,
                "--in-flight" => options.in_flight = parse_list(&flag, &value, 1, 65_536)?,
                // The NATS default max_payload is 1 MiB.
                "--entry-bytes" => options.entry_bytes = (number(&value)? as usize).clamp(1, 1 << 20),
                "--ceiling-entries" => options.ceiling_entries = (number(&value)? as u64).clamp(1, 10_000_000),
                _ => return Err(format!("unknown flag {flag}\n{USAGE}").into()),
            }
        }
        if !matches!(options.nats_nodes, 1 | 3) {
            return Err("--nats-nodes is 1 or 3".into());
        }
        if !matches!(options.phase.as_str(), "latency" | "apply" | "catchup" | "chat" | "ceiling" | "all") {
            return Err("--phase is latency, apply, catchup, chat, ceiling or all".into());
        }
        let needs_ordo = options.phase != "ceiling";
        for (what, path) in [("ordo", &options.ordo_bin), ("nats-server", &options.nats_bin)] {
            if (what == "ordo" && !needs_ordo) || path.is_file() {
                continue;
            }
            return Err(format!(
                "no {what} binary at {} (build it: `cargo build --release -p ordo-server`; nats-server: `make \
                 nats-server`, or pass --ordo-bin / --nats-bin)",
                path.display()
            )
            .into());
        }
        Ok(options)
    }
}

pub fn quantile_ms(sorted: &[u64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * quantile).round() as usize] as f64 / 1000.0
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The machine's load averages (`/proc/loadavg`), printed with every figure:
/// other processes share the cores.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs the phases `options` name; exits non-zero on an error or a failed correctness check.
pub fn main() {
    let result = Options::parse().and_then(|options| {
        println!(
            "cluster-bench: {} cores here; other processes on the machine share them (load average {})",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_average()
        );
        let all = options.phase == "all";
        if all || options.phase == "latency" {
            latency::latency_phase(&options)?;
        }
        if all || options.phase == "apply" {
            catchup::apply_phase(&options)?;
        }
        if all || options.phase == "catchup" {
            catchup::catchup_phase(&options)?;
        }
        if all || options.phase == "ceiling" {
            ceiling::ceiling_phase(&options)?;
        }
        if all || options.phase == "chat" {
            chat::chat_phase(&options)?;
        }
        Ok(())
    });
    if let Err(error) = result {
        eprintln!("cluster-bench: {error}");
        std::process::exit(1);
    }
}
