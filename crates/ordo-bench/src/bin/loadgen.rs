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

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Method;
use ordo_bench::live::chat::{
    chat_collection, chat_losses, chat_marks, chat_user, load_chat, load_shared_chat, owner_filter, ChatLayout,
    ChatLosses, ChatUpdates,
};
use ordo_bench::live::http::{metric, HttpPool, HttpReply};
use ordo_bench::live::phase::{run_live_phase, LivePlan, LiveResult};
use ordo_bench::live::procfs::raise_open_files_limit;
use ordo_bench::live::stats::{megabytes, ms, Clock, XorShift64};
use ordo_bench::live::subscriber::{preview, SubscriberAuth, SubscriberOutcome, SubscriberSpec, UpdateMarks};
use ordo_bench::live::verify::{verify_filtered_lists, verify_lists};
use ordo_bench::live::wire::QueryReply;
use ordo_bench::live::writer::{max_update_number, UpdateSource, WritePart, WriteRequest};
use ordo_bench::live::{Result, MAX_OPS_PER_REQUEST};
use ordo_server::auth::Role;

// ---------------------------------------------------------------------------
// Limits: every input of the load generator has one.

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
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Printed next to the chat figures: the chat scenario's goals (`SCENARIOS.md`).
const CHAT_GOAL: &str = "goal: p99 ≤ 10 ms, 0 lost, server ≤ 1 core";
/// Tokens minted by loadgen live this much longer than the write phase (set-up
/// of a million rooms and a thousand connections included).
const TOKEN_TTL_MARGIN_SECS: u64 = 3_600;
/// The goal of a run with `--auth` against one without (`SCENARIOS.md`).
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

// ---------------------------------------------------------------------------
// Process figures from /proc

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

// ---------------------------------------------------------------------------
// Wire types: only what the load generator reads, borrowed where it can be.

// ---------------------------------------------------------------------------
// Subscribers

// ---------------------------------------------------------------------------
// Writers

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

// ---------------------------------------------------------------------------
// The live phase, common to both scenarios

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

fn leaderboard_viewer(index: usize) -> String {
    format!("viewer-{index:04}")
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

fn leaderboard_marks() -> UpdateMarks {
    UpdateMarks { number: |fields| fields.update, stamp_us: |fields| fields.sent_at }
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
        load_shared_chat(&mut pool, options.chat_collections, options.chat_rooms, options.seed).await?;
    } else {
        load_chat(&mut pool, options.chat_collections, options.chat_rooms, options.seed).await?;
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
        watched_pids: Vec::new(),
    };
    let mut source = ChatUpdates::new(options.seed, n_collections, n_rooms, layout);
    let live =
        run_live_phase(plan, &mut source, &mut pool, options.tick, target.pid(), subscriber_runtime, clock).await?;
    // Checked as admin, with the owner filter spelled out in chat-shared: an
    // independent reference for the view the rules' predicate built.
    let (n_mismatches, first_mismatch) = if shared {
        let reference = |index: usize| ("rooms".to_string(), Some(owner_filter(index)));
        verify_filtered_lists(&mut pool, &live.outcomes, reference, "recency", window_limit).await?
    } else {
        verify_lists(&mut pool, &live.outcomes, chat_collection, "recency", window_limit).await?
    };

    let ChatLosses {
        lost,
        extra,
        reset_collections,
        written_in_reset_collections,
        missing_in_reset_collections,
        resets,
    } = chat_losses(&live.outcomes, &live.stats);
    count_failures(lost);

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
        watched_pids: Vec::new(),
    };
    let mut source = LeaderboardUpdates::new(options.seed, scores, window_limit);
    let live =
        run_live_phase(plan, &mut source, &mut pool, options.tick, target.pid(), subscriber_runtime, clock).await?;
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
