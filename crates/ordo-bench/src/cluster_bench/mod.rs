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
//! - **shapes**: the stream's cost per entry sent one per message, in atomic
//!   batches of K, and K to a message (`--pack`), on `sync_interval: always`
//!   servers ([`shapes`]).
//!
//! Benchmarks are not tests: nothing here asserts a time. Every figure is
//! printed next to its peer from the same run.

pub mod catchup;
pub mod ceiling;
pub mod chat;
pub mod latency;
pub mod procs;
pub mod shapes;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::TypedValueParser as _;

use crate::cli::in_range;
use crate::live::Result;

/// Cluster mode's figures: write latency against a single node, the store's apply
/// ceiling, catch-up speed, chat served by 1, 2, 3... nodes, the stream's ceiling.
#[derive(clap::Parser)]
#[command(name = "cluster-bench")]
struct Args {
    /// The `ordo` binary (default: target/release/ordo of this workspace)
    #[arg(long, value_name = "PATH")]
    ordo_bin: Option<PathBuf>,
    /// nats-server (default: $ORDO_NATS_SERVER, else <repo>/.tools/bin/nats-server)
    #[arg(long, value_name = "PATH")]
    nats_bin: Option<PathBuf>,
    /// NATS servers in the JetStream cluster, 1 or 3 (the stream has as many replicas)
    #[arg(long, default_value_t = 3, value_parser = clap::builder::PossibleValuesParser::new(["1", "3"]).map(|n| n.parse::<usize>().expect("a listed number")))]
    nats_nodes: usize,
    /// apply: the store's apply ceiling, no NATS
    #[arg(long, default_value = "all", value_parser = ["latency", "apply", "catchup", "chat", "ceiling", "shapes", "all"])]
    phase: String,
    /// Runs of the latency, apply, chat and ceiling phases
    #[arg(long, default_value_t = 3, value_parser = in_range(1usize, 50))]
    runs: usize,
    /// Length of each latency run and of each chat write phase, in seconds
    #[arg(long, default_value_t = 10.0, value_parser = in_range(0.5, 600.0))]
    seconds: f64,
    /// Writes per second in the latency phase, all connections together
    #[arg(long, default_value_t = 500.0, value_parser = in_range(1.0, 100_000.0))]
    rate: f64,
    /// Keep-alive HTTP connections writing at once (chat: per node)
    #[arg(long, default_value_t = 8, value_parser = in_range(1usize, 256))]
    connections: usize,
    /// Entries in the stream before the new node starts
    #[arg(long, default_value_t = 100_000, value_parser = in_range(1u64, 10_000_000))]
    catchup_entries: u64,
    /// New nodes started one after another on the same stream, each from an empty data
    /// directory: one fill, N catch-up figures and their median
    #[arg(long, default_value_t = 3, value_parser = in_range(1usize, 50))]
    catchup_nodes: usize,
    /// Runs each new node under CMD (split on spaces; `{n}` is the node's number), e.g.
    /// `perf record -g -o /tmp/catchup-{n}.data --` (CPU is then read from its child)
    #[arg(long, value_name = "CMD", allow_hyphen_values = true)]
    catchup_wrap: Option<String>,
    /// chat: users = collections, over all nodes (collection names are `user-NNNN`)
    #[arg(long, default_value_t = 1_000, value_parser = in_range(1usize, 9_999))]
    users: usize,
    /// chat: WebSockets watching each user's list, so that each update reaches N
    /// subscribers and serving them outweighs taking the write
    #[arg(long, default_value_t = 1, value_parser = in_range(1usize, 1_000))]
    subscribers_per_user: usize,
    /// chat: rooms per user (room ids are `!rNNNN:...`)
    #[arg(long, default_value_t = 200, value_parser = in_range(1usize, 9_999))]
    rooms: usize,
    /// chat: window length of every subscription (PROTOCOL.md: at most 1 000 items)
    #[arg(long, default_value_t = 20, value_parser = in_range(1usize, 1_000))]
    window: usize,
    /// chat: updates per second written through the nodes together
    #[arg(long, default_value_t = 1_000.0, value_parser = in_range(1.0, 100_000.0))]
    chat_rate: f64,
    /// chat: cluster sizes to measure
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "1,2,3", value_parser = in_range(1usize, 8))]
    nodes: Vec<usize>,
    /// ceiling: PubAcks outstanding
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "256,1024", value_parser = in_range(1usize, 65_536))]
    in_flight: Vec<usize>,
    /// chat, latency: more `ordo serve` arguments for every cluster node, split on spaces
    /// (e.g. `--coalesce-entries 1` to publish one entry per message)
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true, default_value = "")]
    node_args: String,
    /// shapes: entries per atomic batch and per message
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "16,64", value_parser = in_range(2usize, 1_000))]
    pack: Vec<usize>,
    /// ceiling: payload bytes per entry (about a one-update chat entry; NATS' default
    /// max_payload is 1 MiB)
    #[arg(long, default_value_t = 150, value_parser = in_range(1usize, 1 << 20))]
    entry_bytes: usize,
    /// ceiling: entries published per measurement
    #[arg(long, default_value_t = 20_000, value_parser = in_range(1u64, 10_000_000))]
    ceiling_entries: u64,
}

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
    pub pack: Vec<usize>,
    pub node_args: Vec<String>,
    pub entry_bytes: usize,
    pub ceiling_entries: u64,
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Options {
    pub fn parse() -> Result<Options> {
        let args = <Args as clap::Parser>::parse();
        let options = Options {
            ordo_bin: args.ordo_bin.unwrap_or_else(|| repo_root().join("target/release/ordo")),
            nats_bin: args.nats_bin.unwrap_or_else(|| {
                std::env::var_os("ORDO_NATS_SERVER")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| repo_root().join(".tools/bin/nats-server"))
            }),
            nats_nodes: args.nats_nodes,
            phase: args.phase,
            runs: args.runs,
            seconds: args.seconds,
            rate: args.rate,
            connections: args.connections,
            catchup_entries: args.catchup_entries,
            catchup_nodes: args.catchup_nodes,
            catchup_wrap: args.catchup_wrap,
            users: args.users,
            subscribers_per_user: args.subscribers_per_user,
            rooms: args.rooms,
            window: args.window,
            chat_rate: args.chat_rate,
            nodes: args.nodes,
            tick: Duration::from_millis(4),
            in_flight: args.in_flight,
            pack: args.pack,
            node_args: args.node_args.split_whitespace().map(str::to_owned).collect(),
            entry_bytes: args.entry_bytes,
            ceiling_entries: args.ceiling_entries,
        };
        let needs_ordo = options.phase != "ceiling" && options.phase != "shapes";
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
        if all || options.phase == "shapes" {
            shapes::shapes_phase(&options)?;
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    /// Every option is read back as its field's type: a range parser whose
    /// literal bounds default to `i32` would panic here, as the binary did at start.
    #[test]
    fn the_command_line_reads_back_every_option() {
        super::Args::command().debug_assert();
        for line in [vec!["cluster-bench"], vec!["cluster-bench", "--runs", "2", "--pack", "4,8", "--nodes", "1,3"]] {
            let matches = super::Args::command().try_get_matches_from(line).expect("parses");
            let args = super::Args::from_arg_matches(&matches).expect("reads back");
            assert!(args.runs >= 2 && !args.pack.is_empty());
        }
    }
}
