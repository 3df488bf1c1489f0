//! What a server's window digest costs the update path: the same new-message
//! updates (one room of a 20-row room list moved to the top, its payload
//! replaced) delivered to a sink that only reads the diffs, and to one that also
//! asks for the window's contents after each change and hashes each row's id and
//! version with 64-bit FNV-1a (as `ordo-server`'s `digest` does). Rounds of the
//! two alternate in one process, so both see the same machine.
//!
//! `cargo run --release -p ordo-core --example window_contents_cost -- N_ROOMS UPDATES ROUNDS`
//! prints the mean time per update of each round and the medians. With
//! `READ_ONLY=1` the second sink reads the contents without hashing them, which
//! splits the cost between reading the window and hashing it.

use std::time::Instant;

use ordo_core::{
    Batch, CollectionId, DiffRef, DiffSink, Engine, FieldType, Filter, ItemList, OwnedValue, Schema, SortKey, Value,
    ViewDef, WindowId,
};
use ordo_test_kit::rng::Rng;

/// Reads each diff's item, as an encoder would; optionally hashes the window after it.
struct Sink {
    hashes_contents: bool,
    digest: u64,
}

impl DiffSink for Sink {
    fn diff(&mut self, _window: WindowId, diff: DiffRef<'_>) {
        if let DiffRef::Insert { value, .. } | DiffRef::PushFront { value } | DiffRef::Set { value, .. } = diff {
            std::hint::black_box(value.payload().len());
        }
    }

    fn wants_contents(&mut self, _window: WindowId, _limit: usize) -> bool {
        self.hashes_contents
    }

    fn window_contents(&mut self, _window: WindowId, items: ItemList<'_>) {
        if std::env::var_os("READ_ONLY").is_some() {
            for item in items.iter() {
                std::hint::black_box((item.id().len(), item.version()));
            }
            return;
        }
        let mut state = 0xcbf2_9ce4_8422_2325u64;
        for (position, item) in items.iter().enumerate() {
            state = fnv1a(state, &(position as u32).to_le_bytes());
            state = fnv1a(state, &(item.id().len() as u32).to_le_bytes());
            state = fnv1a(state, item.id().as_bytes());
            state = fnv1a(state, &item.version().to_le_bytes());
        }
        self.digest = std::hint::black_box(state);
    }
}

/// 64-bit FNV-1a, the state kept in a register across the bytes.
#[inline(always)]
fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state = (state ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
    }
    state
}

fn rooms(n_rooms: usize, rng: &mut Rng) -> (Engine, CollectionId, Vec<String>) {
    let schema = Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("left", FieldType::Bool);
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", schema).expect("fresh engine");
    let ids: Vec<String> = (0..n_rooms).map(|i| format!("!room{i:08}:example.org")).collect();
    let mut batch = Batch::new();
    for id in &ids {
        let name: String = (0..12 + rng.below_u64(9)).map(|_| (b'a' + rng.below_u64(26) as u8) as char).collect();
        batch
            .upsert(id)
            .set("name", Value::Str(&name))
            .set("recency", Value::U64(1 + rng.below_u64(1_000_000_000)))
            .set("left", Value::Bool(false));
    }
    engine.apply_batch(collection, &batch, &mut Sink { hashes_contents: false, digest: 0 }).expect("valid rooms");
    (engine, collection, ids)
}

/// Mean nanoseconds per update over `n_updates` updates delivered to `sink`.
fn round(
    engine: &mut Engine,
    collection: CollectionId,
    ids: &[String],
    recency: &mut u64,
    rng: &mut Rng,
    n_updates: usize,
    sink: &mut Sink,
) -> f64 {
    let payload = [b'p'; 200];
    let mut batch = Batch::new();
    let start = Instant::now();
    for _ in 0..n_updates {
        *recency += 1;
        batch.clear();
        let id = &ids[rng.below_u64(ids.len() as u64) as usize];
        batch.upsert(id).set("recency", Value::U64(*recency)).payload(&payload);
        engine.apply_batch(collection, &batch, sink).expect("valid update");
    }
    start.elapsed().as_nanos() as f64 / n_updates as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|arg| arg.parse().expect("numbers")).collect();
    let n_rooms = args.first().copied().unwrap_or(1_000);
    let n_updates = args.get(1).copied().unwrap_or(200_000);
    let n_rounds = args.get(2).copied().unwrap_or(5);
    let mut rng = Rng(1);
    let (mut engine, collection, ids) = rooms(n_rooms, &mut rng);
    let def =
        ViewDef::new(Filter::eq("left", OwnedValue::Bool(false)), vec![SortKey::desc("recency"), SortKey::asc("name")]);
    let mut plain = Sink { hashes_contents: false, digest: 0 };
    let mut hashing = Sink { hashes_contents: true, digest: 0 };
    engine.open_window(collection, &def, 0, 20, &mut plain).expect("a window");
    let mut recency = 2_000_000_000;
    round(&mut engine, collection, &ids, &mut recency, &mut rng, n_updates, &mut plain);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for index in 0..n_rounds {
        let a = round(&mut engine, collection, &ids, &mut recency, &mut rng, n_updates, &mut plain);
        let b = round(&mut engine, collection, &ids, &mut recency, &mut rng, n_updates, &mut hashing);
        println!("round {index}: without contents {a:.0} ns/update, with contents and digest {b:.0} ns/update");
        without.push(a);
        with.push(b);
    }
    let (without, with) = (median(&mut without), median(&mut with));
    println!(
        "median: without {without:.0} ns, with {with:.0} ns, digest adds {:.0} ns per window change",
        with - without
    );
}
