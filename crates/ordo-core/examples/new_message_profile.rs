//! A small driver for profiling the new-message path (one room's `recency` set
//! to a new maximum, its preview replaced, the room-list window's diffs
//! drained), without the benchmark's peers and set-up in the profile.
//!
//! `cargo run --release -p ordo-core --example new_message_profile -- N UPDATES [WARMUP]`
//! prints the mean time per update. Under callgrind, count only the updates:
//! `valgrind --tool=callgrind --toggle-collect='*run_updates*' target/release/examples/new_message_profile 1000 20000`
//! (instructions per update = the total divided by UPDATES).
//!
//! The data mirror `ordo-bench`'s rooms: names of 12–20 letters, distinct
//! recencies, 4 local rooms, 5 % left, previews of ~200 bytes; the view is
//! the room list (`left == false`; `is_local` desc, `recency` desc, `name`).

use std::time::Instant;

use ordo_core::{Batch, DiffRef, DiffSink, Engine, FieldType, Filter, OwnedValue, Schema, SortKey, Value, ViewDef};
use ordo_core::{CollectionId, WindowId};
use ordo_test_kit::rng::Rng;

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

struct Update {
    room: usize,
    recency: u64,
    payload: usize,
}

/// The updates counted (callgrind: `--toggle-collect='*run_updates*'`).
#[inline(never)]
fn run_updates(
    engine: &mut Engine,
    collection: CollectionId,
    ids: &[String],
    updates: &[Update],
    payloads: &[Vec<u8>],
    batch: &mut Batch,
    sink: &mut CountingSink,
) {
    apply_updates(engine, collection, ids, updates, payloads, batch, sink);
}

/// The warm-up, kept apart so that a profile can leave it out. Its body must
/// differ from `run_updates`'s: two identical functions are folded into one
/// symbol by the optimiser, and a profile toggled on `run_updates` would then
/// count the warm-up too.
#[inline(never)]
fn warm_up(
    engine: &mut Engine,
    collection: CollectionId,
    ids: &[String],
    updates: &[Update],
    payloads: &[Vec<u8>],
    batch: &mut Batch,
    sink: &mut CountingSink,
) {
    std::hint::black_box("warm-up");
    apply_updates(engine, collection, ids, updates, payloads, batch, sink);
}

#[inline(always)]
fn apply_updates(
    engine: &mut Engine,
    collection: CollectionId,
    ids: &[String],
    updates: &[Update],
    payloads: &[Vec<u8>],
    batch: &mut Batch,
    sink: &mut CountingSink,
) {
    for update in updates {
        batch.clear();
        batch.upsert(&ids[update.room]).set("recency", Value::U64(update.recency)).payload(&payloads[update.payload]);
        engine.apply_batch(collection, batch, sink).expect("valid update");
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|arg| arg.parse().expect("numbers")).collect();
    let n = args.first().copied().unwrap_or(1000);
    let n_updates = args.get(1).copied().unwrap_or(20_000);
    let n_warmup = args.get(2).copied().unwrap_or(n.min(100_000));
    let mut rng = Rng(1);
    let schema = Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("is_local", FieldType::Bool)
        .with_field("left", FieldType::Bool)
        .with_field("unread", FieldType::U64);
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", schema).expect("fresh engine");
    let ids: Vec<String> = (0..n).map(|i| format!("!room{i:08}:example.org")).collect();
    let payloads: Vec<Vec<u8>> =
        (0..64).map(|_| (0..180 + rng.below_u64(41)).map(|_| b'a' + rng.below_u64(26) as u8).collect()).collect();
    let mut left = vec![false; n];
    let mut batch = Batch::new();
    for chunk_start in (0..n).step_by(100_000) {
        batch.clear();
        for i in chunk_start..(chunk_start + 100_000).min(n) {
            let name: String = (0..12 + rng.below_u64(9)).map(|_| (b'a' + rng.below_u64(26) as u8) as char).collect();
            left[i] = i >= 4 && rng.below_u64(20) == 0;
            batch
                .upsert(&ids[i])
                .set("name", Value::Str(&name))
                .set("recency", Value::U64(1 + rng.below_u64(1_000_000_000)))
                .set("is_local", Value::Bool(i < 4))
                .set("left", Value::Bool(left[i]))
                .set("unread", Value::U64(rng.below_u64(3)))
                .payload(&payloads[rng.below_u64(64) as usize]);
        }
        engine.apply_batch(collection, &batch, &mut CountingSink::default()).expect("valid rooms");
    }
    let def = ViewDef::new(
        Filter::eq("left", OwnedValue::Bool(false)),
        vec![SortKey::desc("is_local"), SortKey::desc("recency"), SortKey::asc("name")],
    );
    let mut sink = CountingSink::default();
    let window = engine.open_window(collection, &def, 0, 20, &mut sink).expect("valid view");
    engine.prepare_window(window).expect("open window");
    let live: Vec<usize> = (0..n).filter(|&i| !left[i]).collect();
    let mut recency = 1_000_000_000;
    let mut make = |count: usize, rng: &mut Rng| -> Vec<Update> {
        (0..count)
            .map(|_| {
                recency += 1;
                let room = live[rng.below_u64(live.len() as u64) as usize];
                Update { room, recency, payload: rng.below_u64(64) as usize }
            })
            .collect()
    };
    let warmup = make(n_warmup, &mut rng);
    let updates = make(n_updates, &mut rng);
    warm_up(&mut engine, collection, &ids, &warmup, &payloads, &mut batch, &mut sink);
    sink.n_diffs = 0;
    let start = Instant::now();
    run_updates(&mut engine, collection, &ids, &updates, &payloads, &mut batch, &mut sink);
    let elapsed = start.elapsed();
    println!(
        "n {n}: {n_updates} updates, {:.1} ns per update (mean), {:.3} diffs per update",
        elapsed.as_nanos() as f64 / n_updates as f64,
        sink.n_diffs as f64 / n_updates as f64
    );
}
