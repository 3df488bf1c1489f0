//! The `ordo` command.

use std::process::ExitCode;
use std::time::Duration;

use ordo_server::metrics::CountingAllocator;
use ordo_server::server::{serve, ServeOptions};
use ordo_store::Durability;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const USAGE: &str = "\
usage: ordo serve [options]
       ordo load-demo [--url 127.0.0.1:7070] [--rooms 10000]

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
  --header-timeout SECS         close a connection that takes longer to send a request head, or sits
                                idle this long between HTTP/1.1 requests (default 10)
  --demo                        the web demo's data: write 10 000 rooms into collection `rooms` if it is
                                missing or empty, and simulate chat traffic; the page is at /demo
  --demo-rate N                 the simulator's messages per second at start (default 20, at most 5000;
                                POST /demo/simulator {\"rate\":N} changes it while running)

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
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        }
    }
    Ok(options)
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
