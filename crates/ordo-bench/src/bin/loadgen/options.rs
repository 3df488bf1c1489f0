//! `loadgen`'s command line: every input has a limit, and `--quick` changes the
//! defaults of the sizes, not their meaning.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ordo_bench::cli::in_range;

/// PROTOCOL.md: a window holds at most 1 000 items.
const MAX_WINDOW_LIMIT: usize = 1_000;
/// Chat collection names are `user-NNNN`, room ids `!rNNNN:example.org`: four digits.
const MAX_CHAT_COLLECTIONS: usize = 10_000;
const MAX_CHAT_ROOMS_PER_COLLECTION: usize = 10_000;
/// Leaderboard room ids are `!rNNNNNN:example.org`: six digits.
const MAX_LEADERBOARD_ROOMS: usize = 1_000_000;
/// Flagship room ids are `!fNNNN:example.org`: four digits.
const MAX_FLAGSHIP_ROOMS: usize = 9_999;
/// One WebSocket per subscriber; the server accepts at most 10 000 connections.
pub const MAX_SUBSCRIBERS: usize = 10_000;
const MAX_SECONDS: f64 = 3_600.0;
const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
const MAX_HTTP_CONNECTIONS: usize = 64;
const MAX_SUBSCRIBER_THREADS: usize = 64;
const MAX_TICK_MS: u64 = 100;
/// Rates one flagship search tries per layout (each a fresh server and load).
const MAX_SEARCHED_RATES: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum ScenarioChoice {
    Chat,
    Leaderboard,
    Both,
    /// Only when named: chat with every user's rooms in one collection.
    ChatShared,
    /// Only when named: the flagship chat (shared rooms, members, auth), in its
    /// rooms layout and then its fan-out layout.
    Flagship,
}

/// Drives a live `ordo serve` over its wire protocol and measures what its users
/// see (end-to-end latency, losses, lists equal to the server's) and what it costs.
#[derive(Parser, Debug)]
#[command(name = "loadgen")]
struct Args {
    /// chat-shared (only when named): the chat users' rooms in one collection `rooms`
    /// with an `owner` field, each subscriber on its own rows: by its filter, or with
    /// --auth by the rules' row predicate owner == $sub; --collections and --rooms size
    /// it as chat. flagship (only when named, always with auth): shared rooms and
    /// memberships, then the fan-out layout of the same chat; --flagship-* size it
    #[arg(long, value_enum, default_value = "both")]
    scenario: ScenarioChoice,
    /// Small sizes and 3 s of writes per scenario (CI smoke run, ~10 s)
    #[arg(long)]
    quick: bool,
    /// Length of the write phase [default: 20]
    #[arg(long, value_parser = in_range(0.1, MAX_SECONDS))]
    seconds: Option<f64>,
    /// Chat updates per second [default: 20000]
    #[arg(long, value_parser = in_range(1.0, MAX_RATE_PER_SECOND))]
    rate: Option<f64>,
    /// Leaderboard updates per second [default: 1000]
    #[arg(long, value_parser = in_range(1.0, MAX_RATE_PER_SECOND))]
    leaderboard_rate: Option<f64>,
    /// Chat users = collections = subscribers [default: 1000]
    #[arg(long, value_parser = in_range(1, MAX_CHAT_COLLECTIONS - 1))]
    collections: Option<usize>,
    /// Chat rooms per user [default: 1000]
    #[arg(long, value_parser = in_range(1, MAX_CHAT_ROOMS_PER_COLLECTION - 1))]
    rooms: Option<usize>,
    /// [default: 100000]
    #[arg(long, value_parser = in_range(1, MAX_LEADERBOARD_ROOMS - 1))]
    leaderboard_rooms: Option<usize>,
    /// [default: 1000]
    #[arg(long, value_parser = in_range(1, MAX_SUBSCRIBERS))]
    leaderboard_subscribers: Option<usize>,
    /// Flagship: users = subscribers [default: 10000]
    #[arg(long, value_parser = in_range(2, MAX_SUBSCRIBERS))]
    flagship_users: Option<usize>,
    /// Flagship: shared rooms [default: 1000]
    #[arg(long, value_parser = in_range(1, MAX_FLAGSHIP_ROOMS))]
    flagship_rooms: Option<usize>,
    /// Flagship: rooms each user is in [default: 100]
    #[arg(long, value_parser = in_range(1, MAX_FLAGSHIP_ROOMS))]
    flagship_rooms_per_user: Option<usize>,
    /// Flagship: messages per second [default: 10, a rate both layouts keep up with on a 2-core machine]
    #[arg(long, value_parser = in_range(1.0, MAX_RATE_PER_SECOND))]
    flagship_rate: Option<f64>,
    /// Flagship: a rate search instead of one run per layout. Each layout runs at
    /// these messages per second in turn (ascending, comma-separated), a fresh
    /// server each, until one misses p99 ≤ 50 ms, sends under 95 % of its rate
    /// or loses anything; then the highest rate each held is compared
    #[arg(long, value_delimiter = ',', value_parser = in_range(1.0, MAX_RATE_PER_SECOND))]
    flagship_rates: Vec<f64>,
    /// Window length of every subscription
    #[arg(long, default_value_t = 20, value_parser = in_range(1, MAX_WINDOW_LIMIT))]
    window: usize,
    /// The writer sends what is due every N ms
    #[arg(long, default_value_t = 4, value_parser = in_range(1, MAX_TICK_MS))]
    tick_ms: u64,
    /// Keep-alive connections for writes, in flight at once
    #[arg(long, default_value_t = 4, value_parser = in_range(1, MAX_HTTP_CONNECTIONS))]
    http_connections: usize,
    /// Tokio workers for the subscribers
    #[arg(long, default_value_t = 1, value_parser = in_range(1, MAX_SUBSCRIBER_THREADS))]
    subscriber_threads: usize,
    /// Seed of the update stream
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `ordo` binary to start (default: build it with cargo, then use the one next
    /// to this executable, in target/release)
    #[arg(long, value_name = "PATH", conflicts_with = "server_url")]
    server_bin: Option<PathBuf>,
    /// Use a running server (http://host:port); CPU and RSS are not measured
    #[arg(long, value_name = "URL")]
    server_url: Option<String>,
    /// Passed to `ordo serve`
    #[arg(long, value_parser = ["full", "relaxed"])]
    durability: Option<String>,
    /// One more argument for `ordo serve` (repeatable)
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Run with auth: the server verifies HS256 tokens (a secret loadgen writes), rules
    /// let each chat user read only its own collection, every subscriber authenticates
    /// as itself (`auth` message), every write carries a writer token
    #[arg(long)]
    auth: bool,
    /// With --auth: this secret (e.g. the one of a --server-url server) instead of a fresh one
    #[arg(long, value_name = "FILE")]
    auth_secret_file: Option<PathBuf>,
    /// Also print end-to-end latency per second of send time (where the tail is)
    #[arg(long)]
    timeline: bool,
}

/// The run's settings, with `--quick`'s defaults applied.
pub struct Options {
    pub scenario: ScenarioChoice,
    pub quick: bool,
    pub seconds: f64,
    pub chat_rate: f64,
    pub leaderboard_rate: f64,
    pub chat_collections: usize,
    pub chat_rooms: usize,
    pub leaderboard_rooms: usize,
    pub leaderboard_subscribers: usize,
    pub flagship_users: usize,
    pub flagship_rooms: usize,
    pub flagship_rooms_per_user: usize,
    pub flagship_rate: f64,
    /// Empty: one run per layout at `flagship_rate`.
    pub flagship_rates: Vec<f64>,
    pub window_limit: usize,
    pub tick: Duration,
    pub http_connections: usize,
    pub subscriber_threads: usize,
    pub seed: u64,
    pub server_bin: Option<PathBuf>,
    pub server_url: Option<String>,
    pub durability: Option<String>,
    pub server_args: Vec<String>,
    pub timeline: bool,
    pub auth: bool,
    pub auth_secret_file: Option<PathBuf>,
}

impl Options {
    /// The command line's options; `Err` with the message for what clap cannot check
    /// alone (clap itself exits on `--help` and on a malformed flag).
    pub fn from_command_line() -> Result<Options, String> {
        Options::from_args(Args::parse())
    }

    fn from_args(args: Args) -> Result<Options, String> {
        if args.server_url.is_some() && (args.durability.is_some() || !args.server_args.is_empty()) {
            return Err("--durability and --server-arg need a server started by loadgen, not --server-url".into());
        }
        if args.auth_secret_file.is_some() && !args.auth {
            return Err("--auth-secret-file needs --auth".to_string());
        }
        if args.auth && args.server_url.is_some() && args.auth_secret_file.is_none() {
            return Err("--auth with --server-url needs the server's --auth-secret-file".to_string());
        }
        // The quick run keeps every mechanism (load, 1 WebSocket per subscriber,
        // batched writes, verification) at sizes that finish in seconds.
        let quick = args.quick;
        let options = Options {
            scenario: args.scenario,
            quick,
            seconds: args.seconds.unwrap_or(if quick { 3.0 } else { 20.0 }),
            chat_rate: args.rate.unwrap_or(if quick { 2_000.0 } else { 20_000.0 }),
            leaderboard_rate: args.leaderboard_rate.unwrap_or(if quick { 500.0 } else { 1_000.0 }),
            chat_collections: args.collections.unwrap_or(if quick { 200 } else { 1_000 }),
            chat_rooms: args.rooms.unwrap_or(if quick { 200 } else { 1_000 }),
            leaderboard_rooms: args.leaderboard_rooms.unwrap_or(if quick { 10_000 } else { 100_000 }),
            leaderboard_subscribers: args.leaderboard_subscribers.unwrap_or(if quick { 200 } else { 1_000 }),
            flagship_users: args.flagship_users.unwrap_or(if quick { 100 } else { 10_000 }),
            flagship_rooms: args.flagship_rooms.unwrap_or(if quick { 50 } else { 1_000 }),
            flagship_rooms_per_user: args.flagship_rooms_per_user.unwrap_or(if quick { 10 } else { 100 }),
            flagship_rate: args.flagship_rate.unwrap_or(if quick { 50.0 } else { 10.0 }),
            flagship_rates: args.flagship_rates,
            window_limit: args.window,
            tick: Duration::from_millis(args.tick_ms),
            http_connections: args.http_connections,
            subscriber_threads: args.subscriber_threads,
            seed: args.seed,
            server_bin: args.server_bin,
            server_url: args.server_url,
            durability: args.durability,
            server_args: args.server_args,
            timeline: args.timeline,
            // The flagship is about its rules: it always runs with auth.
            auth: args.auth || args.scenario == ScenarioChoice::Flagship,
            auth_secret_file: args.auth_secret_file,
        };
        if options.flagship_rates.len() > MAX_SEARCHED_RATES {
            return Err(format!("--flagship-rates: at most {MAX_SEARCHED_RATES} rates"));
        }
        if options.flagship_rates.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err("--flagship-rates: the rates must be ascending".to_string());
        }
        if !options.flagship_rates.is_empty() && !options.runs_flagship() {
            return Err("--flagship-rates needs --scenario flagship".to_string());
        }
        if options.chat_collections > MAX_SUBSCRIBERS {
            return Err(format!("--collections: at most {MAX_SUBSCRIBERS} subscribers (one per collection)"));
        }
        Ok(options)
    }

    pub fn runs_chat(&self) -> bool {
        matches!(self.scenario, ScenarioChoice::Chat | ScenarioChoice::Both)
    }

    pub fn runs_leaderboard(&self) -> bool {
        matches!(self.scenario, ScenarioChoice::Leaderboard | ScenarioChoice::Both)
    }

    pub fn runs_chat_shared(&self) -> bool {
        self.scenario == ScenarioChoice::ChatShared
    }

    pub fn runs_flagship(&self) -> bool {
        self.scenario == ScenarioChoice::Flagship
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, String> {
        let args = Args::try_parse_from(std::iter::once("loadgen").chain(line.split_whitespace()))
            .map_err(|error| error.to_string())?;
        Options::from_args(args)
    }

    #[test]
    fn quick_changes_the_defaults_and_flags_override_them() {
        let options =
            parse("--quick --seconds=1.5 --scenario chat-shared --server-arg --log-level --server-arg debug").unwrap();
        assert!(options.quick && options.runs_chat_shared() && !options.runs_chat());
        assert_eq!((options.seconds, options.chat_collections, options.window_limit), (1.5, 200, 20));
        assert_eq!(options.server_args, ["--log-level", "debug"]);
        assert_eq!(parse("").unwrap().chat_collections, 1_000);
        let flagship = parse("--scenario flagship --quick").unwrap();
        assert!(flagship.runs_flagship() && flagship.auth && !flagship.runs_chat());
        assert_eq!((flagship.flagship_users, flagship.flagship_rooms_per_user), (100, 10));
        let search = parse("--scenario flagship --flagship-rates 100,200,400").unwrap();
        assert_eq!(search.flagship_rates, [100.0, 200.0, 400.0]);
    }

    #[test]
    fn values_outside_their_limits_are_refused() {
        assert!(parse("--window 1001").is_err());
        assert!(parse("--seconds 0").is_err());
        assert!(parse("--durability sometimes").is_err());
        assert!(parse("--server-bin a --server-url http://b:1").is_err());
        assert!(parse("--auth-secret-file s").is_err());
        assert!(parse("--server-url http://b:1 --durability full").is_err());
        assert!(parse("--scenario flagship --flagship-rates 200,100").is_err());
        assert!(parse("--flagship-rates 100").is_err(), "only the flagship searches");
        assert!(parse("--scenario flagship --flagship-rates 0,100").is_err());
    }
}
