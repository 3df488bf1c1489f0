//! `store-bench`: how fast a data directory of N benchmark rooms is written and
//! reopened (LMDB read, bulk engine load, room-list window ready), against the
//! obvious alternative measured in the same run: feeding the same rooms to a
//! fresh engine as batches (the path every later write takes; no disk involved).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ordo_bench::cli::count;
use ordo_bench::data::{generate_rooms, Room, RoomFilter};
use ordo_bench::ordo_system::{add_rooms, engine_with_rooms, room_list_def, room_schema};
use ordo_core::{Batch, NullSink, Value};
use ordo_store::{print_load_progress, Database, Durability, StoreOptions, Writer};

/// Writes N benchmark rooms to a data directory and times reopening it, against
/// feeding the same rooms to a fresh engine as batches.
#[derive(Parser)]
#[command(name = "store-bench")]
struct Args {
    /// Rooms in the collection
    #[arg(long, default_value_t = 1_000_000, value_parser = count)]
    n: usize,
    /// Reopen runs; medians are reported
    #[arg(long, default_value_t = 5, value_parser = count)]
    runs: usize,
    /// Data directory to use (default: a fresh one under the system temp directory,
    /// removed at the end)
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// Skip writing: PATH already holds the N rooms (a profile of the reopen alone);
    /// the peer is skipped too
    #[arg(long, requires = "dir")]
    reopen_only: bool,
    /// Write with Durability::Relaxed (MDB_NOMETASYNC)
    #[arg(long)]
    relaxed: bool,
    /// Drop the page cache before each reopen (needs root; writes /proc/sys/vm/drop_caches)
    #[arg(long)]
    cold: bool,
    /// Time the reopens in this process, one after another (later runs reuse the heap
    /// the previous one freed: no page faults, so faster than a real restart); by
    /// default each reopen and each peer run is a fresh child process, as after a restart
    #[arg(long)]
    in_process: bool,
    /// Internal: run one reopen (`reopen`) or one peer run (`replay`) and print its figures.
    #[arg(long, hide = true)]
    child: Option<String>,
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

fn drop_page_cache() -> Result<(), String> {
    // SAFETY-free: `sync` then the kernel's documented cache-drop knob.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").map_err(|error| format!("--cold: cannot drop caches: {error}"))
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|entry| entry.ok()?.metadata().ok()).map(|meta| meta.len()).sum())
        .unwrap_or(0)
}

fn write_rooms(dir: &std::path::Path, rooms: &[Room], options: &StoreOptions) -> Result<Duration, String> {
    let (mut database, _) = Database::open(dir, options.clone(), &mut |_| {}).map_err(|error| error.to_string())?;
    if database.engine().collection_id("rooms").is_some() {
        return Err(format!("{} already holds a `rooms` collection; choose an empty directory", dir.display()));
    }
    let collection = database.create_collection("rooms", room_schema()).map_err(|error| error.to_string())?;
    let started = Instant::now();
    let mut batch = Batch::new();
    let mut n_written = 0;
    // 100 000 rooms per batch keeps each batch well under `MAX_BATCH_BYTES`.
    for chunk in rooms.chunks(100_000) {
        batch.clear();
        add_rooms(&mut batch, chunk);
        let (returned, result) = database.write(collection, batch, &mut NullSink);
        batch = returned;
        result.map_err(|error| error.to_string())?;
        n_written += chunk.len();
        if rooms.len() >= 200_000 {
            eprintln!("store-bench: wrote {n_written} of {} rooms", rooms.len());
        }
    }
    Ok(started.elapsed())
}

/// Commit latency and group-commit throughput on the written directory: new-message
/// updates (a room's `recency` and preview), one op per batch.
fn commits(dir: &std::path::Path, rooms: &[Room], options: &StoreOptions) -> Result<(), String> {
    let (mut database, _) = Database::open(dir, options.clone(), &mut |_| {}).map_err(|error| error.to_string())?;
    let collection = database.engine().collection_id("rooms").ok_or("no `rooms` collection")?;
    let preview = [b'x'; 200];
    let mut recency = 2_000_000_000u64;
    let mut batch = Batch::new();
    let mut latencies = Vec::new();
    for index in 0..1_000 {
        batch.clear();
        recency += 1;
        batch.upsert(&rooms[index * 7919 % rooms.len()].id).set("recency", Value::U64(recency)).payload(&preview);
        let started = Instant::now();
        let (returned, result) = database.write(collection, batch, &mut NullSink);
        latencies.push(started.elapsed());
        batch = returned;
        result.map_err(|error| error.to_string())?;
    }
    latencies.sort();
    println!(
        "commit, one batch at a time (1 000 single-update batches): median {}, p99 {}",
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 99 / 100])
    );

    let n_updates = 20_000;
    let commits_before = database.store_stats().n_commits;
    let writer = Writer::spawn(database, Box::new(NullSink), 1_024);
    let started = Instant::now();
    let (tickets, pending) = std::sync::mpsc::sync_channel(4_096);
    let waiter = std::thread::spawn(move || -> Result<(), String> {
        for ticket in pending {
            let ticket: ordo_store::WriteTicket = ticket;
            ticket.wait().map_err(|error| error.to_string())?.1.map_err(|error| error.to_string())?;
        }
        Ok(())
    });
    for index in 0..n_updates {
        let mut batch = Batch::new();
        recency += 1;
        batch.upsert(&rooms[index * 104_729 % rooms.len()].id).set("recency", Value::U64(recency)).payload(&preview);
        tickets
            .send(writer.submit(collection, batch).map_err(|error| error.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    drop(tickets);
    waiter.join().map_err(|_| "the waiter panicked")??;
    let elapsed = started.elapsed();
    let database = writer.shutdown().map_err(|error| error.to_string())?;
    let n_commits = database.store_stats().n_commits - commits_before;
    println!(
        "group commit through the Writer ({n_updates} single-update batches submitted without waiting): {:.0} batches/s, \
         {n_commits} commits ({:.1} batches per commit)",
        n_updates as f64 / elapsed.as_secs_f64(),
        n_updates as f64 / n_commits as f64
    );
    Ok(())
}

struct Reopen {
    open: Duration,
    load: Duration,
    window: Duration,
    total: Duration,
    full_index: Duration,
}

fn reopen(dir: &std::path::Path, options: &StoreOptions, n: usize) -> Result<Reopen, String> {
    let started = Instant::now();
    let (mut database, report) =
        Database::open(dir, options.clone(), &mut print_load_progress).map_err(|error| error.to_string())?;
    if report.n_items as usize != n {
        return Err(format!("reopened {} rooms, expected {n}", report.n_items));
    }
    let collection = database.engine().collection_id("rooms").ok_or("no `rooms` collection")?;
    let window_started = Instant::now();
    let window = database
        .open_window(collection, &room_list_def(RoomFilter::NotLeft), 0, 20, &mut NullSink)
        .map_err(|error| error.to_string())?;
    let window_time = window_started.elapsed();
    // Wall time from asking to open until the window is held: the figure the goal is about.
    let total = started.elapsed();
    let index_started = Instant::now();
    database.prepare_window(window).map_err(|error| error.to_string())?;
    let full_index = index_started.elapsed();
    Ok(Reopen { open: report.open_time, load: report.load_time, window: window_time, total, full_index })
}

fn batch_replay(rooms: &[Room]) -> Duration {
    let started = Instant::now();
    let (mut engine, collection) = engine_with_rooms(rooms);
    let window = engine.open_window(collection, &room_list_def(RoomFilter::NotLeft), 0, 20, &mut NullSink).unwrap();
    let elapsed = started.elapsed();
    drop(engine.close_window(window));
    elapsed
}

/// Runs one reopen or one peer run in a child process (this binary, `--child`),
/// so that it starts from a fresh heap as a restarted server does.
fn in_child(args: &Args, dir: &std::path::Path, what: &str) -> Result<Vec<Duration>, String> {
    let mut command = std::process::Command::new(std::env::current_exe().map_err(|error| error.to_string())?);
    command.args(["--child", what, "--n", &args.n.to_string(), "--dir"]).arg(dir);
    if args.relaxed {
        command.arg("--relaxed");
    }
    let output = command.stderr(std::process::Stdio::inherit()).output().map_err(|error| error.to_string())?;
    if !output.status.success() {
        return Err(format!("the {what} child failed: {}", String::from_utf8_lossy(&output.stdout)));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line =
        stdout.lines().find_map(|line| line.strip_prefix("child-figures ")).ok_or("the child printed no figures")?;
    line.split(' ').map(|ns| ns.parse::<u64>().map(Duration::from_nanos).map_err(|error| error.to_string())).collect()
}

fn run_child(args: &Args, what: &str, options: &StoreOptions) -> Result<(), String> {
    let dir = args.dir.as_ref().ok_or("--child needs --dir")?;
    let figures = match what {
        "reopen" => {
            let reopened = reopen(dir, options, args.n)?;
            vec![reopened.open, reopened.load, reopened.window, reopened.total, reopened.full_index]
        }
        "replay" => vec![batch_replay(&generate_rooms(args.n, 1))],
        other => return Err(format!("unknown --child {other}")),
    };
    let figures: Vec<String> = figures.iter().map(|figure| figure.as_nanos().to_string()).collect();
    println!("child-figures {}", figures.join(" "));
    Ok(())
}

fn run(args: Args) -> Result<(), String> {
    let options = StoreOptions {
        durability: if args.relaxed { Durability::Relaxed } else { Durability::Full },
        ..StoreOptions::default()
    };
    if let Some(what) = &args.child {
        return run_child(&args, what, &options);
    }
    let (dir, remove_after) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("ordo-store-bench-{}", std::process::id())), true),
    };
    eprintln!("store-bench: generating {} rooms", args.n);
    let rooms = if args.reopen_only { Vec::new() } else { generate_rooms(args.n, 1) };
    let write_time = if args.reopen_only { Duration::ZERO } else { write_rooms(&dir, &rooms, &options)? };
    if !args.reopen_only {
        println!(
            "write: {} rooms in {} ({:.0} rooms/s), {:.1} MiB in {}",
            args.n,
            ms(write_time),
            args.n as f64 / write_time.as_secs_f64(),
            dir_bytes(&dir) as f64 / (1024.0 * 1024.0),
            dir.display()
        );
    }

    if !args.reopen_only {
        commits(&dir, &rooms, &options)?;
    }
    let (mut opens, mut loads, mut windows, mut indexes, mut totals, mut replays) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..args.runs {
        if args.cold {
            drop_page_cache()?;
        }
        let reopened = if args.in_process {
            reopen(&dir, &options, args.n)?
        } else {
            let figures = in_child(&args, &dir, "reopen")?;
            Reopen { open: figures[0], load: figures[1], window: figures[2], total: figures[3], full_index: figures[4] }
        };
        let total = reopened.total;
        println!(
            "reopen run {}: open {}, load {}, room-list window {}, total {} (full index built after: {})",
            run + 1,
            ms(reopened.open),
            ms(reopened.load),
            ms(reopened.window),
            ms(total),
            ms(reopened.full_index)
        );
        opens.push(reopened.open);
        loads.push(reopened.load);
        windows.push(reopened.window);
        indexes.push(reopened.full_index);
        totals.push(total);
        if args.reopen_only {
            continue;
        }
        let replay = if args.in_process { batch_replay(&rooms) } else { in_child(&args, &dir, "replay")?[0] };
        println!(
            "peer run {}: the same rooms applied as batches to a fresh engine, window open: {}",
            run + 1,
            ms(replay)
        );
        replays.push(replay);
    }
    if args.reopen_only {
        println!("median reopen to room-list window ready: {}", ms(median(&mut totals)));
        return Ok(());
    }
    let (total, replay) = (median(&mut totals), median(&mut replays));
    println!(
        "\nmedians of {} runs, N = {}{}:\n  reopen to room-list window ready: {} (open {}, load {}, window {}); full index {}\n  \
         peer (batches into a fresh engine, no disk): {}\n  ratio peer / reopen: {:.2}",
        args.runs,
        args.n,
        match (args.cold, args.in_process) {
            (true, true) => ", page cache dropped before each reopen, reopens in one process",
            (true, false) => ", page cache dropped before each reopen, each run a fresh process",
            (false, true) => ", page cache warm, reopens in one process",
            (false, false) => ", page cache warm, each run a fresh process",
        },
        ms(total),
        ms(median(&mut opens)),
        ms(median(&mut loads)),
        ms(median(&mut windows)),
        ms(median(&mut indexes)),
        ms(replay),
        replay.as_secs_f64() / total.as_secs_f64()
    );
    if remove_after {
        std::fs::remove_dir_all(&dir).map_err(|error| format!("removing {}: {error}", dir.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("store-bench: {message}");
            ExitCode::FAILURE
        }
    }
}
