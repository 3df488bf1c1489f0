//! A small driver for profiling `shared-rooms` (a new message in a room moves
//! it in every member's list), without the benchmark's peers and set-up in the
//! profile.
//!
//! `cargo run --release -p ordo-core --example shared_rooms_profile -- USERS ROOMS MESSAGES [WAIT]`
//! prints what the memberships take (by part, and the process's resident set)
//! and the mean time per message and per member list. The data mirror
//! `ordo-bench`'s `shared-rooms`: 100 rooms per user drawn by a Zipf law, one
//! shared membership collection (`owner`, `room` a reference, `unread`), each
//! user's top 20 by `room.recency`, messages in uniformly drawn rooms with a new
//! maximum recency and a ~200-byte preview.
//!
//! Building 10 million memberships under valgrind takes long, so with WAIT = 1
//! the driver prints `built` and waits for a line on stdin before the messages:
//! start callgrind with `--instr-atstart=no`, and once `built` shows, run
//! `callgrind_control -i on` and send the line. Only `run_messages` is then
//! measured (`--toggle-collect='*run_messages*'`; per list = total / lists).

use std::time::Instant;

use ordo_core::{Batch, DiffRef, DiffSink, Engine, FieldType, Filter, OwnedValue, Schema, SortKey, Value, ViewDef};
use ordo_core::{CollectionId, WindowId};
use ordo_test_kit::rng::Rng;

const ROOMS_PER_USER: usize = 100;
const WINDOW_LIMIT: usize = 20;

#[derive(Default)]
struct CountingSink {
    n_diffs: usize,
}

impl DiffSink for CountingSink {
    fn diff(&mut self, _window: WindowId, diff: DiffRef<'_>) {
        if let DiffRef::Insert { value, .. } | DiffRef::PushFront { value } | DiffRef::Set { value, .. } = diff {
            std::hint::black_box(value.payload().len());
        }
        self.n_diffs += 1;
    }
}

/// Each user's rooms, Zipf-distributed over a random ranking (weight 1/k for rank k).
fn user_rooms(n_users: usize, n_rooms: usize, rng: &mut Rng) -> Vec<u32> {
    let mut ranking: Vec<u32> = (0..n_rooms as u32).collect();
    for index in (1..n_rooms).rev() {
        ranking.swap(index, rng.below(index + 1));
    }
    let mut total = 0.0;
    let cdf: Vec<f64> = (0..n_rooms)
        .map(|rank| {
            total += 1.0 / (rank as f64 + 1.0);
            total
        })
        .collect();
    let mut rooms = Vec::with_capacity(n_users * ROOMS_PER_USER);
    let mut taken = vec![u32::MAX; n_rooms];
    for user in 0..n_users {
        let mut n_taken = 0;
        while n_taken < ROOMS_PER_USER {
            let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let room = ranking[cdf.partition_point(|&c| c <= draw).min(n_rooms - 1)];
            if taken[room as usize] != user as u32 {
                taken[room as usize] = user as u32;
                rooms.push(room);
                n_taken += 1;
            }
        }
    }
    rooms
}

/// What `build` made: the engine, its two collections, the rooms' ids, each room's member count.
struct Built {
    engine: Engine,
    rooms: CollectionId,
    members: CollectionId,
    room_ids: Vec<String>,
    room_sizes: Vec<usize>,
    /// The users' views (their sorted indexes), summed.
    view_bytes: usize,
}

fn build(n_users: usize, n_rooms: usize, rng: &mut Rng) -> Built {
    let mut engine = Engine::new();
    let mut batch = Batch::new();
    let mut sink = CountingSink::default();
    let rooms_schema = Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64);
    let rooms = engine.create_collection("rooms", rooms_schema).expect("fresh engine");
    let room_ids: Vec<String> = (0..n_rooms).map(|room| format!("!room{room:08}:example.org")).collect();
    let preview = [b'p'; 200];
    for (index, id) in room_ids.iter().enumerate() {
        let name = format!("room {index}");
        batch.upsert(id).set("name", Value::Str(&name)).set("recency", Value::U64(index as u64)).payload(&preview);
    }
    engine.apply_batch(rooms, &batch, &mut sink).expect("valid rooms");
    batch.clear();
    let members_schema = Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("room", FieldType::Ref(rooms))
        .with_field("unread", FieldType::U64);
    let members = engine.create_collection("members", members_schema).expect("fresh name");
    let memberships = user_rooms(n_users, n_rooms, rng);
    let mut room_sizes = vec![0; n_rooms];
    for (user, rooms_of_user) in memberships.chunks(ROOMS_PER_USER).enumerate() {
        if user % 1_000 == 0 && user > 0 {
            engine.apply_batch(members, &batch, &mut sink).expect("valid memberships");
            batch.clear();
        }
        let owner = format!("u{user:07}");
        for &room in rooms_of_user {
            room_sizes[room as usize] += 1;
            batch
                .upsert(&format!("{owner}/r{room:07}"))
                .set("owner", Value::Str(&owner))
                .set("room", Value::Str(&room_ids[room as usize]))
                .set("unread", Value::U64(0));
        }
    }
    engine.apply_batch(members, &batch, &mut sink).expect("valid memberships");
    let mut view_bytes = 0;
    for user in 0..n_users {
        let def = ViewDef::new(
            Filter::eq("owner", OwnedValue::Str(format!("u{user:07}"))),
            vec![SortKey::desc("room.recency")],
        );
        let window = engine.open_window(members, &def, 0, WINDOW_LIMIT, &mut sink).expect("valid view");
        engine.prepare_window(window).expect("open window");
        view_bytes += engine.view_heap_bytes(window).expect("open window");
    }
    Built { engine, rooms, members, room_ids, room_sizes, view_bytes }
}

/// Prints the engine's own count of the membership collection's bytes by part
/// (capacities, so growth slack included), then what the process holds resident.
fn print_memory(built: &Built, n_memberships: usize) {
    let (engine, members) = (&built.engine, built.members);
    let per = |bytes: usize| bytes as f64 / n_memberships as f64;
    let collection = engine.collection(members).expect("the members");
    for (part, bytes) in collection.heap_parts() {
        eprintln!("  {part}: {:.1} B per membership", per(bytes));
    }
    eprintln!(
        "  reverse index: {:.1} B, equality index (owner): {:.1} B, views: {:.1} B per membership",
        per(engine.reference_heap_bytes(members)),
        per(engine.equality_index_heap_bytes(members)),
        per(built.view_bytes),
    );
    let resident_kib = std::fs::read_to_string("/proc/self/status").ok().and_then(|status| {
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse::<usize>().ok()
    });
    if let Some(kib) = resident_kib {
        eprintln!("  resident set of the process: {:.1} B per membership", per(kib * 1024));
    }
}

/// The messages counted (callgrind: `--toggle-collect='*run_messages*'`).
#[inline(never)]
fn run_messages(engine: &mut Engine, rooms: CollectionId, room_ids: &[String], messages: &[(usize, u64)]) -> usize {
    let mut batch = Batch::new();
    let mut sink = CountingSink::default();
    let preview = [b'm'; 200];
    for &(room, recency) in messages {
        batch.clear();
        batch.upsert(&room_ids[room]).set("recency", Value::U64(recency)).payload(&preview);
        engine.apply_batch(rooms, &batch, &mut sink).expect("valid message");
    }
    sink.n_diffs
}

/// The calling thread's CPU time (user + system) from `/proc/thread-self/stat`
/// (Linux, in clock ticks of 10 ms): on a machine shared with other work, wall
/// time counts the time other processes ran.
fn thread_cpu_ns() -> Option<u64> {
    const NS_PER_TICK: u64 = 10_000_000;
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces, so split after its ')').
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let (user, system): (u64, u64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    Some((user + system) * NS_PER_TICK)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|arg| arg.parse().expect("numbers")).collect();
    let n_users = args.first().copied().unwrap_or(10_000);
    let n_rooms = args.get(1).copied().unwrap_or(1_000);
    let n_messages = args.get(2).copied().unwrap_or(300);
    let wait = args.get(3).copied().unwrap_or(0) == 1;
    let mut rng = Rng(7);
    let start = Instant::now();
    let built = build(n_users, n_rooms, &mut rng);
    eprintln!("built in {:.1} s", start.elapsed().as_secs_f64());
    print_memory(&built, n_users * ROOMS_PER_USER);
    let Built { mut engine, rooms, room_ids, room_sizes, .. } = built;
    let mut recency = n_rooms as u64;
    let mut draw = |count: usize| -> Vec<(usize, u64)> {
        (0..count)
            .map(|_| {
                recency += 1;
                (rng.below(n_rooms), recency)
            })
            .collect()
    };
    let warmup = draw(20);
    let messages = draw(n_messages);
    run_messages(&mut engine, rooms, &room_ids, &warmup);
    if wait {
        println!("built");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).expect("a line on stdin");
    }
    let n_lists: usize = messages.iter().map(|&(room, _)| room_sizes[room]).sum();
    let (start, cpu_start) = (Instant::now(), thread_cpu_ns());
    let n_diffs = run_messages(&mut engine, rooms, &room_ids, &messages);
    let elapsed = start.elapsed().as_nanos() as f64;
    let cpu = thread_cpu_ns().zip(cpu_start).map(|(end, start)| (end - start) as f64);
    println!(
        "{n_users} users, {n_rooms} rooms: {n_messages} messages, {:.1} µs per message, {:.0} ns per list \
         (on the CPU: {}), {:.1} lists and {:.1} diffs per message",
        elapsed / n_messages as f64 / 1_000.0,
        elapsed / n_lists as f64,
        cpu.map_or("unknown".to_owned(), |cpu| format!("{:.0} ns per list", cpu / n_lists as f64)),
        n_lists as f64 / n_messages as f64,
        n_diffs as f64 / n_messages as f64,
    );
}
