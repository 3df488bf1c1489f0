//! `pg-bench`: measures `ordo serve --pg-table` following PostgreSQL, end to
//! end, with the real `ordo` binary and a throw-away PostgreSQL it starts
//! itself (`initdb` into a temporary directory, a Unix socket, no TCP port;
//! `scripts/install-postgres.sh` installs the binaries).
//!
//! ```text
//! cargo build --release -p ordo-server --bin ordo
//! cargo run --release -p ordo-bench --bin pg-bench -- --quick --ordo-bin target/release/ordo   # CI smoke run
//! cargo run --release -p ordo-bench --bin pg-bench                                             # the full run
//! cargo run --release -p ordo-bench --bin pg-bench -- --cluster nats://127.0.0.1:14222       # in cluster mode
//! ```
//!
//! Three figures, in one run (docs/POSTGRES.md, "Figures"):
//!
//! 1. **Initial copy rate.** A table of `--rows` rooms (`id text primary key,
//!    name text, recency bigint, last_seq bigint, preview text`) is filled in
//!    PostgreSQL; then `ordo serve` starts on an empty data directory (a first
//!    start: it creates the slot and copies the table). Timed from the process's
//!    start to its `ordo: following PostgreSQL` line, which it prints once the
//!    copy is stored.
//! 2. **Sustained streaming rate.** `--writers` connections send transactions
//!    of `--batch` rows (`UPDATE rooms SET recency = ..., last_seq = last_seq + 1
//!    WHERE id IN (...)`) as fast as PostgreSQL commits them for `--seconds`;
//!    Ordo's `/v1/health` counts the transactions it applied meanwhile, and its
//!    lag when the writers stop.
//! 3. **Commit → frame latency.** `--subscribers` WebSockets each on the top
//!    `--window` rooms by `recency` descending; one writer sends `--rate` rows/s
//!    in transactions of `--batch` rows, each row carrying its send time in
//!    `recency` (microseconds of this process's clock, which the subscribers read
//!    on arrival) and an update number in `last_seq`. p50/p99/max of send →
//!    frame. `--lists own` puts each subscriber on its own rooms instead (a
//!    filter on `owner`, the row's number modulo the subscribers), so that a
//!    row reaches one window, as each user of an app watches their own list.
//!
//! The writers speak PostgreSQL's protocol through `ordo-pgsource`'s own
//! client (its SQL mode), the subscribers are the loadgen's.

#[path = "pg_bench/cpu.rs"]
mod cpu;
#[path = "pg_bench/latency.rs"]
mod latency;
#[path = "pg_bench/options.rs"]
mod options;
#[path = "pg_bench/ordo.rs"]
mod ordo;
#[path = "pg_bench/postgres.rs"]
mod postgres;
#[path = "pg_bench/report.rs"]
mod report;
#[path = "pg_bench/stream.rs"]
mod stream;
#[path = "pg_bench/updates.rs"]
mod updates;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ordo_bench::live::procfs::raise_open_files_limit;
use ordo_bench::live::stats::Clock;
use ordo_bench::live::Result;

use crate::cpu::PhaseCpu;
use crate::options::Options;
use crate::ordo::{Health, OrdoProcess};

/// The three phases; the number of subscribers with a problem.
async fn run(options: Options, subscriber_runtime: tokio::runtime::Handle) -> Result<usize> {
    let clock = Clock { origin: Instant::now() };
    println!(
        "pg-bench: {} rows, {:.1} s per phase, {} writers, {} rows per transaction, {} subscribers at {:.0} rows/s, window {}{}",
        options.rows,
        options.seconds,
        options.writers,
        options.batch,
        options.subscribers,
        options.rate,
        options.window,
        if options.quick { ", quick" } else { "" }
    );
    ordo::check_binary(&options.ordo_bin)?;
    // Declared first, dropped last: `ordo serve` stops before its PostgreSQL.
    let pg = postgres::start()?;
    postgres::create_and_fill(&pg, options.rows, options.subscribers)?;
    println!("ordo: {} serve --pg-table rooms (a first start: the slot, then the copy)", options.ordo_bin.display());
    let mut ordo = OrdoProcess::start(&options.ordo_bin, &pg, options.rows, options.cluster.as_deref())?;
    let mut health = Health::connect(&ordo.authority).await?;
    if options.cluster.is_some() {
        let streaming_at = health.wait_streaming(Duration::from_secs(60 + options.rows / 10_000)).await?;
        ordo.copy_seconds = streaming_at.duration_since(ordo.started).as_secs_f64();
    }
    report::copy(&options, ordo.copy_seconds);

    let config = postgres::connect_config(&pg);
    let pid = ordo.pid();
    let cpu = PhaseCpu::start(&pid);
    let streamed = stream::run(&options, &config, &mut health, clock).await?;
    let cores = cpu.finish();
    report::streaming(&options, &streamed, &cores);

    let whose = if options.lists == options::Lists::Own { " of their own rooms" } else { "" };
    println!("latency: {} subscribers on the top {}{whose} by recency...", options.subscribers, options.window);
    let cpu = PhaseCpu::start(&pid);
    let measured = latency::run(&options, &config, &ordo.authority, &subscriber_runtime, clock).await?;
    let cores = cpu.finish();
    let troubled = report::latency(&options, &measured, &cores);
    report::reference();
    Ok(troubled)
}

fn main() -> ExitCode {
    let options = match Options::from_command_line() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("pg-bench: {message} (see --help)");
            return ExitCode::from(2);
        }
    };
    let open_files = raise_open_files_limit();
    let needed = options.subscribers as u64 + 256;
    if open_files < needed {
        eprintln!("pg-bench: warning: {open_files} open files allowed, about {needed} needed");
    }
    let runtimes = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|main| {
        let subscribers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.subscriber_threads)
            .thread_name("pg-bench-subs")
            .enable_all()
            .build()?;
        Ok((main, subscribers))
    });
    let (main_runtime, subscriber_runtime) = match runtimes {
        Ok(runtimes) => runtimes,
        Err(error) => {
            eprintln!("pg-bench: cannot start a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = main_runtime.block_on(run(options, subscriber_runtime.handle().clone()));
    // Connections still open would keep their tasks alive; don't wait for them.
    subscriber_runtime.shutdown_background();
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(troubled) => {
            eprintln!("pg-bench: {troubled} subscribers saw lost frames, protocol errors or a closed connection");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("pg-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
