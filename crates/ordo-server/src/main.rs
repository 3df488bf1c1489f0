//! The `ordo` command.

use std::process::ExitCode;
use std::time::Duration;

use std::path::Path;

use ordo_server::auth;
use ordo_server::metrics::CountingAllocator;
use ordo_server::server::{serve, ServeOptions};
use ordo_store::Durability;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const USAGE: &str = "\
usage: ordo serve [options]
       ordo token --sub SUB [--role reader|writer|admin] [--ttl SECS] [--secret-file FILE] [--claim NAME=VALUE]...
       ordo load-demo [--url 127.0.0.1:7070] [--rooms 10000]
       ordo backup --to DIR [--url 127.0.0.1:7070 | --data-dir DIR]   (ordo backup --help)

Starts the Ordo server: an HTTP API and WebSocket subscriptions (docs/PROTOCOL.md)
over an embedded LMDB data directory, which is created if missing and reloaded at start.

options:
  --listen ADDR                 address to listen on (default 127.0.0.1:7070; port 0 picks one)
  --data-dir DIR                data directory (default ./ordo-data)
  --durability full|relaxed     full: every acknowledged write survives a power cut (default);
                                relaxed: the last commits before a machine crash may be lost
  --outbound-buffer BYTES       per-connection queue before a slow client gets a Reset (default 1048576)
  --slow-close-after SECS       close a client that reads nothing for this long (default 10)
  --ws-messages-per-second N    per WebSocket connection (default 100, burst 200)
  --http-requests-per-second N  per HTTP connection (default 5000, burst 10000)
  --network-threads N           threads for sockets and JSON (default: one per core, at most 4;
                                at most 64; the writer has its own)
  --session-retention SECS      how long a disconnected client's subscriptions wait for its resume (default 60)
  --checkpoint-interval SECS    how long writes stay only in the write-ahead log before LMDB gets them
                                (default 60; longer: less disk traffic, a longer log to replay at start)
  --log-segment-size BYTES      write-ahead log segment size, 1048576..=1073741824 (default 16777216;
                                a busy server preallocates up to two; K, M and G suffixes allowed)
  --header-timeout SECS         close a connection that takes longer to send a request head, or sits
                                idle this long between HTTP/1.1 requests (default 10)
auth (docs/SECURITY.md; without --auth-secret-file or --auth-jwks, every caller is an admin,
and the server listens on loopback addresses only unless --insecure):
  --auth-secret-file FILE       HS256 tokens signed with the secret in FILE (at least 32 bytes);
                                or the secret itself in the environment variable ORDO_AUTH_SECRET
  --auth-jwks FILE              EdDSA, ES256 and RS256 tokens verified with the public keys of a JWKS file
  --auth-audience AUD           tokens must carry this `aud`
  --auth-issuer ISS             tokens must carry this `iss`
  --auth-role-claim NAME        the claim that holds the role: admin, writer or reader (default `role`)
  --allow-origin ORIGIN         a browser origin allowed to call (CORS and the WebSocket `Origin`), e.g.
                                https://app.example.org; repeatable; by default only the server's own
  --allow-host NAME             a host name the server answers to (`Host`), besides IP addresses and
                                localhost; repeatable (DNS-rebinding protection)
  --insecure                    allow running without auth on a non-loopback address
  --metrics-public              serve /metrics without an admin token
  --auth-timeout SECS           a WebSocket opened without a token must send `auth` within this (default 10)
  --auth-grace SECS             after its token expires, a WebSocket has this long to send a fresh one
                                before it is closed with 4401 (default 30)

  --demo                        the web demo's data: write 10 000 rooms into collection `rooms` if it is
                                missing or empty, and simulate chat traffic; the page is at /demo
  --demo-rate N                 the simulator's messages per second at start (default 20, at most 5000;
                                POST /demo/simulator {\"rate\":N} changes it while running)

`ordo token` prints a signed HS256 token (for development and for backends). The secret comes
from --secret-file FILE or the environment variable ORDO_AUTH_SECRET, never from the command line.
Defaults: --role reader, --ttl 3600 (seconds).

`ordo load-demo` fills a running server with a chat room list (collection `rooms`).
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => match parse_serve(&args[1..]).and_then(serve) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("ordo: {message}");
                ExitCode::FAILURE
            }
        },
        Some("token") => match token(&args[1..]) {
            Ok(token) => {
                println!("{token}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("ordo token: {message}");
                ExitCode::from(2)
            }
        },
        Some("backup") => match ordo_server::backup_cmd::run(&args[1..]) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("ordo backup: {message}");
                ExitCode::FAILURE
            }
        },
        Some("load-demo") => match parse_load_demo(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("ordo: {message}");
                ExitCode::FAILURE
            }
        },
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("ordo: unknown command `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn parse_serve(args: &[String]) -> Result<ServeOptions, String> {
    let mut options = ServeOptions::default();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => options.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--data-dir" => options.data_dir = value()?.into(),
            "--durability" => {
                options.durability = match value()?.as_str() {
                    "full" => Durability::Full,
                    "relaxed" => Durability::Relaxed,
                    other => return Err(format!("--durability is full or relaxed, not `{other}`")),
                }
            }
            "--outbound-buffer" => options.outbound_budget = number(flag, value()?)?,
            "--slow-close-after" => options.slow_close_after = Duration::from_secs(number(flag, value()?)?),
            "--ws-messages-per-second" => options.ws_messages_per_second = number(flag, value()?)?,
            "--http-requests-per-second" => options.http_requests_per_second = number(flag, value()?)?,
            "--network-threads" => {
                options.network_threads = number(flag, value()?)?;
                if !(1..=ordo_server::limits::MAX_NETWORK_THREADS).contains(&options.network_threads) {
                    return Err(format!("--network-threads is 1..={}", ordo_server::limits::MAX_NETWORK_THREADS));
                }
            }
            "--session-retention" => options.session_retention = Duration::from_secs(number(flag, value()?)?),
            "--checkpoint-interval" => {
                options.checkpoint_interval =
                    Duration::from_secs(number(flag, value()?)?).max(Duration::from_millis(100))
            }
            "--log-segment-size" => {
                options.log_segment_bytes = ordo_server::backup_cmd::parse_log_segment_size(value()?)?
            }
            "--header-timeout" => {
                let secs: u64 = number(flag, value()?)?;
                if secs == 0 {
                    return Err("--header-timeout is at least 1 second".to_owned());
                }
                options.header_timeout = Duration::from_secs(secs);
            }
            "--demo" => options.demo = true,
            "--demo-rate" => {
                options.demo_rate = number(flag, value()?)?;
                if options.demo_rate > ordo_server::limits::MAX_DEMO_MESSAGES_PER_SECOND {
                    return Err(format!(
                        "--demo-rate is 0..={} messages per second",
                        ordo_server::limits::MAX_DEMO_MESSAGES_PER_SECOND
                    ));
                }
            }
            "--auth-secret-file" => options.auth.secret = Some(auth::read_secret_file(Path::new(value()?))?),
            "--auth-jwks" => options.auth.jwks_path = Some(value()?.into()),
            "--auth-audience" => options.auth.audience = Some(value()?.clone()),
            "--auth-issuer" => options.auth.issuer = Some(value()?.clone()),
            "--auth-role-claim" => options.auth.role_claim = Some(value()?.clone()),
            "--allow-origin" => {
                let origin = value()?;
                if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.contains('*') {
                    return Err(format!("--allow-origin takes an origin like https://app.example.org, not `{origin}`"));
                }
                options.allow_origins.push(origin.clone());
            }
            "--allow-host" => options.allow_hosts.push(value()?.clone()),
            "--insecure" => options.insecure = true,
            "--metrics-public" => options.metrics_public = true,
            "--auth-timeout" => options.auth_timeout = Duration::from_secs(number::<u64>(flag, value()?)?.max(1)),
            "--auth-grace" => options.auth_grace = Duration::from_secs(number(flag, value()?)?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        }
    }
    if options.auth.secret.is_none() {
        if let Some(secret) = secret_from_env()? {
            options.auth.secret = Some(secret);
        }
    }
    Ok(options)
}

fn secret_from_env() -> Result<Option<Vec<u8>>, String> {
    match std::env::var("ORDO_AUTH_SECRET") {
        Ok(secret) => {
            let secret = secret.trim().as_bytes().to_vec();
            auth::check_secret(&secret).map_err(|error| format!("ORDO_AUTH_SECRET: {error}"))?;
            Ok(Some(secret))
        }
        Err(_) => Ok(None),
    }
}

/// `ordo token`: an HS256 token for development and backends.
fn token(args: &[String]) -> Result<String, String> {
    let mut sub = None;
    let mut role = auth::Role::Reader;
    let mut ttl_secs = 3600u64;
    let mut secret = None;
    let mut role_claim = "role".to_owned();
    let mut extra = serde_json::Map::new();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--sub" => sub = Some(value()?.clone()),
            "--role" => {
                let name = value()?;
                role = auth::Role::parse(name)
                    .ok_or_else(|| format!("--role is admin, writer or reader, not `{name}`"))?;
            }
            "--ttl" => ttl_secs = number(flag, value()?)?,
            "--secret-file" => secret = Some(auth::read_secret_file(Path::new(value()?))?),
            "--role-claim" => role_claim = value()?.clone(),
            "--aud" => {
                extra.insert("aud".to_owned(), value()?.clone().into());
            }
            "--iss" => {
                extra.insert("iss".to_owned(), value()?.clone().into());
            }
            "--claim" => {
                let pair = value()?;
                let (name, text) =
                    pair.split_once('=').ok_or_else(|| format!("--claim takes NAME=VALUE, not `{pair}`"))?;
                if matches!(name, "sub" | "exp" | "iat") || name == role_claim {
                    return Err(format!("--claim cannot set `{name}`; it has its own option"));
                }
                extra.insert(name.to_owned(), text.into());
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        }
    }
    let sub = sub.ok_or("--sub is required")?;
    if sub.is_empty() || sub.len() > ordo_server::limits::MAX_SUBJECT_BYTES {
        return Err(format!("--sub is 1..={} bytes", ordo_server::limits::MAX_SUBJECT_BYTES));
    }
    let secret = match secret {
        Some(secret) => secret,
        None => secret_from_env()?.ok_or("no secret: pass --secret-file FILE or set ORDO_AUTH_SECRET")?,
    };
    Ok(auth::mint(&secret, &role_claim, &sub, role, ttl_secs, &extra))
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("{flag} takes a number, not `{text}`"))
}

fn parse_load_demo(args: &[String]) -> Result<(), String> {
    let mut address = "127.0.0.1:7070".to_owned();
    let mut n_rooms = 10_000;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => address = value()?.trim_start_matches("http://").trim_end_matches('/').to_owned(),
            "--rooms" => n_rooms = number(flag, value()?)?,
            other => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        }
    }
    ordo_server::demo_data::load_demo(&address, n_rooms)
}
