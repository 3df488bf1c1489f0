//! `loadgen`: drives a live `ordo serve` over its wire protocol (docs/PROTOCOL.md)
//! and measures what a user of the server sees: end-to-end latency from a write
//! to the diff on every subscriber's socket, losses, and whether every client's
//! list ends equal to the server's window; and what it costs: the server's CPU
//! and memory, frames and bytes on the wire.
//!
//! ```text
//! cargo run --release -p ordo-bench --bin loadgen -- --quick      # CI smoke run, ~10 s
//! cargo run --release -p ordo-bench --bin loadgen                 # both scenarios, 20 s each
//! cargo run --release -p ordo-bench --bin loadgen -- --scenario chat --seconds 60
//! ```
//!
//! By default it runs `cargo build --release -p ordo-server --bin ordo` first, then
//! starts `target/release/ordo serve --listen 127.0.0.1:0 --data-dir <fresh temp dir>`
//! as its child (one fresh server per scenario) so that it can read the server's
//! CPU and memory from `/proc`. `--server-bin PATH` skips the build; `--server-url
//! http://host:port` runs against a server that is already up (no CPU or memory
//! figures then).
//!
//! Scenarios (each prints one result block):
//!
//! - `chat`: 1 000 users, each a collection of 1 000 rooms, each watched by one
//!   WebSocket on its top 20 by `recency`; one writer sends 20 000 updates/s that
//!   each move a random room of a random user to the top of that user's list.
//! - `leaderboard`: one collection of 100 000 rooms, 1 000 subscribers on the same
//!   top 20 by `score`; 1 000 updates/s, about one in five entering the top 20.
//! - `chat-shared` (only when named): chat's users and rooms in one collection
//!   `rooms` with an `owner` field; each subscriber watches its own rows, through
//!   a filter it sends, or with `--auth` through the rules' row predicate
//!   `owner == $sub` (sending none): the same views either way.
//!
//! Latency is measured with one clock shared by the writer and the subscribers
//! (one `Instant` in this process): every update carries its send time in
//! microseconds, and a subscriber that receives an item carrying an update it has
//! not seen yet records `now - send time`. Each update also carries a number
//! (`unread` in chat, `update` in leaderboard) so that a subscriber counts it once
//! however often the server re-sends the item.
//!
//! With `--auth`, the server is started with `--auth-secret-file` (a fresh HS256
//! secret in a file next to its data directory) and the run is what an
//! authenticated deployment does: an admin installs access rules (`PUT
//! /v1/rules`: in chat, a reader reads only `user-{sub}`; a writer writes any
//! `user-*`), every subscriber connects under its own identity (a distinct
//! reader token, sub = its user id, sent as `{"op":"auth"}` after `welcome`, as
//! a browser does, and `authed` awaited before subscribing), the live writes
//! carry a writer token and the set-up and checks an admin token. Without
//! `--auth` nothing of this happens and the run is the same as before.
//!
//! The writer runs on this thread's runtime and the subscribers on their own
//! (`--subscriber-threads`, 1 by default), so that frame parsing does not delay the
//! writer's clock readings.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fastwebsockets::{FragmentCollector, Frame, OpCode, Payload};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONNECTION, HOST, UPGRADE};
use hyper::upgrade::Upgraded;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use ordo_server::auth::Role;
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

// ---------------------------------------------------------------------------
// Limits: every input of the load generator has one.

/// PROTOCOL.md: at most 10 000 ops in one write request (all parts together).
const MAX_OPS_PER_REQUEST: usize = 10_000;
/// PROTOCOL.md: a window holds at most 1 000 items.
const MAX_WINDOW_LIMIT: usize = 1_000;
/// Chat collection names are `user-NNNN`, room ids `!rNNNN:example.org`: four digits.
const MAX_CHAT_COLLECTIONS: usize = 10_000;
const MAX_CHAT_ROOMS_PER_COLLECTION: usize = 10_000;
/// Leaderboard room ids are `!rNNNNNN:example.org`: six digits.
const MAX_LEADERBOARD_ROOMS: usize = 1_000_000;
/// One WebSocket per subscriber; the server accepts at most 10 000 connections.
const MAX_SUBSCRIBERS: usize = 10_000;
const MAX_SECONDS: f64 = 3_600.0;
const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
const MAX_HTTP_CONNECTIONS: usize = 64;
const MAX_SUBSCRIBER_THREADS: usize = 64;
const MAX_TICK_MS: u64 = 100;
/// WebSocket handshakes in flight at once: a burst of 1 000 SYNs could overflow
/// the listen backlog and turn into one-second retransmit stalls.
const CONNECT_CONCURRENCY: usize = 64;
/// Largest server frame a subscriber accepts (a `Reset` of 1 000 items is far smaller).
const MAX_SERVER_FRAME_BYTES: usize = 16 * 1024 * 1024;
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(15);
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
const FIRST_FRAMES_TIMEOUT: Duration = Duration::from_secs(60);
/// Frames have settled once no subscriber received one for this long...
const SETTLE_QUIET: Duration = Duration::from_millis(500);
/// ...or, at the latest, this long after the writer stopped.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Printed next to the chat figures: the targets of the issue this bench serves.
const CHAT_GOAL: &str = "goal: p99 ≤ 10 ms, 0 lost, server ≤ 1 core";
/// Tokens minted by loadgen live this much longer than the write phase (set-up
/// of a million rooms and a thousand connections included).
const TOKEN_TTL_MARGIN_SECS: u64 = 3_600;
/// The auth issue's target for a run with `--auth` against one without.
const AUTH_GOAL: &str = "auth goal: p99 and server CPU within 5 % of the same run without --auth";

const USAGE: &str = "\
usage: loadgen [options]

  --scenario chat|leaderboard|both|chat-shared   (default both; chat-shared only when named:
                           the chat users' rooms in one collection `rooms` with an `owner` field, each
                           subscriber on its own rows: by its filter, or with --auth by the rules' row
                           predicate owner == $sub; --collections and --rooms size it as chat)
  --quick                  small sizes and 3 s of writes per scenario (CI smoke run, ~10 s)
  --seconds N              length of the write phase (default 20; at most 3600)
  --rate N                 chat updates per second (default 20000)
  --leaderboard-rate N     leaderboard updates per second (default 1000)
  --collections N          chat users = collections = subscribers (default 1000)
  --rooms N                chat rooms per user (default 1000)
  --leaderboard-rooms N    (default 100000)
  --leaderboard-subscribers N   (default 1000)
  --window N               window length of every subscription (default 20)
  --tick-ms N              the writer sends what is due every N ms (default 4)
  --http-connections N     keep-alive connections for writes, in flight at once (default 4)
  --subscriber-threads N   tokio workers for the subscribers (default 1)
  --seed N                 seed of the update stream (default 1)
  --server-bin PATH        the `ordo` binary to start (default: build it with cargo, then
                           use the one next to this executable, in target/release)
  --server-url URL         use a running server (http://host:port); CPU and RSS are not measured
  --durability full|relaxed  passed to `ordo serve`
  --server-arg ARG         one more argument for `ordo serve` (repeatable)
  --auth                   run with auth: the server verifies HS256 tokens (a secret loadgen writes),
                           rules let each chat user read only its own collection, every subscriber
                           authenticates as itself (`auth` message), every write carries a writer token
  --auth-secret-file FILE  with --auth: this secret (e.g. the one of a --server-url server) instead of a fresh one
  --timeline               also print end-to-end latency per second of send time (where the tail is)";

// ---------------------------------------------------------------------------
// Options

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ScenarioChoice {
    Chat,
    Leaderboard,
    Both,
    /// Only when named: chat with every user's rooms in one collection.
    ChatShared,
}

struct Options {
    scenario: ScenarioChoice,
    quick: bool,
    seconds: f64,
    chat_rate: f64,
    leaderboard_rate: f64,
    chat_collections: usize,
    chat_rooms: usize,
    leaderboard_rooms: usize,
    leaderboard_subscribers: usize,
    window_limit: usize,
    tick: Duration,
    http_connections: usize,
    subscriber_threads: usize,
    seed: u64,
    server_bin: Option<PathBuf>,
    server_url: Option<String>,
    durability: Option<String>,
    server_args: Vec<String>,
    timeline: bool,
    auth: bool,
    auth_secret_file: Option<PathBuf>,
}

fn parse_number<T: std::str::FromStr>(flag: &str, value: &str) -> std::result::Result<T, String> {
    value.parse::<T>().map_err(|_| format!("{flag}: `{value}` is not a valid number"))
}

fn check_range<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    value: T,
    low: T,
    high: T,
) -> std::result::Result<T, String> {
    if value < low || value > high {
        return Err(format!("{flag} must be in {low}..={high}, not {value}"));
    }
    Ok(value)
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> std::result::Result<Options, String> {
        let mut scenario = ScenarioChoice::Both;
        let mut quick = false;
        let mut seconds = None;
        let mut chat_rate = None;
        let mut leaderboard_rate = None;
        let mut chat_collections = None;
        let mut chat_rooms = None;
        let mut leaderboard_rooms = None;
        let mut leaderboard_subscribers = None;
        let mut window_limit = 20;
        let mut tick_ms = 4;
        let mut http_connections = 4;
        let mut subscriber_threads = 1;
        let mut seed = 1;
        let mut server_bin = None;
        let mut server_url = None;
        let mut durability = None;
        let mut server_args = Vec::new();
        let mut timeline = false;
        let mut auth = false;
        let mut auth_secret_file = None;

        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            // Both `--flag value` and `--flag=value`.
            let (flag, inline_value) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = || -> std::result::Result<String, String> {
                match &inline_value {
                    Some(value) => Ok(value.clone()),
                    None => args.next().ok_or_else(|| format!("{flag} needs a value")),
                }
            };
            match flag.as_str() {
                "-h" | "--help" => return Err(String::new()),
                "--quick" => quick = true,
                "--auth" => auth = true,
                "--auth-secret-file" => auth_secret_file = Some(PathBuf::from(value()?)),
                "--timeline" => timeline = true,
                "--scenario" => {
                    scenario = match value()?.as_str() {
                        "chat" => ScenarioChoice::Chat,
                        "leaderboard" => ScenarioChoice::Leaderboard,
                        "both" => ScenarioChoice::Both,
                        "chat-shared" => ScenarioChoice::ChatShared,
                        other => {
                            return Err(format!("--scenario: `{other}` is not chat, leaderboard, both or chat-shared"))
                        }
                    }
                }
                "--seconds" => seconds = Some(check_range(&flag, parse_number(&flag, &value()?)?, 0.1, MAX_SECONDS)?),
                "--rate" => {
                    chat_rate = Some(check_range(&flag, parse_number(&flag, &value()?)?, 1.0, MAX_RATE_PER_SECOND)?)
                }
                "--leaderboard-rate" => {
                    leaderboard_rate =
                        Some(check_range(&flag, parse_number(&flag, &value()?)?, 1.0, MAX_RATE_PER_SECOND)?)
                }
                "--collections" => {
                    chat_collections =
                        Some(check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_CHAT_COLLECTIONS - 1)?)
                }
                "--rooms" => {
                    chat_rooms =
                        Some(check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_CHAT_ROOMS_PER_COLLECTION - 1)?)
                }
                "--leaderboard-rooms" => {
                    leaderboard_rooms =
                        Some(check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_LEADERBOARD_ROOMS - 1)?)
                }
                "--leaderboard-subscribers" => {
                    leaderboard_subscribers =
                        Some(check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_SUBSCRIBERS)?)
                }
                "--window" => window_limit = check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_WINDOW_LIMIT)?,
                "--tick-ms" => tick_ms = check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_TICK_MS)?,
                "--http-connections" => {
                    http_connections = check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_HTTP_CONNECTIONS)?
                }
                "--subscriber-threads" => {
                    subscriber_threads = check_range(&flag, parse_number(&flag, &value()?)?, 1, MAX_SUBSCRIBER_THREADS)?
                }
                "--seed" => seed = parse_number(&flag, &value()?)?,
                "--server-bin" => server_bin = Some(PathBuf::from(value()?)),
                "--server-url" => server_url = Some(value()?),
                "--durability" => {
                    let mode = value()?;
                    if mode != "full" && mode != "relaxed" {
                        return Err(format!("--durability: `{mode}` is not full or relaxed"));
                    }
                    durability = Some(mode);
                }
                "--server-arg" => server_args.push(value()?),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if server_bin.is_some() && server_url.is_some() {
            return Err("--server-bin and --server-url exclude each other".to_string());
        }
        if server_url.is_some() && (durability.is_some() || !server_args.is_empty()) {
            return Err("--durability and --server-arg need a server started by loadgen, not --server-url".into());
        }
        if auth_secret_file.is_some() && !auth {
            return Err("--auth-secret-file needs --auth".to_string());
        }
        if auth && server_url.is_some() && auth_secret_file.is_none() {
            return Err("--auth with --server-url needs the server's --auth-secret-file".to_string());
        }
        // The quick run keeps every mechanism (load, 1 WebSocket per subscriber,
        // batched writes, verification) at sizes that finish in seconds.
        let options = Options {
            scenario,
            quick,
            seconds: seconds.unwrap_or(if quick { 3.0 } else { 20.0 }),
            chat_rate: chat_rate.unwrap_or(if quick { 2_000.0 } else { 20_000.0 }),
            leaderboard_rate: leaderboard_rate.unwrap_or(if quick { 500.0 } else { 1_000.0 }),
            chat_collections: chat_collections.unwrap_or(if quick { 200 } else { 1_000 }),
            chat_rooms: chat_rooms.unwrap_or(if quick { 200 } else { 1_000 }),
            leaderboard_rooms: leaderboard_rooms.unwrap_or(if quick { 10_000 } else { 100_000 }),
            leaderboard_subscribers: leaderboard_subscribers.unwrap_or(if quick { 200 } else { 1_000 }),
            window_limit,
            tick: Duration::from_millis(tick_ms),
            http_connections,
            subscriber_threads,
            seed,
            server_bin,
            server_url,
            durability,
            server_args,
            timeline,
            auth,
            auth_secret_file,
        };
        if options.chat_collections > MAX_SUBSCRIBERS {
            return Err(format!("--collections: at most {MAX_SUBSCRIBERS} subscribers (one per collection)"));
        }
        Ok(options)
    }

    fn runs_chat(&self) -> bool {
        matches!(self.scenario, ScenarioChoice::Chat | ScenarioChoice::Both)
    }

    fn runs_leaderboard(&self) -> bool {
        matches!(self.scenario, ScenarioChoice::Leaderboard | ScenarioChoice::Both)
    }

    fn runs_chat_shared(&self) -> bool {
        self.scenario == ScenarioChoice::ChatShared
    }
}

// ---------------------------------------------------------------------------
// Clock, random numbers, histogram

/// The one clock of the process: writers stamp updates with it and subscribers
/// read it on arrival, so latency needs no clock synchronisation.
#[derive(Clone, Copy)]
struct Clock {
    origin: Instant,
}

impl Clock {
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// xorshift64: a fixed seed gives the same update stream on every run.
struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    fn new(seed: u64) -> XorShift64 {
        // Zero is xorshift's one fixed point; mix the seed so that small seeds differ a lot.
        let state = (seed ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        XorShift64 { state: if state == 0 { 0x2545_F491_4F6C_DD1D } else { state } }
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// Uniform in `0..bound` (multiply-shift: no modulo bias worth the name at these bounds).
    fn below(&mut self, bound: u64) -> u64 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }
}

/// Log-linear histogram of microsecond values: exact below 256 µs, then 128
/// buckets per power of two (under 0.8 % relative error). Fixed size whatever
/// the number of samples, and shared by all subscribers through atomics.
struct Histogram {
    counts: Vec<AtomicU64>,
    n_samples: AtomicU64,
    max: AtomicU64,
}

const HISTOGRAM_SUB_BUCKET_BITS: u32 = 7;
const HISTOGRAM_SUB_BUCKETS: u64 = 1 << HISTOGRAM_SUB_BUCKET_BITS;
/// The highest bucket is `u64::MAX`'s: shift 56, mantissa 255, so index 56 × 128 + 255.
const HISTOGRAM_BUCKETS: usize = (64 - HISTOGRAM_SUB_BUCKET_BITS as usize + 1) * HISTOGRAM_SUB_BUCKETS as usize;
const _: () = assert!(HISTOGRAM_BUCKETS == 56 * 128 + 255 + 1);

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: (0..HISTOGRAM_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            n_samples: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    fn bucket_of(value: u64) -> usize {
        if value < 2 * HISTOGRAM_SUB_BUCKETS {
            return value as usize;
        }
        let shift = (63 - value.leading_zeros()) - HISTOGRAM_SUB_BUCKET_BITS;
        (shift as u64 * HISTOGRAM_SUB_BUCKETS + (value >> shift)) as usize
    }

    /// The middle of the bucket's range of values.
    fn value_of(bucket: usize) -> u64 {
        let bucket = bucket as u64;
        if bucket < 2 * HISTOGRAM_SUB_BUCKETS {
            return bucket;
        }
        let shift = bucket / HISTOGRAM_SUB_BUCKETS - 1;
        let mantissa = bucket - shift * HISTOGRAM_SUB_BUCKETS;
        (mantissa << shift) + ((1u64 << shift) >> 1)
    }

    fn record(&self, value: u64) {
        self.counts[Self::bucket_of(value)].fetch_add(1, Ordering::Relaxed);
        self.n_samples.fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(value, Ordering::Relaxed);
    }

    fn len(&self) -> u64 {
        self.n_samples.load(Ordering::Relaxed)
    }

    fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The value below which a `quantile` of the samples fall; 0 without samples.
    fn quantile(&self, quantile: f64) -> u64 {
        let n_samples = self.len();
        if n_samples == 0 {
            return 0;
        }
        let rank = ((quantile * n_samples as f64).ceil() as u64).clamp(1, n_samples);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::value_of(bucket).min(self.max());
            }
        }
        self.max()
    }
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn megabytes(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}

// ---------------------------------------------------------------------------
// Process figures from /proc

/// `(name, user plus system CPU seconds)` from a /proc `stat` file (of a process
/// or of one of its threads).
fn stat_cpu_seconds(stat_path: &str) -> Option<(String, f64)> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: it runs from
    // the first '(' to the last ')'. After it come field 3 (state) onwards;
    // utime and stime are fields 14 and 15.
    let name_end = stat.rfind(')')?;
    let name = stat.get(stat.find('(')? + 1..name_end)?.to_string();
    let mut fields = stat.get(name_end + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        return None;
    }
    Some((name, (utime + stime) as f64 / ticks_per_second as f64))
}

/// A process's CPU time (`pid` or "self"), in total and by thread name (threads
/// of one name summed: a runtime's workers share theirs), so that a report can
/// say which thread of the server is the busy one.
struct CpuSample {
    total_seconds: f64,
    by_thread_seconds: Vec<(String, f64)>,
}

impl CpuSample {
    fn read(pid: &str) -> Option<CpuSample> {
        let (_, total_seconds) = stat_cpu_seconds(&format!("/proc/{pid}/stat"))?;
        let mut by_thread_seconds: Vec<(String, f64)> = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let Some((name, seconds)) = stat_cpu_seconds(&format!("{}/stat", task.path().display())) else {
                continue; // the thread ended meanwhile
            };
            match by_thread_seconds.iter_mut().find(|(known, _)| *known == name) {
                Some((_, sum)) => *sum += seconds,
                None => by_thread_seconds.push((name, seconds)),
            }
        }
        Some(CpuSample { total_seconds, by_thread_seconds })
    }

    /// `cores (name cores, ...)` used from `before` to `self` over `wall_seconds`.
    fn cores_since(&self, before: &CpuSample, wall_seconds: f64) -> String {
        let mut text = format!("{:.2} cores", (self.total_seconds - before.total_seconds) / wall_seconds);
        let mut threads: Vec<(&str, f64)> = self
            .by_thread_seconds
            .iter()
            .map(|(name, seconds)| {
                let earlier = before.by_thread_seconds.iter().find(|(known, _)| known == name).map_or(0.0, |t| t.1);
                (name.as_str(), (seconds - earlier) / wall_seconds)
            })
            .filter(|(_, cores)| *cores >= 0.005)
            .collect();
        threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        if !threads.is_empty() {
            let parts: Vec<String> = threads.iter().map(|(name, cores)| format!("{name} {cores:.2}")).collect();
            write!(text, " ({})", parts.join(", ")).expect("writing to a String");
        }
        text
    }
}

/// `VmRSS` and `VmHWM` (peak RSS) in bytes, from /proc/<pid>/status.
fn memory_bytes(pid: &str) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// 1 000+ sockets need more descriptors than the usual soft limit of 1 024; the
/// hard limit is ours to take. The server, started afterwards, inherits it.
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

// ---------------------------------------------------------------------------
// The server process

/// `ordo serve` started by us: killed (SIGINT, then SIGKILL) and its data
/// directory removed when dropped, whatever path the scenario took.
struct ServerProcess {
    child: Child,
    data_dir: PathBuf,
    /// The secret file loadgen wrote for `--auth` (removed with the data directory).
    secret_file: Option<PathBuf>,
}

impl ServerProcess {
    fn start(binary: &Path, options: &Options, scenario: &str, auth: Option<&Auth>) -> Result<(ServerProcess, String)> {
        let data_dir = std::env::temp_dir().join(format!(
            "ordo-loadgen-{}-{scenario}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos())
        ));
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        std::fs::create_dir_all(&data_dir)?;
        let mut command = Command::new(binary);
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&data_dir);
        if let Some(durability) = &options.durability {
            command.args(["--durability", durability]);
        }
        let mut secret_file = None;
        if let Some(auth) = auth {
            let path = match &options.auth_secret_file {
                Some(path) => path.clone(),
                None => {
                    // Next to the data directory, readable by us only.
                    let path = PathBuf::from(format!("{}.secret", data_dir.display()));
                    let mut file = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&path)
                        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
                    file.write_all(&auth.secret)?;
                    secret_file = Some(path.clone());
                    path
                }
            };
            command.arg("--auth-secret-file").arg(path);
        }
        command.args(&options.server_args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let stdout = child.stdout.take().ok_or("the server's stdout is not piped")?;
        let mut server = ServerProcess { child, data_dir, secret_file };

        // A thread reads the server's stdout for the whole run: it finds the
        // listening line, and afterwards keeps the pipe drained (a full pipe would
        // block the server) and shows what the server says, marked as its.
        let (authority_tx, authority_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("ordo-stdout".into()).spawn(move || {
            let mut authority_tx = Some(authority_tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                eprintln!("  [ordo serve] {line}");
                if let Some(authority) = listening_authority(&line) {
                    if let Some(sender) = authority_tx.take() {
                        let _ = sender.send(authority);
                    }
                }
            }
        })?;
        match authority_rx.recv_timeout(SERVER_START_TIMEOUT) {
            Ok(authority) => Ok((server, authority)),
            Err(_) => {
                let status = server.child.try_wait().ok().flatten();
                Err(format!(
                    "`{} serve` printed no `listening on http://...` line within {:?} (exit status: {})",
                    binary.display(),
                    SERVER_START_TIMEOUT,
                    status.map_or("still running".to_string(), |status| status.to_string())
                )
                .into())
            }
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// SIGINT (a graceful shutdown), then SIGKILL if it is not gone in time.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill only sends a signal to our own child's pid.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
            }
            let deadline = Instant::now() + SERVER_STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                eprintln!("loadgen: the server ignored SIGINT for {SERVER_STOP_TIMEOUT:?}; killing it");
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
        if let Some(secret_file) = &self.secret_file {
            let _ = std::fs::remove_file(secret_file);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `... listening on http://127.0.0.1:PORT ...` → `127.0.0.1:PORT`.
fn listening_authority(line: &str) -> Option<String> {
    const MARKER: &str = "listening on http://";
    let start = line.find(MARKER)? + MARKER.len();
    let authority: String =
        line[start..].chars().take_while(|c| !c.is_whitespace() && *c != '/' && *c != ',').collect();
    authority.contains(':').then_some(authority)
}

/// `http://host:port[/]` → `host:port`.
fn url_authority(url: &str) -> Result<String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("--server-url `{url}` must start with http://"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(format!("--server-url `{url}` must be http://host:port").into());
    }
    Ok(authority.to_string())
}

/// The `ordo` binary to start: `--server-bin`, or one built now with cargo.
fn resolve_server_binary(options: &Options) -> Result<Option<PathBuf>> {
    if options.server_url.is_some() {
        return Ok(None);
    }
    if let Some(binary) = &options.server_bin {
        return Ok(Some(binary.clone()));
    }
    // Built in the same target directory as this executable; a debug loadgen
    // still starts a release server, since the server is what is measured.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    eprintln!("loadgen: cargo build --release -p ordo-server --bin ordo (skip with --server-bin PATH)");
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "ordo-server", "--bin", "ordo"])
        .current_dir(&workspace)
        .status()
        .map_err(|error| format!("cannot run `{cargo}` in {}: {error}; pass --server-bin", workspace.display()))?;
    if !status.success() {
        return Err(format!("`cargo build --release -p ordo-server` failed ({status})").into());
    }
    let own_dir = std::env::current_exe()?.parent().ok_or("this executable has no directory")?.to_path_buf();
    let release_dir = if own_dir.file_name().is_some_and(|name| name == "release") {
        own_dir
    } else {
        own_dir.parent().ok_or("this executable's directory has no parent")?.join("release")
    };
    let binary = release_dir.join("ordo");
    if !binary.exists() {
        return Err(format!("{} does not exist after the build; pass --server-bin", binary.display()).into());
    }
    Ok(Some(binary))
}

// ---------------------------------------------------------------------------
// Auth (`--auth`)

/// The HS256 secret of a run with `--auth`, and tokens minted with it as
/// `ordo token` mints them.
struct Auth {
    secret: Vec<u8>,
    ttl_secs: u64,
}

impl Auth {
    /// A fresh secret per server (or the one of `--auth-secret-file`); `None` without `--auth`.
    fn new(options: &Options) -> Result<Option<Arc<Auth>>> {
        if !options.auth {
            return Ok(None);
        }
        let secret = match &options.auth_secret_file {
            Some(path) => ordo_server::auth::read_secret_file(path)?,
            None => ordo_server::auth::generate_secret(),
        };
        Ok(Some(Arc::new(Auth { secret, ttl_secs: options.seconds.ceil() as u64 + TOKEN_TTL_MARGIN_SECS })))
    }

    fn token(&self, sub: &str, role: Role) -> Arc<str> {
        Arc::from(ordo_server::auth::mint(&self.secret, "role", sub, role, self.ttl_secs, &serde_json::Map::new()))
    }
}

/// One POST on a pooled connection, the connection returned to the pool.
async fn post_once(pool: &mut HttpPool, token: Option<Arc<str>>, path: &str, body: &str) -> Result<HttpReply> {
    let mut connection = pool.acquire().await;
    let reply = connection.request(Method::POST, path, body.as_bytes().to_vec(), token.as_deref()).await;
    let _ = pool.releaser().send(connection);
    reply
}

/// With `--auth`, a request the rules must refuse: `forbidden` (403) is
/// printed, anything else is a correctness failure (the rules would not be
/// what the run claims to measure).
async fn expect_forbidden(
    pool: &mut HttpPool,
    token: Option<Arc<str>>,
    what: &str,
    path: &str,
    body: &str,
) -> Result<()> {
    let reply = post_once(pool, token, path, body).await?;
    if reply.status == 403 {
        println!("  auth check: {what}: HTTP 403, refused as it must be");
    } else {
        count_failures(1);
        println!("  auth check FAILED: {what}: HTTP {} (expected 403): {}", reply.status, preview(&reply.body));
    }
    Ok(())
}

/// With `--auth` in chat-shared: a query the row predicate must leave empty.
async fn expect_no_rows(
    pool: &mut HttpPool,
    token: Option<Arc<str>>,
    what: &str,
    path: &str,
    body: &str,
) -> Result<()> {
    let reply = post_once(pool, token, path, body).await?;
    let items = serde_json::from_slice::<QueryReply>(&reply.body).map(|parsed| parsed.items.len());
    if reply.status == 200 && items.as_ref().is_ok_and(|&n| n == 0) {
        println!("  auth check: {what}: no rows, as it must be");
    } else {
        count_failures(1);
        println!(
            "  auth check FAILED: {what}: HTTP {} (expected 200, no items): {}",
            reply.status,
            preview(&reply.body)
        );
    }
    Ok(())
}

/// `PUT /v1/rules` as admin; connections of non-admins opened before would be
/// closed by it, so it comes before the subscribers connect.
async fn install_rules(pool: &mut HttpPool, rules: &str) -> Result<()> {
    pool.run_requests(1, |_| (Method::PUT, "/v1/rules".to_string(), rules.as_bytes().to_vec()), None).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// HTTP/1.1 keep-alive client

struct HttpReply {
    status: u16,
    body: Bytes,
}

impl HttpReply {
    fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// One keep-alive connection; one request at a time.
struct HttpConnection {
    authority: String,
    sender: SendRequest<Full<Bytes>>,
}

impl HttpConnection {
    async fn connect(authority: &str) -> Result<HttpConnection> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Its end shows in the next request's error.
            let _ = connection.await;
        });
        Ok(HttpConnection { authority: authority.to_string(), sender })
    }

    /// `token`: sent as `Authorization: Bearer`.
    async fn request(&mut self, method: Method, path: &str, body: Vec<u8>, token: Option<&str>) -> Result<HttpReply> {
        let mut request = Request::builder().method(method).uri(path).header(HOST, &self.authority);
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Full::new(Bytes::from(body)))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(HttpReply { status, body })
    }
}

/// A fixed set of connections; a request takes an idle one and gives it back.
struct HttpPool {
    idle_tx: mpsc::UnboundedSender<HttpConnection>,
    idle_rx: mpsc::UnboundedReceiver<HttpConnection>,
    size: usize,
    /// With `--auth`: the admin token of `request` and `run_requests` (set-up,
    /// `/metrics`, checks). The live writes bring their own.
    token: Option<Arc<str>>,
}

impl HttpPool {
    async fn connect(authority: &str, size: usize, token: Option<Arc<str>>) -> Result<HttpPool> {
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        for _ in 0..size {
            idle_tx.send(HttpConnection::connect(authority).await?).map_err(|_| "pool channel closed")?;
        }
        Ok(HttpPool { idle_tx, idle_rx, size, token })
    }

    async fn acquire(&mut self) -> HttpConnection {
        // The pool holds a sender itself, so the channel never closes.
        self.idle_rx.recv().await.expect("the pool keeps its channel open")
    }

    fn try_acquire(&mut self) -> Option<HttpConnection> {
        self.idle_rx.try_recv().ok()
    }

    fn releaser(&self) -> mpsc::UnboundedSender<HttpConnection> {
        self.idle_tx.clone()
    }

    async fn request(&mut self, method: Method, path: &str, body: Vec<u8>) -> Result<HttpReply> {
        let mut connection = self.acquire().await;
        let reply = connection.request(method, path, body, self.token.as_deref()).await;
        let _ = self.idle_tx.send(connection);
        reply
    }

    /// Sends `n_requests` requests made by `make_request`, as many at once as
    /// the pool has connections; fails on the first status other than 200/201.
    /// Returns the reply bodies in request order. `progress` names the phase
    /// for a line at every tenth of the requests.
    async fn run_requests(
        &mut self,
        n_requests: usize,
        mut make_request: impl FnMut(usize) -> (Method, String, Vec<u8>),
        progress: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        let started = Instant::now();
        let mut replies = vec![Bytes::new(); n_requests];
        let mut in_flight = JoinSet::new();
        let mut n_done = 0;
        let mut on_done = |joined: std::result::Result<(usize, Result<Bytes>), tokio::task::JoinError>,
                           replies: &mut Vec<Bytes>|
         -> Result<()> {
            let (index, reply) = joined?;
            replies[index] = reply?;
            n_done += 1;
            if let Some(phase) = progress {
                if n_done * 10 / n_requests != (n_done - 1) * 10 / n_requests {
                    println!(
                        "  {phase}: {:>3}% ({n_done}/{n_requests} requests) {:.1} s",
                        n_done * 100 / n_requests,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Ok(())
        };
        for index in 0..n_requests {
            while in_flight.len() >= self.size {
                let joined = in_flight.join_next().await.expect("the set is not empty");
                on_done(joined, &mut replies)?;
            }
            let (method, path, body) = make_request(index);
            let mut connection = self.acquire().await;
            let release = self.releaser();
            let token = self.token.clone();
            in_flight.spawn(async move {
                let reply = connection.request(method, &path, body, token.as_deref()).await;
                let _ = release.send(connection);
                let reply = reply.and_then(|reply| {
                    if reply.status == 200 || reply.status == 201 {
                        Ok(reply.body)
                    } else {
                        Err(format!("{path}: HTTP {}: {}", reply.status, reply.text()).into())
                    }
                });
                (index, reply)
            });
        }
        while let Some(joined) = in_flight.join_next().await {
            on_done(joined, &mut replies)?;
        }
        Ok(replies)
    }
}

/// `GET /metrics`, the Prometheus text format: `name{labels} value` lines.
async fn fetch_metrics(pool: &mut HttpPool) -> Option<Vec<(String, f64)>> {
    let reply = pool.request(Method::GET, "/metrics", Vec::new()).await.ok()?;
    if reply.status != 200 {
        return None;
    }
    let text = reply.text();
    let metrics = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect();
    Some(metrics)
}

fn metric(metrics: &Option<Vec<(String, f64)>>, name: &str) -> Option<f64> {
    metrics.as_ref()?.iter().find(|(metric_name, _)| metric_name == name).map(|(_, value)| *value)
}

// ---------------------------------------------------------------------------
// Wire types: only what the load generator reads, borrowed where it can be.

/// Every field of both scenarios' schemas; a scenario's items leave the others `None`.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq, Default)]
struct ItemFields {
    name: Option<String>,
    recency: Option<u64>,
    unread: Option<u64>,
    score: Option<i64>,
    sent_at: Option<u64>,
    update: Option<u64>,
}

/// An item; its payload (none is written) is not read.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
struct Item {
    id: String,
    fields: ItemFields,
}

/// `eyeball_im::VectorDiff<Item>` as serde_json writes it (PROTOCOL.md).
#[derive(Deserialize)]
enum WireDiff {
    Append { values: Vec<Item> },
    Clear {},
    PushFront { value: Item },
    PushBack { value: Item },
    PopFront {},
    PopBack {},
    Insert { index: usize, value: Item },
    Set { index: usize, value: Item },
    Remove { index: usize },
    Truncate { length: usize },
    Reset { values: Vec<Item> },
}

#[derive(Deserialize, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
enum FrameKind {
    Welcome,
    Diffs,
    Error,
    Unsubscribed,
    Resumed,
    #[serde(other)]
    Unknown,
}

/// Any server frame: the keys of every kind, each optional; others are skipped.
#[derive(Deserialize)]
struct ServerFrame<'a> {
    #[serde(rename = "type")]
    kind: FrameKind,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    diffs: Vec<WireDiff>,
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

/// `welcome.auth`: `"none"`, `"required"`, or the identity of a token sent at connect.
#[derive(Deserialize)]
struct WelcomeAuth {
    #[serde(default)]
    auth: Option<serde_json::Value>,
}

/// The answer to `{"op":"auth"}`: `authed` or `error`.
#[derive(Deserialize)]
struct AuthReply {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct QueryReply {
    items: Vec<Item>,
}

/// `POST /v1/batch`: one result per part, a sequence number or an error.
#[derive(Deserialize)]
struct MultiBatchReply {
    results: Vec<PartResult>,
}

/// `POST /v1/collections/{name}/batch`.
#[derive(Deserialize)]
struct SingleBatchReply {
    seq: u64,
}

#[derive(Deserialize)]
struct PartResult {
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

// ---------------------------------------------------------------------------
// Subscribers

/// Which fields of an item carry the update's number and its send time.
#[derive(Clone, Copy)]
struct UpdateMarks {
    number: fn(&ItemFields) -> Option<u64>,
    stamp_us: fn(&ItemFields) -> Option<u64>,
}

/// Seconds of the process clock a [`Timeline`] covers (the longest write phase
/// plus set-up); later samples go into the last second.
const TIMELINE_SECONDS: usize = 4096;

/// End-to-end latency per second of send time, coarse enough to keep for an hour:
/// it shows whether the tail is spread evenly or comes in bursts.
struct Timeline {
    seconds: Vec<TimelineSecond>,
}

#[derive(Default)]
struct TimelineSecond {
    n_samples: AtomicU64,
    over_5ms: AtomicU64,
    over_10ms: AtomicU64,
    over_25ms: AtomicU64,
    max_us: AtomicU64,
    /// The wake meter's latest wake-up in this second (see `WakeMeter`).
    wake_max_us: AtomicU64,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline { seconds: (0..TIMELINE_SECONDS).map(|_| TimelineSecond::default()).collect() }
    }

    fn record(&self, sent_us: u64, latency_us: u64) {
        let second = &self.seconds[((sent_us / 1_000_000) as usize).min(TIMELINE_SECONDS - 1)];
        second.n_samples.fetch_add(1, Ordering::Relaxed);
        for (threshold_us, counter) in
            [(5_000, &second.over_5ms), (10_000, &second.over_10ms), (25_000, &second.over_25ms)]
        {
            if latency_us > threshold_us {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        second.max_us.fetch_max(latency_us, Ordering::Relaxed);
    }

    fn record_wake(&self, woke_us: u64, late_us: u64) {
        let second = &self.seconds[((woke_us / 1_000_000) as usize).min(TIMELINE_SECONDS - 1)];
        second.wake_max_us.fetch_max(late_us, Ordering::Relaxed);
    }

    fn print(&self) {
        println!(
            "  timeline (second of send time: updates, share over 5 / 10 / 25 ms, max; the machine's latest 1 ms wake-up in that second):"
        );
        for (index, second) in self.seconds.iter().enumerate() {
            let n = second.n_samples.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let share = |counter: &AtomicU64| 100.0 * counter.load(Ordering::Relaxed) as f64 / n as f64;
            println!(
                "    {index:>4} s: {n:>7}  {:>5.1} % {:>5.1} % {:>5.1} %  max {:>9}  wake-up late by {}",
                share(&second.over_5ms),
                share(&second.over_10ms),
                share(&second.over_25ms),
                ms(second.max_us.load(Ordering::Relaxed)),
                ms(second.wake_max_us.load(Ordering::Relaxed)),
            );
        }
    }
}

/// Counters of all subscribers together, read live by the main task.
struct DeliveryCounters {
    frames: AtomicU64,
    diffs: AtomicU64,
    bytes: AtomicU64,
    subscribed: AtomicU64,
    failed: AtomicU64,
    latency_us: Histogram,
    timeline: Timeline,
}

impl DeliveryCounters {
    fn new() -> DeliveryCounters {
        DeliveryCounters {
            frames: AtomicU64::new(0),
            diffs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            subscribed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency_us: Histogram::new(),
            timeline: Timeline::new(),
        }
    }

    fn snapshot(&self) -> DeliverySnapshot {
        DeliverySnapshot {
            frames: self.frames.load(Ordering::Relaxed),
            diffs: self.diffs.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct DeliverySnapshot {
    frames: u64,
    diffs: u64,
    bytes: u64,
}

struct SubscriberSpec {
    authority: String,
    collection: String,
    sort_field: &'static str,
    window_limit: usize,
    marks: UpdateMarks,
    /// Update numbers above this are a corrupted item, not a reason to grow the bitmap.
    max_update_number: u64,
    /// With `--auth`: who this subscriber is.
    auth: Option<SubscriberAuth>,
    /// The filter (JSON) of its subscription, if any.
    filter: Option<String>,
}

/// A subscriber's own identity: its reader token and the `sub` it names.
struct SubscriberAuth {
    sub: String,
    token: Arc<str>,
}

/// Which update numbers a subscriber has received: a bitmap, so that memory is
/// one bit per update of its collection however often items are re-sent.
struct SeenUpdates {
    words: Vec<u64>,
    n_seen: u64,
    max_number: u64,
}

impl SeenUpdates {
    /// `Ok(true)` the first time `number` is inserted.
    fn insert(&mut self, number: u64) -> std::result::Result<bool, String> {
        if number > self.max_number {
            return Err(format!("update number {number} above the {} the writer can have sent", self.max_number));
        }
        let word = (number / 64) as usize;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let bit = 1u64 << (number % 64);
        let fresh = self.words[word] & bit == 0;
        self.words[word] |= bit;
        self.n_seen += u64::from(fresh);
        Ok(fresh)
    }

    fn contains(&self, number: u64) -> bool {
        self.words.get((number / 64) as usize).is_some_and(|word| word & (1u64 << (number % 64)) != 0)
    }
}

/// What a subscriber hands back when it stops.
struct SubscriberOutcome {
    list: Vec<Item>,
    /// The numbers of the updates received, each once.
    seen: SeenUpdates,
    resets_after_first: u64,
    seq_gaps: u64,
    protocol_errors: u64,
    error_frames: u64,
    subscribed: bool,
    closed: Option<String>,
    first_problem: Option<String>,
}

/// One subscription's client side: its copy of the window and its checks.
struct Subscriber {
    spec: SubscriberSpec,
    outcome: SubscriberOutcome,
    last_seq: u64,
}

impl Subscriber {
    fn new(spec: SubscriberSpec) -> Subscriber {
        let max_number = spec.max_update_number;
        Subscriber {
            spec,
            outcome: SubscriberOutcome {
                list: Vec::new(),
                seen: SeenUpdates { words: Vec::new(), n_seen: 0, max_number },
                resets_after_first: 0,
                seq_gaps: 0,
                protocol_errors: 0,
                error_frames: 0,
                subscribed: false,
                closed: None,
                first_problem: None,
            },
            last_seq: 0,
        }
    }

    fn note(&mut self, problem: String) {
        if self.outcome.first_problem.is_none() {
            self.outcome.first_problem = Some(format!("{}: {problem}", self.spec.collection));
        }
    }

    fn protocol_error(&mut self, problem: String) {
        self.outcome.protocol_errors += 1;
        self.note(problem);
    }

    fn into_outcome(self) -> SubscriberOutcome {
        self.outcome
    }

    async fn run(
        mut self,
        counters: Arc<DeliveryCounters>,
        clock: Clock,
        connect_gate: Arc<Semaphore>,
        mut stop: watch::Receiver<bool>,
    ) -> SubscriberOutcome {
        let connected = {
            let _permit = connect_gate.acquire().await;
            self.connect_and_subscribe().await
        };
        let mut socket = match connected {
            Ok(socket) => socket,
            Err(error) => {
                self.outcome.closed = Some(format!("{}: {error}", self.spec.collection));
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return self.into_outcome();
            }
        };
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                read = socket.read_frame() => match read {
                    Err(error) => {
                        self.outcome.closed = Some(format!("{}: {error}", self.spec.collection));
                        break;
                    }
                    Ok(frame) => match frame.opcode {
                        OpCode::Text => {
                            let now_us = clock.now_us();
                            self.on_text(&frame.payload, now_us, &counters);
                        }
                        OpCode::Close => {
                            let code = frame.payload.get(..2).map(|code| u16::from_be_bytes([code[0], code[1]]));
                            self.outcome.closed = Some(format!("{}: closed by the server, code {code:?}", self.spec.collection));
                            break;
                        }
                        OpCode::Binary => self.protocol_error("a binary frame".to_string()),
                        _ => {}
                    },
                },
            }
        }
        if self.outcome.closed.is_none() {
            // A normal closure (1000), as a client leaving would, so that the
            // server does not hold the session for a resume that never comes.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.write_frame(Frame::close(1000, b""))).await;
        }
        if !self.outcome.subscribed {
            counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.into_outcome()
    }

    async fn connect_and_subscribe(&mut self) -> Result<FragmentCollector<TokioIo<Upgraded>>> {
        let stream = TcpStream::connect(&self.spec.authority).await?;
        stream.set_nodelay(true)?;
        let request = Request::builder()
            .method("GET")
            .uri("/v1/ws")
            .header(HOST, &self.spec.authority)
            .header(UPGRADE, "websocket")
            .header(CONNECTION, "upgrade")
            .header("Sec-WebSocket-Key", fastwebsockets::handshake::generate_key())
            .header("Sec-WebSocket-Version", "13")
            .body(Empty::<Bytes>::new())?;
        let (mut socket, _response) = fastwebsockets::handshake::client(&SpawnExecutor, request, stream).await?;
        socket.set_auto_close(true);
        socket.set_auto_pong(true);
        socket.set_max_message_size(MAX_SERVER_FRAME_BYTES);
        let mut socket = FragmentCollector::new(socket);

        // The server speaks first, with `welcome`.
        let welcome = tokio::time::timeout(WELCOME_TIMEOUT, socket.read_frame())
            .await
            .map_err(|_| format!("no welcome frame within {WELCOME_TIMEOUT:?}"))??;
        if welcome.opcode != OpCode::Text {
            return Err(format!("first frame is {:?}, not a text welcome", welcome.opcode).into());
        }
        let frame: ServerFrame = serde_json::from_slice(&welcome.payload)
            .map_err(|error| format!("unparsable welcome ({error}): {}", preview(&welcome.payload)))?;
        if frame.kind != FrameKind::Welcome {
            return Err(format!("first frame is not a welcome: {}", preview(&welcome.payload)).into());
        }
        let welcome_auth = serde_json::from_slice::<WelcomeAuth>(&welcome.payload)?.auth;
        let auth_required = welcome_auth.as_ref().and_then(serde_json::Value::as_str) == Some("required");
        match (&self.spec.auth, auth_required) {
            (Some(auth), true) => Self::authenticate(&mut socket, auth).await?,
            (Some(_), false) => {
                return Err(format!("--auth, but the server's welcome says `auth`: {welcome_auth:?}").into());
            }
            (None, true) => {
                return Err("the server requires auth (welcome `auth`: \"required\"): run with --auth".into())
            }
            (None, false) => {}
        }

        let filter = self.spec.filter.as_ref().map_or(String::new(), |filter| format!(r#""filter":{filter},"#));
        let subscribe = format!(
            r#"{{"op":"subscribe","sub":"s","collection":"{}",{filter}"sort":[{{"field":"{}","dir":"desc"}}],"offset":0,"limit":{}}}"#,
            self.spec.collection, self.spec.sort_field, self.spec.window_limit
        );
        socket.write_frame(Frame::text(Payload::Owned(subscribe.into_bytes()))).await?;
        Ok(socket)
    }

    /// What a browser client does after `welcome` says auth is required: sends
    /// its token in an `auth` message and waits for `authed` before subscribing.
    async fn authenticate(socket: &mut FragmentCollector<TokioIo<Upgraded>>, auth: &SubscriberAuth) -> Result<()> {
        let message = format!(r#"{{"op":"auth","token":{}}}"#, serde_json::to_string(&*auth.token)?);
        socket.write_frame(Frame::text(Payload::Owned(message.into_bytes()))).await?;
        let reply = tokio::time::timeout(WELCOME_TIMEOUT, socket.read_frame())
            .await
            .map_err(|_| format!("no answer to `auth` within {WELCOME_TIMEOUT:?}"))??;
        if reply.opcode != OpCode::Text {
            return Err(format!("the answer to `auth` is {:?}, not text", reply.opcode).into());
        }
        let parsed: AuthReply = serde_json::from_slice(&reply.payload)
            .map_err(|error| format!("unparsable answer to `auth` ({error}): {}", preview(&reply.payload)))?;
        match parsed.kind.as_str() {
            "authed" if parsed.sub.as_deref() == Some(auth.sub.as_str()) => Ok(()),
            "error" => Err(format!(
                "`auth` refused: {}: {}",
                parsed.code.unwrap_or_default(),
                parsed.message.unwrap_or_default()
            )
            .into()),
            _ => Err(format!("unexpected answer to `auth` as {}: {}", auth.sub, preview(&reply.payload)).into()),
        }
    }

    fn on_text(&mut self, payload: &[u8], now_us: u64, counters: &DeliveryCounters) {
        counters.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
        let frame: ServerFrame = match serde_json::from_slice(payload) {
            Ok(frame) => frame,
            Err(error) => {
                self.protocol_error(format!("unparsable frame ({error}): {}", preview(payload)));
                return;
            }
        };
        match frame.kind {
            FrameKind::Diffs => self.on_diffs(frame.seq, frame.diffs, now_us, counters),
            FrameKind::Error => {
                self.outcome.error_frames += 1;
                let (code, message) = (frame.code.unwrap_or_default(), frame.message.unwrap_or_default());
                self.note(format!("error frame `{code}`: {message}"));
            }
            other => self.protocol_error(format!("unexpected `{other:?}` frame: {}", preview(payload))),
        }
    }

    fn on_diffs(&mut self, seq: Option<u64>, diffs: Vec<WireDiff>, now_us: u64, counters: &DeliveryCounters) {
        counters.frames.fetch_add(1, Ordering::Relaxed);
        counters.diffs.fetch_add(diffs.len() as u64, Ordering::Relaxed);
        let expected_seq = self.last_seq + 1;
        match seq {
            Some(seq) if seq == expected_seq => self.last_seq = seq,
            Some(seq) => {
                self.outcome.seq_gaps += 1;
                self.note(format!("frame seq {seq}, expected {expected_seq}"));
                self.last_seq = seq;
            }
            None => {
                self.protocol_error("a diffs frame without seq".to_string());
                self.last_seq = expected_seq;
            }
        }
        let is_first = !self.outcome.subscribed;
        if is_first && !(diffs.len() == 1 && matches!(diffs[0], WireDiff::Reset { .. })) {
            self.protocol_error(format!("first frame is not a single Reset but {} diffs", diffs.len()));
        }
        for diff in diffs {
            if let Err(problem) = self.apply(diff, is_first, now_us, counters) {
                self.protocol_error(problem);
            }
        }
        if self.outcome.list.len() > self.spec.window_limit {
            let length = self.outcome.list.len();
            self.protocol_error(format!("list of {length} items in a window of {}", self.spec.window_limit));
        }
        if is_first {
            self.outcome.subscribed = true;
            counters.subscribed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Applies one diff with `VectorDiff` semantics, checking every index first.
    fn apply(
        &mut self,
        diff: WireDiff,
        is_first_frame: bool,
        now_us: u64,
        counters: &DeliveryCounters,
    ) -> std::result::Result<(), String> {
        let length = self.outcome.list.len();
        match diff {
            WireDiff::Append { values } => {
                for value in &values {
                    self.arrive(value, now_us, counters)?;
                }
                self.outcome.list.extend(values);
            }
            WireDiff::Clear {} => self.outcome.list.clear(),
            WireDiff::PushFront { value } => {
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.insert(0, value);
            }
            WireDiff::PushBack { value } => {
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.push(value);
            }
            WireDiff::PopFront {} => {
                if length == 0 {
                    return Err("PopFront on an empty list".to_string());
                }
                self.outcome.list.remove(0);
            }
            WireDiff::PopBack {} => {
                if self.outcome.list.pop().is_none() {
                    return Err("PopBack on an empty list".to_string());
                }
            }
            WireDiff::Insert { index, value } => {
                if index > length {
                    return Err(format!("Insert at {index} in a list of {length}"));
                }
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.insert(index, value);
            }
            WireDiff::Set { index, value } => {
                if index >= length {
                    return Err(format!("Set at {index} in a list of {length}"));
                }
                self.arrive(&value, now_us, counters)?;
                self.outcome.list[index] = value;
            }
            WireDiff::Remove { index } => {
                if index >= length {
                    return Err(format!("Remove at {index} in a list of {length}"));
                }
                self.outcome.list.remove(index);
            }
            WireDiff::Truncate { length: new_length } => {
                if new_length > length {
                    return Err(format!("Truncate to {new_length} a list of {length}"));
                }
                self.outcome.list.truncate(new_length);
            }
            WireDiff::Reset { values } => {
                if !is_first_frame {
                    self.outcome.resets_after_first += 1;
                }
                for value in &values {
                    self.arrive(value, now_us, counters)?;
                }
                self.outcome.list = values;
            }
        }
        Ok(())
    }

    /// An item reached the client: if it carries an update not seen before,
    /// that update has arrived now.
    fn arrive(&mut self, item: &Item, now_us: u64, counters: &DeliveryCounters) -> std::result::Result<(), String> {
        let Some(number) = (self.spec.marks.number)(&item.fields) else {
            return Err(format!("item {} has no update number", item.id));
        };
        // Number 0 marks an item as loaded, never updated.
        if number == 0 || !self.outcome.seen.insert(number)? {
            return Ok(());
        }
        let Some(stamp_us) = (self.spec.marks.stamp_us)(&item.fields) else {
            return Err(format!("item {} has an update number but no send time", item.id));
        };
        counters.latency_us.record(now_us.saturating_sub(stamp_us));
        counters.timeline.record(stamp_us, now_us.saturating_sub(stamp_us));
        Ok(())
    }
}

/// hyper's handshake drives the connection on a task of the current runtime.
struct SpawnExecutor;

impl<F> hyper::rt::Executor<F> for SpawnExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(future);
    }
}

/// The start of a frame, for messages.
fn preview(payload: &[u8]) -> String {
    const PREVIEW_BYTES: usize = 300;
    let text = String::from_utf8_lossy(&payload[..payload.len().min(PREVIEW_BYTES)]).into_owned();
    if payload.len() > PREVIEW_BYTES {
        text + "…"
    } else {
        text
    }
}

// ---------------------------------------------------------------------------
// Writers

/// One write request: its body, and how many updates of which collection each
/// part carries (to count acknowledged updates per collection).
struct WriteRequest {
    /// The source's number for this request, to match its commit `seq` with it.
    id: u64,
    path: &'static str,
    body: Vec<u8>,
    parts: Vec<WritePart>,
    /// `POST /v1/batch` (a result per part) rather than one collection's batch.
    multi_collection: bool,
}

struct WritePart {
    collection: u32,
    n_updates: u64,
}

/// Makes the updates due in one tick; `now_us` is their send time.
trait UpdateSource {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest;
}

/// Chat: random rooms of random users move to the top of their user's list.
struct ChatUpdates {
    rng: XorShift64,
    n_rooms: usize,
    /// Per collection: the last update's number (sent as `unread`, which thus
    /// only grows) and its `recency`.
    last_number: Vec<u64>,
    last_recency_us: Vec<u64>,
    picked: HashSet<(u32, u32)>,
    updates: Vec<(u32, u32)>,
    layout: ChatLayout,
}

impl ChatUpdates {
    fn new(seed: u64, n_collections: usize, n_rooms: usize, layout: ChatLayout) -> ChatUpdates {
        ChatUpdates {
            layout,
            rng: XorShift64::new(seed),
            n_rooms,
            last_number: vec![0; n_collections],
            last_recency_us: vec![0; n_collections],
            picked: HashSet::new(),
            updates: Vec::new(),
        }
    }
}

impl UpdateSource for ChatUpdates {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest {
        // A room appears at most once per request: two updates of one room in a
        // batch are one change of the window, and the first would count as lost.
        let n_collections = self.last_number.len();
        let n_updates = n_updates.min(n_collections * self.n_rooms / 2).max(1);
        self.picked.clear();
        self.updates.clear();
        while self.updates.len() < n_updates {
            let collection = self.rng.below(n_collections as u64) as u32;
            let room = self.rng.below(self.n_rooms as u64) as u32;
            if self.picked.insert((collection, room)) {
                self.updates.push((collection, room));
            }
        }
        self.updates.sort_unstable();
        if self.layout == ChatLayout::Shared {
            return self.build_shared_request(now_us);
        }

        let mut body = String::with_capacity(64 + n_updates * 90);
        let mut parts: Vec<WritePart> = Vec::new();
        body.push_str(r#"{"writes":["#);
        for (index, &(collection, room)) in self.updates.iter().enumerate() {
            let starts_part = parts.last().is_none_or(|part| part.collection != collection);
            if starts_part {
                if index > 0 {
                    body.push_str("]},");
                }
                write!(body, r#"{{"collection":"user-{collection:04}","ops":["#).expect("writing to a String");
                parts.push(WritePart { collection, n_updates: 0 });
            } else {
                body.push(',');
            }
            // Strictly increasing within a user's list, so the room always moves to the top.
            let slot = collection as usize;
            let recency_us = now_us.max(self.last_recency_us[slot] + 1);
            self.last_recency_us[slot] = recency_us;
            self.last_number[slot] += 1;
            write!(
                body,
                r#"{{"op":"upsert","id":"!r{room:04}:example.org","fields":{{"recency":{recency_us},"unread":{}}}}}"#,
                self.last_number[slot]
            )
            .expect("writing to a String");
            parts.last_mut().expect("a part was started").n_updates += 1;
        }
        body.push_str("]}]}");
        WriteRequest { id: 0, path: "/v1/batch", body: body.into_bytes(), parts, multi_collection: true }
    }
}

impl ChatUpdates {
    /// `chat-shared`: the picked updates as one batch of the collection `rooms`.
    fn build_shared_request(&mut self, now_us: u64) -> WriteRequest {
        let mut body = String::with_capacity(16 + self.updates.len() * 90);
        let mut parts: Vec<WritePart> = Vec::new();
        body.push_str(r#"{"ops":["#);
        for (index, &(collection, room)) in self.updates.iter().enumerate() {
            if index > 0 {
                body.push(',');
            }
            // `parts` only counts each user's updates: the request is one batch.
            if parts.last().is_none_or(|part| part.collection != collection) {
                parts.push(WritePart { collection, n_updates: 0 });
            }
            let slot = collection as usize;
            let recency_us = now_us.max(self.last_recency_us[slot] + 1);
            self.last_recency_us[slot] = recency_us;
            self.last_number[slot] += 1;
            write!(
                body,
                r#"{{"op":"upsert","id":"{}","fields":{{"recency":{recency_us},"unread":{}}}}}"#,
                shared_room_id(slot, room as usize),
                self.last_number[slot]
            )
            .expect("writing to a String");
            parts.last_mut().expect("a part was started").n_updates += 1;
        }
        body.push_str("]}");
        WriteRequest {
            id: 0,
            path: "/v1/collections/rooms/batch",
            body: body.into_bytes(),
            parts,
            multi_collection: false,
        }
    }
}

/// Leaderboard: about one update in five gives a room a score that enters the
/// window, the others a random score below it.
struct LeaderboardUpdates {
    rng: XorShift64,
    initial_scores: Vec<i64>,
    scores: Vec<i64>,
    /// Every room in the server's order (score descending, then id, which is
    /// the room number zero-padded): the writer's own view of the ranking, to
    /// know what score enters the window.
    ranking: BTreeSet<(Reverse<i64>, u32)>,
    window_limit: usize,
    last_number: u64,
    n_entering: u64,
    /// Every request's updates `(number, room, score)`, by request id, to replay
    /// them in commit order at the end.
    requests: Vec<Vec<(u64, u32, i64)>>,
    picked: HashSet<u32>,
}

const LEADERBOARD_ENTERING_ONE_IN: u64 = 5;
const LEADERBOARD_INITIAL_SCORE_BOUND: u64 = 1_000_000;

fn leaderboard_ranking(scores: &[i64]) -> BTreeSet<(Reverse<i64>, u32)> {
    scores.iter().enumerate().map(|(room, &score)| (Reverse(score), room as u32)).collect()
}

fn last_in_window(ranking: &BTreeSet<(Reverse<i64>, u32)>, window_limit: usize) -> (Reverse<i64>, u32) {
    *ranking.iter().nth(window_limit - 1).expect("more rooms than the window holds")
}

impl LeaderboardUpdates {
    fn new(seed: u64, initial_scores: Vec<i64>, window_limit: usize) -> LeaderboardUpdates {
        LeaderboardUpdates {
            rng: XorShift64::new(seed),
            ranking: leaderboard_ranking(&initial_scores),
            scores: initial_scores.clone(),
            initial_scores,
            window_limit,
            last_number: 0,
            n_entering: 0,
            requests: Vec::new(),
            picked: HashSet::new(),
        }
    }

    /// The updates that were in the window right after their batch, found by
    /// replaying the requests in the order the server committed them (its
    /// `seq`s): a subscriber must receive each of them. Concurrent requests may
    /// commit in another order than they were made, so the writer's own
    /// ranking cannot tell; and an update pushed out again by a later one of
    /// its own batch need not show, since the server sends one window change
    /// per batch.
    fn visible_numbers(&self, commit_order: &[(u64, u64)]) -> Vec<u64> {
        let mut commit_order = commit_order.to_vec();
        commit_order.sort_unstable();
        let mut scores = self.initial_scores.clone();
        let mut ranking = leaderboard_ranking(&scores);
        let mut visible = Vec::new();
        for &(_, request_id) in &commit_order {
            let updates = &self.requests[request_id as usize];
            for &(_, room, score) in updates {
                ranking.remove(&(Reverse(scores[room as usize]), room));
                ranking.insert((Reverse(score), room));
                scores[room as usize] = score;
            }
            let last = last_in_window(&ranking, self.window_limit);
            // Rooms are distinct within a request: each still has its update's score.
            visible.extend(
                updates.iter().filter(|&&(_, room, score)| (Reverse(score), room) <= last).map(|&(number, ..)| number),
            );
        }
        visible
    }
}

impl UpdateSource for LeaderboardUpdates {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest {
        let n_rooms = self.scores.len();
        let n_updates = n_updates.min(n_rooms / 2).max(1);
        self.picked.clear();
        let mut updates = Vec::with_capacity(n_updates);
        let mut body = String::with_capacity(16 + n_updates * 100);
        body.push_str(r#"{"ops":["#);
        for index in 0..n_updates {
            let room = loop {
                let room = self.rng.below(n_rooms as u64) as u32;
                if self.picked.insert(room) {
                    break room;
                }
            };
            let top = self.ranking.first().map_or(0, |&(Reverse(score), _)| score);
            let (Reverse(last_in_window), _) = last_in_window(&self.ranking, self.window_limit);
            let score = if self.rng.below(LEADERBOARD_ENTERING_ONE_IN) == 0 {
                self.n_entering += 1;
                let spread = (top - last_in_window).max(0) as u64 + 1_000;
                last_in_window + 1 + self.rng.below(spread) as i64
            } else {
                self.rng.below(last_in_window.max(1) as u64) as i64
            };
            self.ranking.remove(&(Reverse(self.scores[room as usize]), room));
            self.ranking.insert((Reverse(score), room));
            self.scores[room as usize] = score;
            self.last_number += 1;
            updates.push((self.last_number, room, score));
            if index > 0 {
                body.push(',');
            }
            write!(
                body,
                r#"{{"op":"upsert","id":"!r{room:06}:example.org","fields":{{"score":{score},"sent_at":{now_us},"update":{}}}}}"#,
                self.last_number
            )
            .expect("writing to a String");
        }
        body.push_str("]}");
        self.requests.push(updates);
        WriteRequest {
            id: self.requests.len() as u64 - 1,
            path: "/v1/collections/leaderboard/batch",
            body: body.into_bytes(),
            parts: vec![WritePart { collection: 0, n_updates: n_updates as u64 }],
            multi_collection: false,
        }
    }
}

/// The writer's counters, shared with its request tasks.
struct WriteStats {
    acked_per_collection: Vec<AtomicU64>,
    acked: AtomicU64,
    refused: AtomicU64,
    requests: AtomicU64,
    failed_requests: AtomicU64,
    ack_latency_us: Histogram,
    first_failure: Mutex<Option<String>>,
    /// `(seq, request id)` of every acknowledged single-collection request.
    commit_order: Mutex<Vec<(u64, u64)>>,
}

impl WriteStats {
    fn new(n_collections: usize) -> WriteStats {
        WriteStats {
            acked_per_collection: (0..n_collections).map(|_| AtomicU64::new(0)).collect(),
            acked: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            ack_latency_us: Histogram::new(),
            first_failure: Mutex::new(None),
            commit_order: Mutex::new(Vec::new()),
        }
    }

    fn fail(&self, message: String) {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_failure.lock().expect("no panics while holding it");
        if first.is_none() {
            *first = Some(message);
        }
    }

    fn ack(&self, part: &WritePart) {
        self.acked_per_collection[part.collection as usize].fetch_add(part.n_updates, Ordering::Relaxed);
        self.acked.fetch_add(part.n_updates, Ordering::Relaxed);
    }

    fn account(&self, request: &WriteRequest, reply: HttpReply) {
        let (request_path, parts) = (request.path, &request.parts);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let n_updates: u64 = parts.iter().map(|part| part.n_updates).sum();
        if !request.multi_collection {
            let seq = serde_json::from_slice::<SingleBatchReply>(&reply.body).map(|parsed| parsed.seq);
            if let (200, Ok(seq)) = (reply.status, seq) {
                parts.iter().for_each(|part| self.ack(part));
                self.commit_order.lock().expect("no panics while holding it").push((seq, request.id));
            } else {
                self.refused.fetch_add(n_updates, Ordering::Relaxed);
                self.fail(format!("POST {request_path}: HTTP {}: {}", reply.status, reply.text()));
            }
            return;
        }
        // `POST /v1/batch` answers 200, or 422 with the same body when some part was refused.
        let results = match serde_json::from_slice::<MultiBatchReply>(&reply.body) {
            Ok(parsed) if (reply.status == 200 || reply.status == 422) && parsed.results.len() == parts.len() => {
                parsed.results
            }
            _ => {
                self.refused.fetch_add(n_updates, Ordering::Relaxed);
                self.fail(format!("POST {request_path}: HTTP {}: {}", reply.status, preview(&reply.body)));
                return;
            }
        };
        for (part, result) in parts.iter().zip(&results) {
            match (&result.seq, &result.error) {
                (Some(_), None) => self.ack(part),
                _ => {
                    self.refused.fetch_add(part.n_updates, Ordering::Relaxed);
                    self.fail(format!("POST {request_path}: part refused: {:?}", result.error));
                }
            }
        }
    }
}

/// How fast and how long the writer writes.
struct WritePace {
    rate: f64,
    duration: Duration,
    tick: Duration,
}

struct WriteSummary {
    generated: u64,
    stalled_ticks: u64,
    write_seconds: f64,
}

/// Sends `rate` updates per second for `duration`: at each tick, what is due
/// since the start goes out as one request on an idle connection. When none is
/// idle the updates wait for the next tick (and are stamped then), so a server
/// that cannot keep up shows as a lower achieved rate, not as writer-side delay.
async fn run_write_loop(
    pool: &mut HttpPool,
    source: &mut dyn UpdateSource,
    pace: WritePace,
    clock: Clock,
    stats: &Arc<WriteStats>,
    write_token: Option<Arc<str>>,
) -> WriteSummary {
    let WritePace { rate, duration, tick } = pace;
    let started = Instant::now();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut generated = 0u64;
    let mut stalled_ticks = 0u64;
    loop {
        interval.tick().await;
        let elapsed = started.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * rate) as u64;
        if due <= generated {
            continue;
        }
        let Some(mut connection) = pool.try_acquire() else {
            stalled_ticks += 1;
            continue;
        };
        let n_updates = ((due - generated) as usize).min(MAX_OPS_PER_REQUEST);
        let request = source.build_request(n_updates, clock.now_us());
        generated += request.parts.iter().map(|part| part.n_updates).sum::<u64>();
        let release = pool.releaser();
        let stats = Arc::clone(stats);
        let token = write_token.clone();
        tokio::spawn(async move {
            let mut request = request;
            let body = std::mem::take(&mut request.body);
            let sent = Instant::now();
            let reply = connection.request(Method::POST, request.path, body, token.as_deref()).await;
            let _ = release.send(connection);
            stats.ack_latency_us.record(sent.elapsed().as_micros() as u64);
            match reply {
                Ok(reply) => stats.account(&request, reply),
                Err(error) => {
                    let n_updates: u64 = request.parts.iter().map(|part| part.n_updates).sum();
                    stats.refused.fetch_add(n_updates, Ordering::Relaxed);
                    stats.fail(format!("POST {}: {error}", request.path));
                }
            }
        });
    }
    let write_seconds = started.elapsed().as_secs_f64();
    // Every request in flight is answered before anything is counted.
    let mut idle = Vec::with_capacity(pool.size);
    for _ in 0..pool.size {
        idle.push(pool.acquire().await);
    }
    for connection in idle {
        let _ = pool.releaser().send(connection);
    }
    WriteSummary { generated, stalled_ticks, write_seconds }
}

// ---------------------------------------------------------------------------
// The live phase, common to both scenarios

struct LivePlan {
    specs: Vec<SubscriberSpec>,
    rate: f64,
    seconds: f64,
    n_collections: usize,
    /// With `--auth`: the writer token every live write carries.
    write_token: Option<Arc<str>>,
}

struct LiveResult {
    outcomes: Vec<SubscriberOutcome>,
    write: WriteSummary,
    stats: Arc<WriteStats>,
    delivered: DeliverySnapshot,
    counters: Arc<DeliveryCounters>,
    settle_seconds: f64,
    server_cpu: Option<String>,
    server_memory: Option<(u64, u64)>,
    loadgen_cpu: Option<String>,
    metrics_before: Option<Vec<(String, f64)>>,
    metrics_after: Option<Vec<(String, f64)>>,
    /// How late a thread sleeping 1 ms at a time woke, in µs (`WakeMeter`).
    wake_delays: Option<Histogram>,
    /// Cores the whole machine was busy and stolen by the hypervisor during
    /// the write phase, and how much of the busy time neither the server nor
    /// loadgen used (other processes: a comparison of runs needs it near 0).
    machine_cores: Option<MachineCores>,
}

struct MachineCores {
    busy: f64,
    steal: f64,
    others: Option<f64>,
}

/// Subscribes every spec, waits for every first frame, writes for the plan's
/// duration while measuring, waits for frames to settle, stops the subscribers
/// and returns what they and the writer saw.
async fn run_live_phase(
    plan: LivePlan,
    source: &mut dyn UpdateSource,
    pool: &mut HttpPool,
    options: &Options,
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
    let wake_meter = WakeMeter::start(clock, counters.clone());
    let pace = WritePace { rate: plan.rate, duration: Duration::from_secs_f64(plan.seconds), tick: options.tick };
    let write = run_write_loop(pool, source, pace, clock, &stats, plan.write_token).await;
    let wake_delays = wake_meter.stop();
    let server_cpu_after = server_pid.as_deref().and_then(CpuSample::read);
    let loadgen_cpu_after = CpuSample::read("self");
    let machine_after = machine_cpu_seconds();
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
    })
}

/// The machine's own scheduling noise, measured during the write phase: a
/// thread that sleeps 1 ms at a time records how late it wakes. Every hop of
/// the pipeline (loadgen → network thread → writer → disk → network thread →
/// subscriber) is a wake-up like this one, so its tail bounds what the
/// end-to-end tail can be on this machine. It costs about 1 % of a core.
struct WakeMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Histogram>,
}

impl WakeMeter {
    fn start(clock: Clock, counters: Arc<DeliveryCounters>) -> WakeMeter {
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

    fn stop(self) -> Option<Histogram> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok()
    }
}

/// Compares every subscriber's list with a one-shot query of its window;
/// returns the number of differing lists and the first difference.
async fn verify_lists(
    pool: &mut HttpPool,
    outcomes: &[SubscriberOutcome],
    collection_of: impl Fn(usize) -> String,
    sort_field: &str,
    window_limit: usize,
) -> Result<(usize, Option<String>)> {
    verify_filtered_lists(pool, outcomes, |index| (collection_of(index), None), sort_field, window_limit).await
}

/// `verify_lists` where subscriber `index` watches `view_of(index)`: a
/// collection and the filter (JSON) it sees it through, if any.
async fn verify_filtered_lists(
    pool: &mut HttpPool,
    outcomes: &[SubscriberOutcome],
    view_of: impl Fn(usize) -> (String, Option<String>),
    sort_field: &str,
    window_limit: usize,
) -> Result<(usize, Option<String>)> {
    // One query per distinct view (the leaderboard's subscribers share one).
    let mut collections: Vec<(String, Option<String>)> = (0..outcomes.len()).map(&view_of).collect();
    collections.sort_unstable();
    collections.dedup();
    let replies = pool
        .run_requests(
            collections.len(),
            |index| {
                let (collection, filter) = &collections[index];
                let filter = filter.as_ref().map_or(String::new(), |filter| format!(r#""filter":{filter},"#));
                let query = format!(
                    r#"{{{filter}"sort":[{{"field":"{sort_field}","dir":"desc"}}],"offset":0,"limit":{window_limit}}}"#
                );
                (Method::POST, format!("/v1/collections/{collection}/query"), query.into_bytes())
            },
            None,
        )
        .await?;
    let mut windows = Vec::with_capacity(replies.len());
    for ((collection, _), reply) in collections.iter().zip(&replies) {
        let parsed: QueryReply = serde_json::from_slice(reply)
            .map_err(|error| format!("query of {collection}: unparsable reply ({error}): {}", preview(reply)))?;
        windows.push(parsed.items);
    }
    let mut n_mismatches = 0;
    let mut first_mismatch = None;
    for (index, outcome) in outcomes.iter().enumerate() {
        let view = view_of(index);
        let position = collections.binary_search(&view).expect("every view was queried");
        let collection = match &view.1 {
            Some(filter) => format!("{} where {filter}", view.0),
            None => view.0,
        };
        let expected = &windows[position];
        if outcome.list != *expected {
            n_mismatches += 1;
            if first_mismatch.is_none() {
                let at = outcome.list.iter().zip(expected).position(|(ours, theirs)| ours != theirs);
                first_mismatch = Some(format!(
                    "{collection}: client has {} items, query {}; first difference at {at:?}: client {:?}, query {:?}",
                    outcome.list.len(),
                    expected.len(),
                    at.and_then(|at| outcome.list.get(at)),
                    at.and_then(|at| expected.get(at)),
                ));
            }
        }
    }
    Ok((n_mismatches, first_mismatch))
}

// ---------------------------------------------------------------------------
// Reporting

/// The lines both scenarios print the same way.
fn print_common(live: &LiveResult, rate_target: f64, n_subscribers: usize) {
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
static CORRECTNESS_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count_failures(n: u64) {
    CORRECTNESS_FAILURES.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

fn print_checks(live: &LiveResult, n_mismatches: usize, first_mismatch: Option<String>) {
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

fn print_costs(live: &LiveResult) {
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

/// `(busy, steal)` CPU seconds of all cores together since boot, from
/// /proc/stat's `cpu` line (busy: user, nice, system, irq, softirq; guest
/// time is inside user).
fn machine_cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let (user, nice, system, irq, softirq, steal) =
        (*ticks.first()?, *ticks.get(1)?, *ticks.get(2)?, *ticks.get(5)?, *ticks.get(6)?, *ticks.get(7)?);
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if per_second <= 0 {
        return None;
    }
    let seconds = |ticks: u64| ticks as f64 / per_second as f64;
    Some((seconds(user + nice + system + irq + softirq), seconds(steal)))
}

/// With `--auth`: tokens the server refused over the whole run (any is a
/// failure: every token loadgen sends is valid), and the goal.
fn print_auth(live: &LiveResult, auth: bool) {
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

fn print_metric_deltas(live: &LiveResult, names: &[&str]) {
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
fn print_stage_latencies(live: &LiveResult) {
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

// ---------------------------------------------------------------------------
// Scenarios

/// Where the scenario's server is: started by us (with its pid) or given.
struct Target {
    authority: String,
    server: Option<ServerProcess>,
    /// With `--auth`: the secret the server verifies tokens with.
    auth: Option<Arc<Auth>>,
}

impl Target {
    fn open(options: &Options, server_binary: Option<&Path>, scenario: &str) -> Result<Target> {
        let auth = Auth::new(options)?;
        match (server_binary, &options.server_url) {
            (_, Some(url)) => Ok(Target { authority: url_authority(url)?, server: None, auth }),
            (Some(binary), None) => {
                let (server, authority) = ServerProcess::start(binary, options, scenario, auth.as_deref())?;
                Ok(Target { authority, server: Some(server), auth })
            }
            (None, None) => Err("no server binary and no --server-url".into()),
        }
    }

    /// A token of `sub` in `role`, when the run has auth.
    fn token(&self, sub: &str, role: Role) -> Option<Arc<str>> {
        self.auth.as_ref().map(|auth| auth.token(sub, role))
    }

    fn pid(&self) -> Option<String> {
        self.server.as_ref().map(ServerProcess::pid)
    }
}

fn chat_collection(index: usize) -> String {
    format!("user-{index:04}")
}

/// With `--auth`: the chat user whose collection is `chat_collection(index)`,
/// the `sub` of its subscriber's token (the rules bind `user-{sub}`).
fn chat_user(index: usize) -> String {
    format!("{index:04}")
}

fn leaderboard_viewer(index: usize) -> String {
    format!("viewer-{index:04}")
}

/// Where chat lives: a collection per user, or one for all (`chat-shared`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ChatLayout {
    PerUser,
    Shared,
}

/// chat-shared: room `room` of user `user`, unique in `rooms`.
fn shared_room_id(user: usize, room: usize) -> String {
    format!("!u{user:04}r{room:04}:example.org")
}

/// chat-shared: the rows of user `index`, as its own filter (JSON).
fn owner_filter(index: usize) -> String {
    format!(r#"{{"field":"owner","op":"eq","value":"{}"}}"#, chat_user(index))
}

/// With `--auth`: who sets up and checks (admin), who writes live (writer).
const ADMIN_SUB: &str = "loadgen-admin";
const WRITER_SUB: &str = "loadgen-writer";

/// With `--auth`: each chat user reads only its own collection; the writer
/// (a trusted backend) writes to every user's.
const CHAT_RULES: &str = r#"{"rules":[{"collection":"user-{sub}","roles":["reader"],"read":true},{"collection":"user-*","roles":["writer"],"write":true}]}"#;
/// chat-shared with `--auth`: a reader reads the rows it owns, whatever filter it sends.
const SHARED_RULES: &str = r#"{"rules":[{"collection":"rooms","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}},{"collection":"rooms","roles":["writer"],"write":true}]}"#;
const LEADERBOARD_RULES: &str = r#"{"rules":[{"collection":"leaderboard","roles":["reader"],"read":true},{"collection":"leaderboard","roles":["writer"],"write":true}]}"#;

fn chat_marks() -> UpdateMarks {
    UpdateMarks { number: |fields| fields.unread, stamp_us: |fields| fields.recency }
}

fn leaderboard_marks() -> UpdateMarks {
    UpdateMarks { number: |fields| fields.update, stamp_us: |fields| fields.sent_at }
}

/// Update numbers a subscriber can see at most: everything the writer can send.
fn max_update_number(rate: f64, seconds: f64) -> u64 {
    (rate * (seconds + 1.0)) as u64 + MAX_OPS_PER_REQUEST as u64
}

/// Chat's set-up: a collection per user, then every user's rooms.
async fn load_chat(pool: &mut HttpPool, options: &Options) -> Result<()> {
    let (n_collections, n_rooms) = (options.chat_collections, options.chat_rooms);
    let started = Instant::now();
    let schema = br#"{"fields":[{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"unread","type":"u64"}]}"#;
    pool.run_requests(
        n_collections,
        |index| (Method::PUT, format!("/v1/collections/{}", chat_collection(index)), schema.to_vec()),
        None,
    )
    .await?;
    println!("  created {n_collections} collections in {:.2} s", started.elapsed().as_secs_f64());

    // Whole collections per request, as many as fit in one request's op limit.
    let started = Instant::now();
    let collections_per_request = (MAX_OPS_PER_REQUEST / n_rooms).max(1);
    let n_requests = n_collections.div_ceil(collections_per_request);
    let mut rng = XorShift64::new(options.seed ^ 0x10AD);
    pool.run_requests(
        n_requests,
        |request| {
            let first = request * collections_per_request;
            let last = (first + collections_per_request).min(n_collections);
            let mut body = String::with_capacity((last - first) * n_rooms * 90);
            body.push_str(r#"{"writes":["#);
            for collection in first..last {
                if collection > first {
                    body.push(',');
                }
                write!(body, r#"{{"collection":"{}","ops":["#, chat_collection(collection)).expect("writing to a String");
                for room in 0..n_rooms {
                    if room > 0 {
                        body.push(',');
                    }
                    // Small recencies: every update (stamped in µs since the start) is newer.
                    write!(
                        body,
                        r#"{{"op":"upsert","id":"!r{room:04}:example.org","fields":{{"name":"Room {room}","recency":{},"unread":0}}}}"#,
                        rng.below(1_000)
                    )
                    .expect("writing to a String");
                }
                body.push_str("]}");
            }
            body.push_str("]}");
            (Method::POST, "/v1/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    let load_seconds = started.elapsed().as_secs_f64();
    let n_items = n_collections * n_rooms;
    println!("  loaded {n_items} rooms in {load_seconds:.2} s ({:.0} items/s)", n_items as f64 / load_seconds);
    Ok(())
}

/// chat-shared's set-up: one collection `rooms`, every user's rooms in it.
async fn load_shared_chat(pool: &mut HttpPool, options: &Options) -> Result<()> {
    let (n_users, n_rooms) = (options.chat_collections, options.chat_rooms);
    let schema = br#"{"fields":[{"name":"owner","type":"string"},{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"unread","type":"u64"}]}"#;
    pool.run_requests(1, |_| (Method::PUT, "/v1/collections/rooms".to_string(), schema.to_vec()), None).await?;
    let started = Instant::now();
    let n_items = n_users * n_rooms;
    let mut rng = XorShift64::new(options.seed ^ 0x10AD);
    pool.run_requests(
        n_items.div_ceil(MAX_OPS_PER_REQUEST),
        |request| {
            let items = request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(n_items);
            let mut body = String::with_capacity(items.len() * 110);
            body.push_str(r#"{"ops":["#);
            for item in items.clone() {
                if item > items.start {
                    body.push(',');
                }
                let (user, room) = (item / n_rooms, item % n_rooms);
                write!(
                    body,
                    r#"{{"op":"upsert","id":"{}","fields":{{"owner":"{}","name":"Room {room}","recency":{},"unread":0}}}}"#,
                    shared_room_id(user, room),
                    chat_user(user),
                    rng.below(1_000)
                )
                .expect("writing to a String");
            }
            body.push_str("]}");
            (Method::POST, "/v1/collections/rooms/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    let load_seconds = started.elapsed().as_secs_f64();
    println!("  loaded {n_items} rooms in {load_seconds:.2} s ({:.0} items/s)", n_items as f64 / load_seconds);
    Ok(())
}

async fn run_chat(
    options: &Options,
    server_binary: Option<&Path>,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
    layout: ChatLayout,
) -> Result<()> {
    let n_collections = options.chat_collections;
    let n_rooms = options.chat_rooms;
    let window_limit = options.window_limit;
    let shared = layout == ChatLayout::Shared;
    if shared {
        println!(
            "== chat-shared: {n_collections} users × {n_rooms} rooms in one collection `rooms` (field `owner`); one subscriber per user on its own rooms' top {window_limit} by recency desc ({}); {:.0} updates/s for {:.1} s ==",
            if options.auth { "the rules' row predicate owner == $sub" } else { "its own filter owner == user" },
            options.chat_rate,
            options.seconds
        );
    } else {
        println!(
            "== chat: {n_collections} users × {n_rooms} rooms; one subscriber per user on its top {window_limit} by recency desc; {:.0} updates/s for {:.1} s ==",
            options.chat_rate, options.seconds
        );
    }
    let target = Target::open(options, server_binary, if shared { "chat-shared" } else { "chat" })?;
    let mut pool =
        HttpPool::connect(&target.authority, options.http_connections, target.token(ADMIN_SUB, Role::Admin)).await?;
    if target.auth.is_some() {
        let rules = if shared { SHARED_RULES } else { CHAT_RULES };
        install_rules(&mut pool, rules).await?;
        println!("  auth: on; rules {rules}");
        if shared {
            println!(
                "        {n_collections} subscribers, each with its own reader token (sub = its user id) sent as an `auth` message and no filter of its own; live writes with a writer token; set-up and checks as admin"
            );
        } else {
            println!(
                "        {n_collections} subscribers, each with its own reader token (sub = its user id: `0000` reads `user-0000`) sent as an `auth` message; live writes with a writer token; set-up and checks as admin"
            );
        }
    }

    if shared {
        load_shared_chat(&mut pool, options).await?;
    } else {
        load_chat(&mut pool, options).await?;
    }

    if target.auth.is_some() && n_collections > 1 {
        let reader = target.token(&chat_user(0), Role::Reader);
        if shared {
            let what = format!("reader `{}` asking `rooms` for the rows of `{}`", chat_user(0), chat_user(1));
            let query = format!(
                r#"{{"filter":{},"sort":[{{"field":"recency","dir":"desc"}}],"offset":0,"limit":1}}"#,
                owner_filter(1)
            );
            expect_no_rows(&mut pool, reader, &what, "/v1/collections/rooms/query", &query).await?;
        } else {
            let query = r#"{"sort":[{"field":"recency","dir":"desc"}],"offset":0,"limit":1}"#;
            let path = format!("/v1/collections/{}/query", chat_collection(1));
            let what = format!("reader `{}` querying {}", chat_user(0), chat_collection(1));
            expect_forbidden(&mut pool, reader, &what, &path, query).await?;
        }
    }
    let max_number = max_update_number(options.chat_rate, options.seconds);
    // The view of user `index`'s subscriber: a collection and, in chat-shared
    // without auth, the filter it sends itself.
    let view_of = |index: usize| match (shared, options.auth) {
        (false, _) => (chat_collection(index), None),
        (true, false) => ("rooms".to_string(), Some(owner_filter(index))),
        (true, true) => ("rooms".to_string(), None),
    };
    let specs = (0..n_collections)
        .map(|collection| SubscriberSpec {
            authority: target.authority.clone(),
            collection: view_of(collection).0,
            filter: view_of(collection).1,
            sort_field: "recency",
            window_limit,
            marks: chat_marks(),
            max_update_number: max_number,
            auth: target
                .token(&chat_user(collection), Role::Reader)
                .map(|token| SubscriberAuth { sub: chat_user(collection), token }),
        })
        .collect();
    let plan = LivePlan {
        specs,
        rate: options.chat_rate,
        seconds: options.seconds,
        n_collections,
        write_token: target.token(WRITER_SUB, Role::Writer),
    };
    let mut source = ChatUpdates::new(options.seed, n_collections, n_rooms, layout);
    let live = run_live_phase(plan, &mut source, &mut pool, options, target.pid(), subscriber_runtime, clock).await?;
    // Checked as admin, with the owner filter spelled out in chat-shared: an
    // independent reference for the view the rules' predicate built.
    let (n_mismatches, first_mismatch) = if shared {
        let reference = |index: usize| ("rooms".to_string(), Some(owner_filter(index)));
        verify_filtered_lists(&mut pool, &live.outcomes, reference, "recency", window_limit).await?
    } else {
        verify_lists(&mut pool, &live.outcomes, chat_collection, "recency", window_limit).await?
    };

    // Losses per user: acknowledged updates its subscriber never received. They
    // count only where no reset announced a possible gap; where one did (the
    // engine also sends a Reset when it is shorter than the diffs, not only
    // to slow consumers), the same count is shown apart.
    let (mut lost, mut extra) = (0u64, 0u64);
    let (mut reset_collections, mut written_in_reset_collections, mut missing_in_reset_collections) = (0, 0, 0);
    for (collection, outcome) in live.outcomes.iter().enumerate() {
        let written = live.stats.acked_per_collection[collection].load(Ordering::Relaxed);
        let missing = written.saturating_sub(outcome.seen.n_seen);
        if outcome.resets_after_first > 0 {
            reset_collections += 1;
            written_in_reset_collections += written;
            missing_in_reset_collections += missing;
        } else {
            lost += missing;
        }
        extra += outcome.seen.n_seen.saturating_sub(written);
    }
    count_failures(lost);
    let resets: u64 = live.outcomes.iter().map(|outcome| outcome.resets_after_first).sum();

    print_common(&live, options.chat_rate, n_collections);
    if options.timeline {
        live.counters.timeline.print();
    }
    println!(
        "  losses: {lost} of {} acknowledged updates (over {} users without a reset){}",
        live.stats.acked.load(Ordering::Relaxed) - written_in_reset_collections,
        n_collections as u64 - reset_collections,
        if extra > 0 { format!("; {extra} received but never acknowledged") } else { String::new() },
    );
    println!(
        "  announced resets: {resets} in {reset_collections} subscriptions ({written_in_reset_collections} updates written there, {missing_in_reset_collections} of them never received)"
    );
    print_checks(&live, n_mismatches, first_mismatch);
    print_costs(&live);
    print_metric_deltas(
        &live,
        &[
            "ordo_frames_encoded_total",
            "ordo_frames_sent_total",
            "ordo_resets_slow_total",
            "ordo_batches_total",
            "ordo_thread_allocations_total{thread=\"network\"}",
            "ordo_thread_allocations_total{thread=\"writer\"}",
        ],
    );
    print_stage_latencies(&live);
    print_auth(&live, target.auth.is_some());
    println!("  {CHAT_GOAL}");
    println!();
    drop(pool);
    drop(target);
    Ok(())
}

async fn run_leaderboard(
    options: &Options,
    server_binary: Option<&Path>,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<()> {
    let n_rooms = options.leaderboard_rooms;
    let n_subscribers = options.leaderboard_subscribers;
    let window_limit = options.window_limit;
    if n_rooms < 2 * window_limit {
        return Err(format!("--leaderboard-rooms must be at least twice --window ({window_limit})").into());
    }
    println!(
        "== leaderboard: {n_rooms} rooms; {n_subscribers} subscribers on the same top {window_limit} by score desc; {:.0} updates/s (1 in {LEADERBOARD_ENTERING_ONE_IN} enters the top) for {:.1} s ==",
        options.leaderboard_rate, options.seconds
    );
    let target = Target::open(options, server_binary, "leaderboard")?;
    let mut pool =
        HttpPool::connect(&target.authority, options.http_connections, target.token(ADMIN_SUB, Role::Admin)).await?;
    if target.auth.is_some() {
        install_rules(&mut pool, LEADERBOARD_RULES).await?;
        println!("  auth: on; rules {LEADERBOARD_RULES}");
        println!(
            "        {n_subscribers} subscribers, each with its own reader token (sub `viewer-NNNN`) sent as an `auth` message; live writes with a writer token; set-up and checks as admin"
        );
    }
    let schema = br#"{"fields":[{"name":"name","type":"string"},{"name":"score","type":"i64"},{"name":"sent_at","type":"u64"},{"name":"update","type":"u64"}]}"#;
    pool.run_requests(1, |_| (Method::PUT, "/v1/collections/leaderboard".to_string(), schema.to_vec()), None).await?;

    let started = Instant::now();
    let mut rng = XorShift64::new(options.seed ^ 0x5C0E);
    let scores: Vec<i64> = (0..n_rooms).map(|_| rng.below(LEADERBOARD_INITIAL_SCORE_BOUND) as i64).collect();
    pool.run_requests(
        n_rooms.div_ceil(MAX_OPS_PER_REQUEST),
        |request| {
            let rooms = request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(n_rooms);
            let mut body = String::with_capacity(rooms.len() * 100);
            body.push_str(r#"{"ops":["#);
            for room in rooms.clone() {
                if room > rooms.start {
                    body.push(',');
                }
                write!(
                    body,
                    r#"{{"op":"upsert","id":"!r{room:06}:example.org","fields":{{"name":"Room {room}","score":{},"sent_at":0,"update":0}}}}"#,
                    scores[room]
                )
                .expect("writing to a String");
            }
            body.push_str("]}");
            (Method::POST, "/v1/collections/leaderboard/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    let load_seconds = started.elapsed().as_secs_f64();
    println!("  loaded {n_rooms} rooms in {load_seconds:.2} s ({:.0} items/s)", n_rooms as f64 / load_seconds);

    if target.auth.is_some() {
        let write = r#"{"ops":[{"op":"remove","id":"!r000000:example.org"}]}"#;
        let what = format!("reader `{}` writing to leaderboard", leaderboard_viewer(0));
        let token = target.token(&leaderboard_viewer(0), Role::Reader);
        expect_forbidden(&mut pool, token, &what, "/v1/collections/leaderboard/batch", write).await?;
    }
    let max_number = max_update_number(options.leaderboard_rate, options.seconds);
    let specs = (0..n_subscribers)
        .map(|index| SubscriberSpec {
            authority: target.authority.clone(),
            collection: "leaderboard".to_string(),
            sort_field: "score",
            window_limit,
            marks: leaderboard_marks(),
            max_update_number: max_number,
            filter: None,
            auth: target
                .token(&leaderboard_viewer(index), Role::Reader)
                .map(|token| SubscriberAuth { sub: leaderboard_viewer(index), token }),
        })
        .collect();
    let plan = LivePlan {
        specs,
        rate: options.leaderboard_rate,
        seconds: options.seconds,
        n_collections: 1,
        write_token: target.token(WRITER_SUB, Role::Writer),
    };
    let mut source = LeaderboardUpdates::new(options.seed, scores, window_limit);
    let live = run_live_phase(plan, &mut source, &mut pool, options, target.pid(), subscriber_runtime, clock).await?;
    let (n_mismatches, first_mismatch) =
        verify_lists(&mut pool, &live.outcomes, |_| "leaderboard".to_string(), "score", window_limit).await?;

    print_common(&live, options.leaderboard_rate, n_subscribers);
    if options.timeline {
        live.counters.timeline.print();
    }
    let commit_order = live.stats.commit_order.lock().expect("no panics while holding it").clone();
    let visible_numbers = source.visible_numbers(&commit_order);
    let received: u64 = live.outcomes.iter().map(|outcome| outcome.seen.n_seen).sum();
    println!(
        "  per subscriber: {:.0} frames/s, {:.1} kB/s; on average {:.0} distinct updates seen; {} updates gave a top score, {} were in the window after their batch",
        live.delivered.frames as f64 / live.write.write_seconds / n_subscribers as f64,
        live.delivered.bytes as f64 / live.write.write_seconds / n_subscribers as f64 / 1e3,
        received as f64 / n_subscribers as f64,
        source.n_entering,
        visible_numbers.len(),
    );
    // Losses: updates in the window after their batch that a subscriber never
    // received; counted apart for subscriptions that got a Reset after the first.
    let (mut lost, mut n_without_reset, mut missing_with_reset, mut resets) = (0u64, 0u64, 0u64, 0u64);
    for outcome in &live.outcomes {
        let missing = visible_numbers.iter().filter(|&&number| !outcome.seen.contains(number)).count() as u64;
        resets += outcome.resets_after_first;
        if outcome.resets_after_first == 0 {
            n_without_reset += 1;
            lost += missing;
        } else {
            missing_with_reset += missing;
        }
    }
    count_failures(lost);
    println!(
        "  losses: {lost} (over {n_without_reset} subscriptions without a reset); announced resets: {resets} in {} subscriptions ({missing_with_reset} updates never received there)",
        n_subscribers as u64 - n_without_reset
    );
    print_checks(&live, n_mismatches, first_mismatch);
    print_costs(&live);
    print_metric_deltas(
        &live,
        &[
            "ordo_frames_encoded_total",
            "ordo_frames_sent_total",
            "ordo_bytes_sent_total",
            "ordo_resets_slow_total",
            "ordo_batches_total",
        ],
    );
    print_stage_latencies(&live);
    let encoded = metric(&live.metrics_after, "ordo_frames_encoded_total")
        .zip(metric(&live.metrics_before, "ordo_frames_encoded_total"))
        .map(|(after, before)| after - before);
    let sent = metric(&live.metrics_after, "ordo_frames_sent_total")
        .zip(metric(&live.metrics_before, "ordo_frames_sent_total"))
        .map(|(after, before)| after - before);
    if let (Some(encoded), Some(sent)) = (encoded, sent) {
        if encoded > 0.0 {
            println!("  frames sent per frame encoded: {:.1} (the subscribers share one window)", sent / encoded);
        }
    }
    print_auth(&live, target.auth.is_some());
    println!();
    drop(pool);
    drop(target);
    Ok(())
}

async fn run_all(options: Options, subscriber_runtime: tokio::runtime::Handle) -> Result<()> {
    let clock = Clock { origin: Instant::now() };
    let server_binary = resolve_server_binary(&options)?;
    println!(
        "loadgen: seed {}, auth {}, durability {}, tick {} ms, {} HTTP connections, {} subscriber thread(s){}",
        options.seed,
        if options.auth { "on (HS256, one identity per subscriber)" } else { "off" },
        options.durability.as_deref().unwrap_or("server default"),
        options.tick.as_millis(),
        options.http_connections,
        options.subscriber_threads,
        if options.quick { ", quick" } else { "" },
    );
    if options.runs_chat() {
        run_chat(&options, server_binary.as_deref(), &subscriber_runtime, clock, ChatLayout::PerUser).await?;
    }
    if options.runs_chat_shared() {
        run_chat(&options, server_binary.as_deref(), &subscriber_runtime, clock, ChatLayout::Shared).await?;
    }
    if options.runs_leaderboard() {
        run_leaderboard(&options, server_binary.as_deref(), &subscriber_runtime, clock).await?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("loadgen: {message}\n");
            }
            eprintln!("{USAGE}");
            return if message.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    let open_files = raise_open_files_limit();
    let needed = options.chat_collections.max(options.leaderboard_subscribers) as u64 + 256;
    if open_files < needed {
        eprintln!("loadgen: warning: {open_files} open files allowed, about {needed} needed");
    }
    let main_runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("loadgen: cannot start a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let subscriber_runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.subscriber_threads)
        .thread_name("loadgen-subs")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("loadgen: cannot start the subscribers' runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = main_runtime.block_on(run_all(options, subscriber_runtime.handle().clone()));
    // Connections still open would keep their tasks alive; don't wait for them.
    subscriber_runtime.shutdown_background();
    let n_failures = CORRECTNESS_FAILURES.load(std::sync::atomic::Ordering::Relaxed);
    match result {
        Ok(()) if n_failures == 0 => ExitCode::SUCCESS,
        Ok(()) => {
            eprintln!("loadgen: {n_failures} correctness failures (lost updates, mismatched lists, seq gaps or protocol errors)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("loadgen: {error}");
            ExitCode::FAILURE
        }
    }
}
