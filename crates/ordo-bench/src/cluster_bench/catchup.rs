//! `--phase catchup` (a new node replays the stream) and `--phase apply` (the store's apply ceiling).

use std::time::{Duration, Instant};

use super::procs::{create_collection, temp_dir, write_body, Http, Nats, Ordo, Sync};
use super::{median, Options};
use crate::live::Result;

/// Fills the stream through `node` as fast as `connections` writers go;
/// returns the entries written and the last stream message (the node packs
/// the entries of writes that arrive together into one message).
pub fn fill(node: &Ordo, entries: u64, connections: usize) -> Result<(u64, u64)> {
    let port = node.port;
    let per_thread = entries.div_ceil(connections as u64);
    let threads: Vec<_> = (0..connections as u64)
        .map(|thread| {
            std::thread::spawn(move || -> Result<()> {
                let mut http = Http::connect(port)?;
                for i in 0..per_thread {
                    let (status, body) =
                        http.request("POST", "/v1/collections/rooms/batch", &write_body(thread * per_thread + i))?;
                    if status != 200 {
                        return Err(format!("a write answered {status}: {body}").into());
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a writer thread panicked")??;
    }
    Ok((per_thread * connections as u64, node.applied_stream_seq()?))
}

pub fn catchup_phase(options: &Options) -> Result<()> {
    println!("\n== catch-up of a new node: {} entries (one upsert each) ==", options.catchup_entries);
    let nats = Nats::start(&options.nats_bin, options.nats_nodes, Sync::Default)?;
    let node_a = Ordo::start(&options.ordo_bin, "node-a", Some((&nats, options.nats_nodes)), &[])?;
    create_collection(node_a.port)?;
    let filled = Instant::now();
    let (entries, target) = fill(&node_a, options.catchup_entries, options.connections.max(16))?;
    let fill_seconds = filled.elapsed().as_secs_f64();
    println!(
        "filled: {entries} entries in {target} stream messages through node-a in {fill_seconds:.1} s ({:.0} \
         entries/s: the write path's throughput with {} connections)",
        entries as f64 / fill_seconds,
        options.connections.max(16)
    );
    let (mut from_start, mut while_applying, mut cpu_per_100k) = (Vec::new(), Vec::new(), Vec::new());
    for n in 1..=options.catchup_nodes {
        let caught_up = catch_up_once(options, &nats, n, target, entries)?;
        from_start.push(caught_up.from_start);
        while_applying.extend(caught_up.while_applying);
        cpu_per_100k.push(caught_up.cpu_seconds * 100_000.0 / entries as f64);
    }
    println!(
        "median of {} new nodes: {:.0} entries/s from process start, {:.0} entries/s while applying, {:.3} CPU-s \
         per 100 000 entries (goal: 200 000/s)",
        options.catchup_nodes,
        median(&mut from_start),
        median(&mut while_applying),
        median(&mut cpu_per_100k)
    );
    println!("node-a pid {}", node_a.process.pid());
    Ok(())
}

struct CaughtUp {
    from_start: f64,
    while_applying: Option<f64>,
    cpu_seconds: f64,
}

/// Starts new node `n` with an empty data directory and waits until it applied
/// the stream up to message `target` (`entries` in all); prints its rates (in
/// entries, the messages applied scaled by the entries per message) and its
/// CPU time by thread.
fn catch_up_once(options: &Options, nats: &Nats, n: usize, target: u64, entries: u64) -> Result<CaughtUp> {
    let entries_per_message = entries as f64 / target.max(1) as f64;
    let wrap: Vec<String> = options
        .catchup_wrap
        .as_deref()
        .map(|wrap| wrap.split_whitespace().map(|word| word.replace("{n}", &n.to_string())).collect())
        .unwrap_or_default();
    let name = format!("node-b{n}");
    let spawned = Instant::now();
    let node_b = Ordo::start_wrapped(&wrap, &options.ordo_bin, &name, Some((nats, options.nats_nodes)), &[])?;
    let listening = spawned.elapsed();
    let at_listening = node_b.applied_stream_seq()?;
    let mut first_progress: Option<(Instant, u64)> = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        let applied = node_b.applied_stream_seq()?;
        if first_progress.is_none() && applied > at_listening {
            first_progress = Some((Instant::now(), applied));
        }
        if applied >= target {
            break Instant::now();
        }
        if Instant::now() > deadline {
            return Err(format!("{name} applied {applied} of {target} stream messages in 600 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Read at once: the node idles from here on.
    let pid = if wrap.is_empty() { node_b.process.pid() } else { child_of(node_b.process.pid())? };
    let (cpu_seconds, by_thread) = cpu_of(pid)?;
    let total = done - spawned;
    let from_start = entries as f64 / total.as_secs_f64();
    println!(
        "{name}: listening after {:.2} s (applied {at_listening} messages by then), all {entries} entries applied \
         {:.2} s after start: {from_start:.0} entries/s from process start",
        listening.as_secs_f64(),
        total.as_secs_f64(),
    );
    let while_applying = first_progress.map(|(at, applied)| {
        let rate = (target - applied) as f64 * entries_per_message / (done - at).as_secs_f64().max(1e-3);
        println!("{name}: {rate:.0} entries/s while applying (from the first progress seen by /v1/health)");
        rate
    });
    let per_100k = |seconds: f64| seconds * 100_000.0 / entries as f64;
    let threads: Vec<String> =
        by_thread.iter().map(|(thread, seconds)| format!("{thread} {:.3}", per_100k(*seconds))).collect();
    println!(
        "{name}: {:.3} CPU-s per 100 000 entries from process start (by thread: {})",
        per_100k(cpu_seconds),
        threads.join(", ")
    );
    Ok(CaughtUp { from_start, while_applying, cpu_seconds })
}

/// The first child of `pid` (the node a wrapper such as `perf record` started),
/// or `pid` itself when it has none (a wrapper that `exec`s the node).
fn child_of(pid: u32) -> Result<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(children.split_whitespace().next().map_or(Ok(pid), str::parse)?)
}

/// User + system CPU seconds of `pid` (every thread, live or exited) and of its
/// live threads by name (`/proc/<pid>/task/*/stat`), the busiest first.
fn cpu_of(pid: u32) -> Result<(f64, Vec<(String, f64)>)> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let read = |path: String| -> Result<(String, f64)> {
        let stat = std::fs::read_to_string(path)?;
        let open = stat.find('(').ok_or("no ( in stat")?;
        let close = stat.rfind(')').ok_or("no ) in stat")?;
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields 14 and 15 of proc(5) (utime, stime); `fields` starts at field 3.
        let utime: f64 = fields.get(11).ok_or("short stat")?.parse()?;
        let stime: f64 = fields.get(12).ok_or("short stat")?.parse()?;
        Ok((stat[open + 1..close].to_owned(), (utime + stime) / ticks))
    };
    let (_, total) = read(format!("/proc/{pid}/stat"))?;
    let mut by_thread: Vec<(String, f64)> = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let (name, seconds) = read(format!("{}/stat", task?.path().display()))?;
        match by_thread.iter_mut().find(|(known, _)| *known == name) {
            Some((_, sum)) => *sum += seconds,
            None => by_thread.push((name, seconds)),
        }
    }
    let live: f64 = by_thread.iter().map(|(_, seconds)| seconds).sum();
    by_thread.push(("exited threads".to_owned(), (total - live).max(0.0)));
    by_thread.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((total, by_thread))
}

/// The apply side's ceiling, without NATS: `entries` one-upsert batches into a
/// store with the cluster's durability (relaxed: the stream is the durable
/// copy), one `Database::write` (one log append, one group) per entry against
/// `write_group` of `group` entries. A catching-up node's writer can do no
/// better than this; the gap between the two says what batching entries per
/// writer command and per group commit is worth.
pub fn apply_phase(options: &Options) -> Result<()> {
    use ordo_core::{Batch, FieldType, NullSink, Schema, Value};
    use ordo_store::{Database, Durability, PendingWrite, StoreOptions};
    let entries = options.catchup_entries;
    println!("\n== apply ceiling (store only, relaxed durability): {entries} one-upsert entries ==");
    let run = |group: usize| -> Result<f64> {
        let dir = temp_dir(&format!("apply-{group}"));
        let store_options = StoreOptions { durability: Durability::Relaxed, ..StoreOptions::default() };
        let (mut database, _) = Database::open(&dir, store_options, &mut |_| {})?;
        let schema = Schema::new().with_field("recency", FieldType::U64).with_field("name", FieldType::String);
        let rooms = database.create_collection("rooms", schema)?;
        let mut pending: Vec<PendingWrite> = (0..group).map(|_| PendingWrite::new(rooms, Batch::new())).collect();
        let names: Vec<String> = (0..10_000).map(|i| format!("room {i}")).collect();
        let ids: Vec<String> = (0..10_000).map(|i| format!("r{i}")).collect();
        let started = Instant::now();
        let mut n = 0u64;
        while n < entries {
            let n_now = (group as u64).min(entries - n) as usize;
            for (k, write) in pending[..n_now].iter_mut().enumerate() {
                let i = (n as usize + k) % 10_000;
                write.batch.clear();
                write.batch.upsert(&ids[i]).set("recency", Value::U64(n + k as u64)).set("name", Value::Str(&names[i]));
                write.result = None;
            }
            database.write_group(&mut pending[..n_now], &mut NullSink);
            for write in &mut pending[..n_now] {
                write.result.take().ok_or("no result")??;
            }
            n += n_now as u64;
        }
        let seconds = started.elapsed().as_secs_f64();
        drop(database);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(entries as f64 / seconds)
    };
    for _ in 0..options.runs {
        let (one, grouped) = (run(1)?, run(256)?);
        println!(
            "one entry per group commit: {one:.0} entries/s | 256 per group commit: {grouped:.0} entries/s ({:.1}x) \
             (goal for catch-up: 200 000/s)",
            grouped / one
        );
    }
    Ok(())
}
