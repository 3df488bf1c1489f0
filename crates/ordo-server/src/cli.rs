//! The `ordo` command line, parsed by `clap`. Every `ordo serve` option has
//! three other sources besides its flag: the environment variable `ORDO_<NAME>`
//! (the flag's name in upper snake case) and the key `<name>` (the flag's name
//! without `--`) of the TOML file given with `--config FILE`. A flag wins over
//! its variable, which wins over the file, which wins over the default.
//!
//! The file is applied by making its values the flags' defaults before the
//! final parse: so a value from the file goes through the same parser, the same
//! checks and the same error messages as one typed on the command line, and
//! `clap`'s own precedence (flag, then variable, then default) does the rest.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::auth;
use crate::limits;
use crate::server::{default_network_threads, ServeOptions};

#[derive(Parser, Debug)]
#[command(
    name = "ordo",
    version,
    about = "Ordo: live sorted, filtered windows over your data, kept in sync over WebSockets.",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// One enum for every subcommand, each with its own `Args` struct, so a new
/// one (`backup`, say) is a variant and a module of its own.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Starts the server (HTTP API and WebSocket subscriptions).
    ///
    /// An HTTP API and WebSocket subscriptions (docs/PROTOCOL.md) over an embedded LMDB data
    /// directory, which is created if missing and reloaded at start.
    ///
    /// Every option can also be set with the environment variable ORDO_<OPTION> (e.g. ORDO_DATA_DIR)
    /// or as a key of the TOML file given with --config (e.g. `data-dir = "/var/lib/ordo"`);
    /// a flag wins over the variable, the variable over the file, the file over the default.
    Serve(Box<ServeArgs>),
    /// Prints a signed HS256 token (for development and for backends).
    ///
    /// The secret comes from --secret-file FILE or the environment variable ORDO_AUTH_SECRET, never
    /// from the command line.
    Token(TokenArgs),
    /// Fills a running server with a chat room list (collection `rooms`).
    LoadDemo(LoadDemoArgs),
    /// Writes a consistent copy of a data directory while the server keeps writing.
    ///
    /// Prints the backup's seq: the copy holds exactly the batches 1..=seq, and `ordo serve
    /// --data-dir DIR` starts from it. Against a running server (--url) through `POST /v1/backup`
    /// (an admin's token, if the server has auth: --token-file FILE or the variable ORDO_TOKEN);
    /// or, with --data-dir, on a directory no server holds (docs/STORAGE.md, "Backup").
    Backup(crate::backup_cmd::BackupArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    /// Every acknowledged write survives a power cut.
    Full,
    /// The last commits before a machine crash may be lost.
    Relaxed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`).
    Json,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A TOML file of options: each key is an option's name without `--` (unknown keys are refused).
    #[arg(long, env = "ORDO_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to listen on (port 0 picks one).
    #[arg(long, env = "ORDO_LISTEN", value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Data directory.
    #[arg(long, env = "ORDO_DATA_DIR", value_name = "DIR", default_value = "ordo-data")]
    pub data_dir: PathBuf,
    /// full: every acknowledged write survives a power cut; relaxed: the last commits before a machine crash may be lost.
    #[arg(long, env = "ORDO_DURABILITY", value_enum, default_value_t = Durability::Full)]
    pub durability: Durability,
    /// Per-connection queue (bytes) before a slow client gets a Reset.
    #[arg(long, env = "ORDO_OUTBOUND_BUFFER", value_name = "BYTES", default_value_t = limits::DEFAULT_OUTBOUND_BUFFER_BYTES)]
    pub outbound_buffer: usize,
    /// Close a client that reads nothing for this long (seconds).
    #[arg(long, env = "ORDO_SLOW_CLOSE_AFTER", value_name = "SECS", default_value_t = limits::DEFAULT_SLOW_CLOSE_AFTER_SECS)]
    pub slow_close_after: u64,
    /// Messages per second per WebSocket connection (bursts of up to 200).
    #[arg(long, env = "ORDO_WS_MESSAGES_PER_SECOND", value_name = "N", default_value_t = limits::DEFAULT_WS_MESSAGES_PER_SECOND)]
    pub ws_messages_per_second: u32,
    /// Requests per second per HTTP connection (bursts of up to 10 000).
    #[arg(long, env = "ORDO_HTTP_REQUESTS_PER_SECOND", value_name = "N", default_value_t = limits::DEFAULT_HTTP_REQUESTS_PER_SECOND)]
    pub http_requests_per_second: u32,
    /// Threads for sockets and JSON (default: one per core, at most 4; at most 64; the writer has its own).
    #[arg(long, env = "ORDO_NETWORK_THREADS", value_name = "N", default_value_t = default_network_threads())]
    pub network_threads: usize,
    /// How long a disconnected client's subscriptions wait for its resume (seconds).
    #[arg(long, env = "ORDO_SESSION_RETENTION", value_name = "SECS", default_value_t = limits::DEFAULT_SESSION_RETENTION_SECS)]
    pub session_retention: u64,
    /// How long writes stay only in the write-ahead log before LMDB gets them (seconds; longer: less
    /// disk traffic, a longer log to replay at start).
    #[arg(long, env = "ORDO_CHECKPOINT_INTERVAL", value_name = "SECS", default_value_t = 60)]
    pub checkpoint_interval: u64,
    /// Write-ahead log segment size: bytes, or with a K, M or G suffix; 1M..=1G. A busy server
    /// preallocates up to two segments, an idle one none.
    #[arg(long, env = "ORDO_LOG_SEGMENT_SIZE", value_name = "BYTES", default_value = "16M",
          value_parser = crate::backup_cmd::parse_log_segment_size)]
    pub log_segment_size: u64,
    /// Close a connection that takes longer to send a request head, or sits idle this long between
    /// HTTP/1.1 requests (seconds).
    #[arg(long, env = "ORDO_HEADER_TIMEOUT", value_name = "SECS", default_value_t = limits::DEFAULT_HEADER_TIMEOUT_SECS)]
    pub header_timeout: u64,
    /// Most TCP connections at once (HTTP and WebSocket); past it a connection gets `503`. Default: all
    /// that the descriptor limit (RLIMIT_NOFILE, raised to its hard limit at start) leaves room for,
    /// less 128 for the server's own files; a higher value is refused. Each subscribed WebSocket takes
    /// memory (docs/BENCHMARKS.md).
    #[arg(long, env = "ORDO_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,

    /// HS256 tokens signed with the secret in FILE (at least 32 bytes); or the secret itself in the
    /// environment variable ORDO_AUTH_SECRET. Without this or --auth-jwks every caller is an admin, and
    /// the server listens on loopback addresses only unless --insecure (docs/SECURITY.md).
    #[arg(long, env = "ORDO_AUTH_SECRET_FILE", value_name = "FILE", help_heading = "Auth")]
    pub auth_secret_file: Option<PathBuf>,
    /// EdDSA, ES256 and RS256 tokens verified with the public keys of a JWKS file.
    #[arg(long, env = "ORDO_AUTH_JWKS", value_name = "FILE", help_heading = "Auth")]
    pub auth_jwks: Option<PathBuf>,
    /// Tokens must carry this `aud`.
    #[arg(long, env = "ORDO_AUTH_AUDIENCE", value_name = "AUD", help_heading = "Auth")]
    pub auth_audience: Option<String>,
    /// Tokens must carry this `iss`.
    #[arg(long, env = "ORDO_AUTH_ISSUER", value_name = "ISS", help_heading = "Auth")]
    pub auth_issuer: Option<String>,
    /// The claim that holds the role: admin, writer or reader [default: role].
    #[arg(long, env = "ORDO_AUTH_ROLE_CLAIM", value_name = "NAME", help_heading = "Auth")]
    pub auth_role_claim: Option<String>,
    /// A browser origin allowed to call (CORS and the WebSocket `Origin`), e.g. https://app.example.org;
    /// repeatable (comma-separated in the variable); by default only the server's own.
    #[arg(long, env = "ORDO_ALLOW_ORIGIN", value_name = "ORIGIN", action = ArgAction::Append, value_delimiter = ',', help_heading = "Auth")]
    pub allow_origin: Vec<String>,
    /// A host name the server answers to (`Host`), besides IP addresses and localhost; repeatable
    /// (comma-separated in the variable) (DNS-rebinding protection).
    #[arg(long, env = "ORDO_ALLOW_HOST", value_name = "NAME", action = ArgAction::Append, value_delimiter = ',', help_heading = "Auth")]
    pub allow_host: Vec<String>,
    /// Allow running without auth on a non-loopback address.
    #[arg(long, env = "ORDO_INSECURE", help_heading = "Auth")]
    pub insecure: bool,
    /// Serve /metrics without an admin token.
    #[arg(long, env = "ORDO_METRICS_PUBLIC", help_heading = "Auth")]
    pub metrics_public: bool,
    /// A WebSocket opened without a token must send `auth` within this (seconds; at least 1).
    #[arg(long, env = "ORDO_AUTH_TIMEOUT", value_name = "SECS", default_value_t = limits::AUTH_TIMEOUT_SECS, help_heading = "Auth")]
    pub auth_timeout: u64,
    /// After its token expires, a WebSocket has this long to send a fresh one before it is closed with 4401 (seconds).
    #[arg(long, env = "ORDO_AUTH_GRACE", value_name = "SECS", default_value_t = limits::AUTH_EXPIRY_GRACE_SECS, help_heading = "Auth")]
    pub auth_grace: u64,

    /// Log lines as readable text or as JSON objects (both on stderr).
    #[arg(long, env = "ORDO_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human, help_heading = "Logs")]
    pub log_format: LogFormat,
    /// The least level logged (error, warn, info, debug, trace), or a `RUST_LOG`-style filter such as
    /// `info,ordo_server::ws=debug`. Unset here, in ORDO_LOG_LEVEL and in the file: RUST_LOG, else info.
    #[arg(long, env = "ORDO_LOG_LEVEL", value_name = "FILTER", help_heading = "Logs")]
    pub log_level: Option<String>,

    /// The web demo's data: write 10 000 rooms into collection `rooms` if it is missing or empty, and
    /// simulate chat traffic; the page is at /demo.
    #[arg(long, env = "ORDO_DEMO", help_heading = "Demo")]
    pub demo: bool,
    /// The simulator's messages per second at start (at most 5000; POST /demo/simulator {"rate":N}
    /// changes it while running).
    #[arg(long, env = "ORDO_DEMO_RATE", value_name = "N", default_value_t = limits::DEFAULT_DEMO_MESSAGES_PER_SECOND, help_heading = "Demo")]
    pub demo_rate: u32,

    /// Cluster mode: the NATS servers (comma-separated URLs) whose JetStream stream carries every write;
    /// this node applies the stream in order and publishes the writes it takes (docs/SCALING.md).
    #[arg(long, env = "ORDO_CLUSTER", value_name = "URLS", help_heading = "Cluster")]
    pub cluster: Option<String>,
    /// This node's name in health, metrics and message ids (default: the host name and the listen port).
    #[arg(long, env = "ORDO_NODE_NAME", value_name = "NAME", help_heading = "Cluster")]
    pub node_name: Option<String>,
    /// The JetStream stream that holds the log.
    #[arg(long, env = "ORDO_STREAM", value_name = "NAME", default_value = "ORDO", help_heading = "Cluster")]
    pub stream: String,
    /// Replicas of the stream when this node creates it (1 with a single NATS server).
    #[arg(long, env = "ORDO_STREAM_REPLICAS", value_name = "N", default_value_t = 3, help_heading = "Cluster")]
    pub stream_replicas: usize,
    /// Stream messages behind the stream's end above which the node says it lags and refuses new subscribers.
    #[arg(
        long,
        env = "ORDO_CLUSTER_MAX_LAG",
        value_name = "MESSAGES",
        default_value_t = 10_000,
        help_heading = "Cluster"
    )]
    pub cluster_max_lag: u64,
    /// Where snapshots are published (`snapshot-<seq>/`) and where a new node looks for one: a path every
    /// node can read. A node with an empty data directory starts from the newest (docs/SCALING.md).
    #[arg(long, env = "ORDO_SNAPSHOT_DIR", value_name = "DIR", help_heading = "Cluster")]
    pub snapshot_dir: Option<PathBuf>,
    /// Write a snapshot into --snapshot-dir every N stream messages applied (0: this node writes none).
    #[arg(long, env = "ORDO_SNAPSHOT_EVERY", value_name = "MESSAGES", default_value_t = 0, help_heading = "Cluster")]
    pub snapshot_every: u64,
    /// Most entries this node publishes as one atomic batch, sharing one Raft round and fsync
    /// (1: one entry per message). Entries of requests arriving together are grouped (docs/SCALING.md).
    #[arg(long, env = "ORDO_COALESCE_ENTRIES", requires = "cluster", value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=1_000), help_heading = "Cluster")]
    pub coalesce_entries: u64,
    /// Most payload bytes in one such batch.
    #[arg(long, env = "ORDO_COALESCE_BYTES", requires = "cluster", value_name = "BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u64).range(1_024..=(8 << 20)), help_heading = "Cluster")]
    pub coalesce_bytes: u64,
    /// How long a batch waits for more entries after its first (0: it takes only those already waiting;
    /// the busier the node, the larger its batches).
    #[arg(long, env = "ORDO_COALESCE_WAIT_US", requires = "cluster", value_name = "MICROSECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=100_000), help_heading = "Cluster")]
    pub coalesce_wait_us: u64,
    /// Batches this node publishes at once; entries arriving meanwhile wait for the next batch.
    #[arg(long, env = "ORDO_COALESCE_IN_FLIGHT", requires = "cluster", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=32), help_heading = "Cluster")]
    pub coalesce_in_flight: u64,
    /// Retention of the stream when this node creates it: at most N entries, oldest dropped first
    /// (0: unlimited). At least two snapshot intervals plus the entries written while one is copied.
    #[arg(long, env = "ORDO_STREAM_MAX_MSGS", value_name = "N", default_value_t = 0, help_heading = "Cluster")]
    pub stream_max_msgs: u64,
    /// Retention of the stream when this node creates it: entries older than this many seconds are
    /// dropped (0: unlimited). Prefer --stream-max-msgs (docs/SCALING.md).
    #[arg(long, env = "ORDO_STREAM_MAX_AGE", value_name = "SECONDS", default_value_t = 0, help_heading = "Cluster")]
    pub stream_max_age: u64,

    /// Follow PostgreSQL tables (docs/POSTGRES.md): TABLE or schema.TABLE, served as the collection of
    /// the same name, or TABLE:COLLECTION, or TABLE:COLLECTION:COL,COL (only those columns besides the
    /// key); repeatable (`;`-separated in the variable). Such collections are read-only through Ordo.
    #[arg(long, env = "ORDO_PG_TABLE", value_name = "TABLE[:COLLECTION[:COLUMNS]]", action = ArgAction::Append,
          value_delimiter = ';', help_heading = "PostgreSQL")]
    pub pg_table: Vec<String>,
    /// The PostgreSQL server: a host name or address, or the directory of its Unix socket (a path starting with /).
    #[arg(
        long,
        env = "ORDO_PG_HOST",
        value_name = "HOST|DIR",
        default_value = "localhost",
        help_heading = "PostgreSQL"
    )]
    pub pg_host: String,
    /// Its port (with a socket directory: the number in the socket's name).
    #[arg(long, env = "ORDO_PG_PORT", value_name = "PORT", default_value_t = 5432, help_heading = "PostgreSQL")]
    pub pg_port: u16,
    /// The role to log in as (it needs REPLICATION and SELECT on the tables).
    #[arg(long, env = "ORDO_PG_USER", value_name = "ROLE", default_value = "ordo", help_heading = "PostgreSQL")]
    pub pg_user: String,
    /// The database that holds the tables.
    #[arg(
        long,
        env = "ORDO_PG_DATABASE",
        value_name = "NAME",
        default_value = "postgres",
        help_heading = "PostgreSQL"
    )]
    pub pg_database: String,
    /// The file holding the role's password; or the password itself in the environment variable
    /// ORDO_PG_PASSWORD (never on the command line).
    #[arg(long, env = "ORDO_PG_PASSWORD_FILE", value_name = "FILE", help_heading = "PostgreSQL")]
    pub pg_password_file: Option<PathBuf>,
    /// The publication that holds the followed tables.
    #[arg(long, env = "ORDO_PG_PUBLICATION", value_name = "NAME", default_value = "ordo", help_heading = "PostgreSQL")]
    pub pg_publication: String,
    /// Create the publication when it does not exist, at the first start (`CREATE PUBLICATION ... FOR
    /// TABLE` of the followed tables); off: a missing publication stops the start. The role then needs
    /// CREATE on the database and ownership of the tables.
    #[arg(long, env = "ORDO_PG_CREATE_PUBLICATION", help_heading = "PostgreSQL")]
    pub pg_create_publication: bool,
    /// The logical replication slot (created by Ordo; one per follower, keep the name).
    #[arg(long, env = "ORDO_PG_SLOT", value_name = "NAME", default_value = "ordo", help_heading = "PostgreSQL")]
    pub pg_slot: String,
    /// A column of a type Ordo does not follow: `refuse` stops at start (and when one is added)
    /// naming it; `skip` leaves it out, as if it were not there. Key columns are never skipped.
    #[arg(
        long,
        env = "ORDO_PG_UNSUPPORTED_COLUMNS",
        value_name = "refuse|skip",
        default_value = "refuse",
        value_parser = ["refuse", "skip"],
        help_heading = "PostgreSQL"
    )]
    pub pg_unsupported_columns: String,
    /// TLS to PostgreSQL: `auto` is on and verified (CA and host name) for a TCP host that is not
    /// loopback, or whenever --pg-tls-ca-file is given, and off for a Unix socket or a loopback
    /// address; `require` is always on (refused with a Unix socket); `disable` is never on.
    #[arg(
        long,
        env = "ORDO_PG_TLS",
        value_name = "auto|require|disable",
        default_value = "auto",
        value_parser = ["auto", "require", "disable"],
        help_heading = "PostgreSQL"
    )]
    pub pg_tls: String,
    /// The PEM file of the CA(s) PostgreSQL's certificate must chain to; else the system's roots.
    #[arg(long, env = "ORDO_PG_TLS_CA_FILE", value_name = "FILE", help_heading = "PostgreSQL")]
    pub pg_tls_ca_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The token's subject (`sub`): who it speaks for.
    #[arg(long)]
    pub sub: String,
    /// admin, writer or reader.
    #[arg(long, default_value = "reader")]
    pub role: String,
    /// Lifetime in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub ttl: u64,
    /// The file holding the HS256 secret (else the environment variable ORDO_AUTH_SECRET).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// The claim that carries the role.
    #[arg(long, value_name = "NAME", default_value = "role")]
    pub role_claim: String,
    /// The token's `aud`.
    #[arg(long)]
    pub aud: Option<String>,
    /// The token's `iss`.
    #[arg(long)]
    pub iss: Option<String>,
    /// Another claim, as a string; repeatable.
    #[arg(long, value_name = "NAME=VALUE")]
    pub claim: Vec<String>,
}

#[derive(Args, Debug)]
pub struct LoadDemoArgs {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub url: String,
    /// How many rooms to write.
    #[arg(long, default_value_t = 10_000)]
    pub rooms: usize,
}

/// Parses the command line, applying `ordo serve --config FILE` (see the module's
/// comment). `Err` is clap's error (help and version included): the caller prints
/// it and exits with its code.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(&args)?;
    let config = matches.subcommand_matches("serve").and_then(|serve| serve.get_one::<PathBuf>("config").cloned());
    let Some(config) = config else { return Cli::from_arg_matches(&matches) };
    let defaults = match read_config(&config, command.find_subcommand("serve").expect("serve exists")) {
        Ok(defaults) => defaults,
        Err(message) => return Err(Cli::command().error(clap::error::ErrorKind::InvalidValue, message)),
    };
    let command = command.mut_subcommand("serve", |mut serve| {
        for (id, values) in defaults {
            serve = serve.mut_arg(id, |arg| arg.default_values(values));
        }
        serve
    });
    // The same arguments parsed above: a failure now comes from a value of the file.
    let matches = command.try_get_matches_from(&args).map_err(|error| {
        let text = error.to_string();
        let first_line = text.lines().next().unwrap_or_default().trim_start_matches("error: ");
        Cli::command().error(clap::error::ErrorKind::InvalidValue, format!("{}: {first_line}", config.display()))
    })?;
    Cli::from_arg_matches(&matches)
}

/// The file's values as flag defaults: `(argument id, values)` for each key.
fn read_config(path: &Path, serve: &clap::Command) -> Result<Vec<(String, Vec<String>)>, String> {
    let where_ = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("cannot read the config file {where_}: {error}"))?;
    let table: toml::Table =
        text.parse().map_err(|error| format!("the config file {where_} is not valid TOML: {error}"))?;
    let mut defaults = Vec::with_capacity(table.len());
    for (key, value) in table {
        if key == "postgres" {
            let specs = crate::pg_follow::config::toml_tables(&value, &where_.to_string())?;
            defaults.push(("pg_table".to_owned(), specs));
            continue;
        }
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_long() == Some(key.as_str()) && !matches!(key.as_str(), "config" | "help" | "version"))
            .ok_or_else(|| unknown_key(&where_.to_string(), &key, serve))?;
        let repeatable = matches!(arg.get_action(), ArgAction::Append);
        let values = match value {
            toml::Value::Array(items) if repeatable => {
                items.iter().map(|item| scalar(item, &key, &where_.to_string())).collect::<Result<Vec<_>, _>>()?
            }
            value => vec![scalar(&value, &key, &where_.to_string())?],
        };
        defaults.push((arg.get_id().to_string(), values));
    }
    if defaults.iter().filter(|(id, _)| id == "pg_table").count() > 1 {
        return Err(format!("{where_}: give the followed tables as `pg-table` or as `[[postgres.table]]`, not both"));
    }
    Ok(defaults)
}

fn scalar(value: &toml::Value, key: &str, file: &str) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Boolean(flag) => Ok(flag.to_string()),
        other => Err(format!("{file}: `{key}` takes a string, a number or a boolean, not {}", other.type_str())),
    }
}

fn unknown_key(file: &str, key: &str, serve: &clap::Command) -> String {
    let known: Vec<&str> = serve
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| !matches!(*long, "config" | "help" | "version"))
        .collect();
    // `data_dir` for `data-dir` is the likeliest slip.
    let dashed = key.replace('_', "-");
    let hint = if known.contains(&dashed.as_str()) { format!(" (did you mean `{dashed}`?)") } else { String::new() };
    format!(
        "{file}: unknown key `{key}`{hint}; the keys are the options of `ordo serve` without `--`: {}",
        known.join(", ")
    )
}

impl ServeArgs {
    /// The options the server runs with; checks what the types alone do not.
    pub fn into_options(self) -> Result<ServeOptions, String> {
        let postgres = crate::pg_follow::config::from_args(&self)?;
        let mut options = ServeOptions {
            listen: self.listen,
            data_dir: self.data_dir,
            durability: match self.durability {
                Durability::Full => ordo_store::Durability::Full,
                Durability::Relaxed => ordo_store::Durability::Relaxed,
            },
            outbound_budget: self.outbound_buffer,
            slow_close_after: Duration::from_secs(self.slow_close_after),
            ws_messages_per_second: self.ws_messages_per_second,
            http_requests_per_second: self.http_requests_per_second,
            network_threads: self.network_threads,
            session_retention: Duration::from_secs(self.session_retention),
            checkpoint_interval: Duration::from_secs(self.checkpoint_interval).max(Duration::from_millis(100)),
            log_segment_bytes: self.log_segment_size,
            header_timeout: Duration::from_secs(self.header_timeout),
            max_connections: self.max_connections,
            demo: self.demo,
            demo_rate: self.demo_rate,
            insecure: self.insecure,
            metrics_public: self.metrics_public,
            auth_timeout: Duration::from_secs(self.auth_timeout.max(1)),
            auth_grace: Duration::from_secs(self.auth_grace),
            postgres,
            ..ServeOptions::default()
        };
        if !(1..=limits::MAX_NETWORK_THREADS).contains(&options.network_threads) {
            return Err(format!("--network-threads is 1..={}", limits::MAX_NETWORK_THREADS));
        }
        if self.header_timeout == 0 {
            return Err("--header-timeout is at least 1 second".to_owned());
        }
        if options.demo_rate > limits::MAX_DEMO_MESSAGES_PER_SECOND {
            return Err(format!("--demo-rate is 0..={} messages per second", limits::MAX_DEMO_MESSAGES_PER_SECOND));
        }
        for origin in &self.allow_origin {
            if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.contains('*') {
                return Err(format!("--allow-origin takes an origin like https://app.example.org, not `{origin}`"));
            }
        }
        if let Some(urls) = &self.cluster {
            options.cluster = Some(crate::cluster::ClusterOptions::new(
                urls,
                self.node_name.clone(),
                options.listen,
                self.stream.clone(),
                self.stream_replicas,
                self.cluster_max_lag,
            )?);
        }
        if let Some(cluster) = &mut options.cluster {
            if self.snapshot_every > 0 && self.snapshot_dir.is_none() {
                return Err("--snapshot-every needs --snapshot-dir (where to write the snapshots)".to_owned());
            }
            cluster.snapshot_dir = self.snapshot_dir.clone();
            cluster.snapshot_every = self.snapshot_every;
            cluster.stream_max_msgs = self.stream_max_msgs;
            cluster.stream_max_age = std::time::Duration::from_secs(self.stream_max_age);
            cluster.coalesce = crate::cluster::coalesce::CoalesceOptions {
                max_entries: self.coalesce_entries as usize,
                max_bytes: self.coalesce_bytes as usize,
                wait: std::time::Duration::from_micros(self.coalesce_wait_us),
                in_flight: self.coalesce_in_flight as usize,
            };
        } else if self.snapshot_dir.is_some()
            || self.snapshot_every > 0
            || self.stream_max_msgs > 0
            || self.stream_max_age > 0
        {
            return Err("--snapshot-dir, --snapshot-every and --stream-max-* need --cluster".to_owned());
        }
        if options.postgres.is_some() && options.durability != ordo_store::Durability::Full {
            return Err("--pg-table needs --durability full: a position is confirmed to PostgreSQL (which then \
                        forgets the changes before it) only once it is synced here"
                .to_owned());
        }
        options.allow_origins = self.allow_origin;
        options.allow_hosts = self.allow_host;
        options.auth.secret = match &self.auth_secret_file {
            Some(path) => Some(auth::read_secret_file(path)?),
            None => secret_from_env()?,
        };
        options.auth.jwks_path = self.auth_jwks;
        options.auth.audience = self.auth_audience;
        options.auth.issuer = self.auth_issuer;
        options.auth.role_claim = self.auth_role_claim;
        Ok(options)
    }
}

/// `ORDO_AUTH_SECRET`: the HS256 secret itself (trimmed), for `serve` and `token`.
pub fn secret_from_env() -> Result<Option<Vec<u8>>, String> {
    match std::env::var("ORDO_AUTH_SECRET") {
        Ok(secret) => {
            let secret = secret.trim().as_bytes().to_vec();
            auth::check_secret(&secret).map_err(|error| format!("ORDO_AUTH_SECRET: {error}"))?;
            Ok(Some(secret))
        }
        Err(_) => Ok(None),
    }
}

impl TokenArgs {
    /// The signed token.
    pub fn mint(self) -> Result<String, String> {
        let role = auth::Role::parse(&self.role)
            .ok_or_else(|| format!("--role is admin, writer or reader, not `{}`", self.role))?;
        let mut extra = serde_json::Map::new();
        if let Some(aud) = self.aud {
            extra.insert("aud".to_owned(), aud.into());
        }
        if let Some(iss) = self.iss {
            extra.insert("iss".to_owned(), iss.into());
        }
        for pair in &self.claim {
            let (name, text) = pair.split_once('=').ok_or_else(|| format!("--claim takes NAME=VALUE, not `{pair}`"))?;
            if matches!(name, "sub" | "exp" | "iat") || name == self.role_claim {
                return Err(format!("--claim cannot set `{name}`; it has its own option"));
            }
            extra.insert(name.to_owned(), text.into());
        }
        if self.sub.is_empty() || self.sub.len() > limits::MAX_SUBJECT_BYTES {
            return Err(format!("--sub is 1..={} bytes", limits::MAX_SUBJECT_BYTES));
        }
        if !crate::auth::is_claim_text(&self.sub) {
            return Err(
                "--sub holds only letters, digits and - _ . @ : + = | ~ (the server refuses any other)".to_owned()
            );
        }
        let secret = match &self.secret_file {
            Some(path) => auth::read_secret_file(path)?,
            None => secret_from_env()?.ok_or("no secret: pass --secret-file FILE or set ORDO_AUTH_SECRET")?,
        };
        Ok(auth::mint(&secret, &self.role_claim, &self.sub, role, self.ttl, &extra))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    fn serve(args: &[&str]) -> Result<super::ServeArgs, clap::Error> {
        let line = ["ordo", "serve"].iter().chain(args);
        match super::Cli::try_parse_from(line)?.command {
            super::Command::Serve(args) => Ok(*args),
            other => panic!("not serve: {other:?}"),
        }
    }

    /// The coalescing options shape cluster mode's publishes: without
    /// `--cluster` they would be silently ignored, so they are refused.
    #[test]
    fn the_coalescing_options_need_cluster_mode_and_reach_it() {
        let error = serve(&["--coalesce-entries", "8"]).expect_err("refused without --cluster");
        assert_eq!(error.kind(), clap::error::ErrorKind::MissingRequiredArgument, "{error}");
        let args = serve(&[
            "--cluster",
            "nats://127.0.0.1:4222",
            "--coalesce-entries",
            "8",
            "--coalesce-wait-us",
            "250",
            "--coalesce-in-flight",
            "2",
        ])
        .unwrap();
        let cluster = args.into_options().unwrap().cluster.expect("cluster mode");
        assert_eq!(cluster.coalesce.max_entries, 8);
        assert_eq!(cluster.coalesce.wait, std::time::Duration::from_micros(250));
        assert_eq!(cluster.coalesce.in_flight, 2);
        assert!(serve(&["--cluster", "nats://x:4222", "--coalesce-entries", "1001"]).is_err(), "at most 1 000");
    }
}
