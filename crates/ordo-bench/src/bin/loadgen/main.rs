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
//! - `flagship` (only when named, always with auth): 10 000 users in 1 000 shared
//!   rooms of Zipf sizes (100 rooms each), each user's subscriber on its top 20
//!   memberships by `room.recency` through the reference under the flagship's
//!   rules; 10 messages/s (a rate both layouts keep up with here) to
//!   Zipf-chosen rooms, a read mark per ten; then the same chat in the fan-out
//!   layout (a copy of each room per member). `--flagship-rates 1,2,5,10,20`
//!   searches instead: each layout at each rate in turn while it keeps up, then
//!   the highest rate each held within p99 ≤ 50 ms and at all.
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

mod auth;
mod chat;
mod flagship;
mod leaderboard;
mod options;
mod report;
mod runner;
mod server;

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ordo_bench::live::chat::ChatLayout;
use ordo_bench::live::flagship::FlagshipLayout;
use ordo_bench::live::procfs::raise_open_files_limit;
use ordo_bench::live::stats::Clock;
use ordo_bench::live::Result;

use crate::chat::Chat;
use crate::flagship::{search_rates, Flagship};
use crate::leaderboard::Leaderboard;
use crate::options::Options;
use crate::report::CORRECTNESS_FAILURES;
use crate::runner::run_scenario;
use crate::server::resolve_server_binary;

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
    let server_binary = server_binary.as_deref();
    if options.runs_chat() {
        let mut chat = Chat::new(&options, ChatLayout::PerUser);
        run_scenario(&mut chat, &options, server_binary, &subscriber_runtime, clock).await?;
    }
    if options.runs_chat_shared() {
        let mut chat = Chat::new(&options, ChatLayout::Shared);
        run_scenario(&mut chat, &options, server_binary, &subscriber_runtime, clock).await?;
    }
    if options.runs_flagship() && !options.flagship_rates.is_empty() {
        search_rates(&options, server_binary, &subscriber_runtime, clock).await?;
    } else if options.runs_flagship() {
        for layout in [FlagshipLayout::Rooms, FlagshipLayout::FanOut] {
            let mut flagship = Flagship::new(&options, layout);
            run_scenario(&mut flagship, &options, server_binary, &subscriber_runtime, clock).await?;
        }
    }
    if options.runs_leaderboard() {
        let mut leaderboard = Leaderboard::new(&options)?;
        run_scenario(&mut leaderboard, &options, server_binary, &subscriber_runtime, clock).await?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let options = match Options::from_command_line() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("loadgen: {message} (see --help)");
            return ExitCode::from(2);
        }
    };
    let open_files = raise_open_files_limit();
    let needed = options.chat_collections.max(options.leaderboard_subscribers).max(options.flagship_users) as u64 + 256;
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
    let n_failures = CORRECTNESS_FAILURES.load(Ordering::Relaxed);
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
