//! Crash test. A child process (this same binary, with `ORDO_CRASH_CHILD_DIR` set)
//! runs a seeded sequence of steps through a `Writer` as fast as it can, printing
//! `ack <k>` once step `k` is acknowledged. Most steps are random batches; one in
//! ten writes a second collection, `evolving`, and one in ten changes its schema:
//! a field added (with a default every item takes), that field removed, or the
//! collection dropped (and created again, empty). Every step takes one sequence
//! number. The parent kills the child with `SIGKILL` at a random moment, reopens
//! the data directory and checks that:
//! - every acknowledged step is present: the sequence number covers it;
//! - no step is partially present: the contents of both collections, and the
//!   schema of `evolving`, equal the reference model after exactly the committed
//!   steps (a schema change is there whole, with every item under it, or not at all);
//! - the committed state never goes backwards from one kill to the next.
//!
//! `ORDO_CRASH_KILLS` sets the number of kills (default 50), `ORDO_CRASH_SEED` the seed.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_engine_matches, fill_batch, random_ops, test_schema, GenOp, Model, Rng};
use ordo_core::{Batch, CollectionId, FieldType, NullSink, OwnedItem, OwnedValue, Schema, Value};
use ordo_store::{Database, StoreOptions, Writer};

const COLLECTION: &str = "crash";
/// The collection whose schema changes, and which is dropped and created again.
const EVOLVING: &str = "evolving";
/// The field `EVOLVING` gains and loses.
const EXTRA: &str = "extra";
/// Holds the number of steps committed so far in its `recency` field; every
/// batch of `COLLECTION` rewrites it, in the same transaction as the rest of the batch.
const PROGRESS_ID: &str = "progress";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn evolving_base_schema() -> Schema {
    Schema::new().with_field("name", FieldType::String).with_field("n", FieldType::U64)
}

/// What step `k` (0-based) does: a function of `k` only.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Batch,
    EvolvingBatch,
    AddExtra,
    RemoveExtra,
    DropEvolving,
}

fn step_kind(k: u64) -> Step {
    match (k % 10, (k / 10) % 3) {
        (3 | 7, _) => Step::EvolvingBatch,
        (5, 0) => Step::AddExtra,
        (5, 1) => Step::RemoveExtra,
        (5, _) => Step::DropEvolving,
        _ => Step::Batch,
    }
}

/// Whether `EVOLVING` has `EXTRA` when step `k` runs (it is added at steps
/// `k % 30 == 5` and removed at `k % 30 == 15`).
fn has_extra(k: u64) -> bool {
    (6..=15).contains(&(k % 30))
}

/// The default `EXTRA` gets when step `k` adds it (sometimes none).
fn extra_default(k: u64) -> OwnedValue {
    if k % 60 == 35 {
        OwnedValue::Null
    } else {
        OwnedValue::U64(k)
    }
}

/// The operations of batch step `k` on `COLLECTION`.
fn batch_ops(seed: u64, k: u64) -> Vec<GenOp> {
    let mut rng = Rng::new(seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut ops = random_ops(&mut rng, "r", 200, 24);
    ops.push(GenOp::Upsert {
        id: PROGRESS_ID.to_owned(),
        fields: vec![("recency", OwnedValue::U64(k + 1))],
        payload: None,
    });
    ops
}

/// The operations of step `k` on `EVOLVING` (which has `EXTRA` or not, by `k`).
fn evolving_ops(seed: u64, k: u64) -> Vec<GenOp> {
    let mut rng = Rng::new(seed ^ k.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xE7);
    (0..1 + rng.below(8))
        .map(|_| {
            let id = format!("e{}", rng.below(30));
            if rng.chance(15) {
                return GenOp::Remove { id };
            }
            let mut fields = vec![("n", OwnedValue::U64(rng.below(100) as u64))];
            if rng.chance(50) {
                fields.push(("name", OwnedValue::Str(format!("name {}", rng.below(10)))));
            }
            if has_extra(k) && rng.chance(50) {
                fields.push((EXTRA, OwnedValue::U64(rng.below(1000) as u64)));
            }
            GenOp::Upsert { id, fields, payload: rng.chance(50).then(|| vec![rng.below(256) as u8; 3]) }
        })
        .collect()
}

/// The reference of `EVOLVING`: its schema and items (`None`: dropped, not yet
/// created again; it then exists at most empty with its base schema).
struct EvolvingModel {
    state: Option<(Schema, Model)>,
}

impl EvolvingModel {
    fn apply(&mut self, seed: u64, k: u64) {
        let (schema, model) = self.state.get_or_insert_with(|| (evolving_base_schema(), Model::default()));
        match step_kind(k) {
            Step::Batch => unreachable!("not a step of this collection"),
            Step::EvolvingBatch => model.apply(schema, &evolving_ops(seed, k)),
            Step::AddExtra => {
                *schema = schema.clone().with_field(EXTRA, FieldType::U64);
                for item in model.items.values_mut() {
                    item.fields.push(extra_default(k));
                }
            }
            Step::RemoveExtra => {
                let index = schema.field_id(EXTRA).expect("added before").index();
                *schema = evolving_base_schema();
                for item in model.items.values_mut() {
                    item.fields.remove(index);
                }
            }
            Step::DropEvolving => self.state = None,
        }
    }

    fn check(&self, database: &Database, context: &str) {
        let engine = database.engine();
        let found = engine.collection_id(EVOLVING).map(|id| engine.collection(id).unwrap());
        match (&self.state, found) {
            (None, None) => {}
            (None, Some(collection)) => {
                assert_eq!(collection.schema(), &evolving_base_schema(), "{context}: re-created `{EVOLVING}`");
                assert!(collection.is_empty(), "{context}: a dropped collection's items came back");
            }
            (Some((schema, model)), Some(collection)) => {
                assert_eq!(collection.schema(), schema, "{context}: schema of `{EVOLVING}`");
                let items: BTreeMap<String, OwnedItem> =
                    collection.items().map(|item| (item.id().to_owned(), item.to_owned_item())).collect();
                assert_eq!(&items, &model.items, "{context}: items of `{EVOLVING}` under its schema");
            }
            (Some(_), None) => panic!("{context}: `{EVOLVING}` is missing"),
        }
    }
}

fn committed_count(database: &Database) -> u64 {
    let engine = database.engine();
    let Some(collection) = engine.collection_id(COLLECTION) else { return 0 };
    match engine.collection(collection).unwrap().get(PROGRESS_ID) {
        Some(item) => match item.field_by_name("recency") {
            Some(Value::U64(count)) => count,
            other => panic!("the progress item has no count: {other:?}"),
        },
        None => 0,
    }
}

fn ensure_collection(database: &mut Database, name: &str, schema: Schema) -> CollectionId {
    match database.engine().collection_id(name) {
        Some(collection) => collection,
        None => database.create_collection(name, schema).expect("child: create collection"),
    }
}

enum Acked {
    Batch(u64, ordo_store::WriteTicket),
    Done(u64),
}

fn child(dir: &Path, seed: u64) {
    // Every other child checkpoints every few ms, so that kills also land inside
    // LMDB checkpoints and log segment removals, not only between them.
    let checkpoint_interval = Duration::from_millis(env_u64("ORDO_CRASH_CHECKPOINT_MS", 5000));
    let options = StoreOptions { checkpoint_interval, log_segment_bytes: 64 * 1024, ..StoreOptions::default() };
    let (mut database, _) = Database::open(dir, options, &mut |_| {}).expect("child: open");
    let collection = ensure_collection(&mut database, COLLECTION, test_schema());
    let mut evolving = ensure_collection(&mut database, EVOLVING, evolving_base_schema());
    // Every step takes one sequence number, so the next step is the sequence.
    let first = database.last_seq();
    let writer = Writer::spawn(database, Box::new(NullSink), 32);
    let (tickets, pending) = std::sync::mpsc::sync_channel::<Acked>(64);
    let acker = std::thread::spawn(move || {
        let mut stdout = std::io::stdout().lock();
        for acked in pending {
            let (k, seq) = match acked {
                Acked::Batch(k, ticket) => {
                    let (_, result) = ticket.wait().expect("child: writer alive");
                    (k, result.expect("child: generated batches are valid").seq)
                }
                Acked::Done(k) => (k, k + 1),
            };
            assert_eq!(seq, k + 1, "child: step {k} got sequence number {seq}");
            writeln!(stdout, "ack {k} {seq}").unwrap();
            stdout.flush().unwrap();
        }
    });
    // Runs until killed; the bound only stops a child whose parent died.
    for k in first..first + 1_000_000 {
        let mut batch = Batch::new();
        match step_kind(k) {
            Step::Batch => {
                fill_batch(&mut batch, &batch_ops(seed, k));
                let ticket = writer.submit(collection, batch).expect("child: writer alive");
                tickets.send(Acked::Batch(k, ticket)).unwrap();
            }
            Step::EvolvingBatch => {
                fill_batch(&mut batch, &evolving_ops(seed, k));
                let ticket = writer.submit(evolving, batch).expect("child: writer alive");
                tickets.send(Acked::Batch(k, ticket)).unwrap();
            }
            step => {
                // Runs after every batch queued before it, as the step order says.
                evolving = writer
                    .run(move |database, sink| {
                        let seq = match step {
                            Step::AddExtra => {
                                database.add_field(evolving, EXTRA, FieldType::U64, &extra_default(k), sink)
                            }
                            Step::RemoveExtra => database.remove_field(evolving, EXTRA, sink).map(|(seq, _)| seq),
                            _ => database.drop_collection(evolving).map(|(seq, _)| seq),
                        };
                        assert_eq!(seq.expect("child: schema change"), k + 1);
                        ensure_collection(database, EVOLVING, evolving_base_schema())
                    })
                    .expect("child: writer alive");
                tickets.send(Acked::Done(k)).unwrap();
            }
        }
    }
    drop(tickets);
    acker.join().unwrap();
}
struct KillOutcome {
    max_acked: Option<u64>,
    n_acked: u64,
}

fn run_child_and_kill(dir: &Path, seed: u64, delay: Duration, checkpoint_ms: u64) -> KillOutcome {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("ORDO_CRASH_CHECKPOINT_MS", checkpoint_ms.to_string())
        .env("ORDO_CRASH_CHILD_DIR", dir)
        .env("ORDO_CRASH_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the writer child");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut max_acked, mut n_acked) = (None, 0);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut words = line.split(' ');
            assert_eq!(words.next(), Some("ack"), "unexpected child output: {line}");
            let k: u64 = words.next().unwrap().parse().unwrap();
            max_acked = Some(max_acked.map_or(k, |max: u64| max.max(k)));
            n_acked += 1;
        }
        KillOutcome { max_acked, n_acked }
    });
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the child");
    child.wait().unwrap();
    reader.join().unwrap()
}

fn parent() {
    let n_kills = env_u64("ORDO_CRASH_KILLS", 50);
    let seed = env_u64("ORDO_CRASH_SEED", 7);
    let dir = tempfile::tempdir().unwrap();
    let schema = test_schema();
    let mut model = Model::default();
    let mut evolving = EvolvingModel { state: Some((evolving_base_schema(), Model::default())) };
    let mut n_modelled = 0u64;
    let mut rng = Rng::new(seed);
    let (mut total_acked, mut kills_with_unacked_tail, mut n_replayed) = (0u64, 0u64, 0u64);
    let mut n_schema_changes = 0u64;
    let started = Instant::now();
    for kill in 0..n_kills {
        // Child start-up (open, load) takes a few ms; kill anywhere from before the
        // first commit to well into the stream.
        let delay = Duration::from_millis(5 + rng.below(120) as u64);
        let checkpoint_ms = if kill % 2 == 0 { 5 } else { 5000 };
        let outcome = run_child_and_kill(dir.path(), seed, delay, checkpoint_ms);
        total_acked += outcome.n_acked;

        let (database, report) = Database::open(dir.path(), StoreOptions::default(), &mut |_| {})
            .unwrap_or_else(|error| panic!("kill {kill}: reopening after SIGKILL failed: {error}"));
        // Every step takes one sequence number.
        let committed = database.last_seq();
        n_replayed += report.n_log_records_replayed;
        let context = format!("kill {kill} (seed {seed}, delay {delay:?})");
        if let Some(max_acked) = outcome.max_acked {
            assert!(
                committed > max_acked,
                "{context}: batch {max_acked} was acknowledged but only {committed} are on disk"
            );
        }
        assert!(committed >= n_modelled, "{context}: committed batches went from {n_modelled} back to {committed}");
        let last_batch = (0..committed).rev().find(|&k| step_kind(k) == Step::Batch).map_or(0, |k| k + 1);
        assert_eq!(committed_count(&database), last_batch, "{context}: sequence number and progress item disagree");
        if outcome.max_acked.map_or(0, |max| max + 1) < committed {
            kills_with_unacked_tail += 1;
        }
        while n_modelled < committed {
            match step_kind(n_modelled) {
                Step::Batch => model.apply(&schema, &batch_ops(seed, n_modelled)),
                _ => {
                    n_schema_changes += u64::from(step_kind(n_modelled) != Step::EvolvingBatch);
                    evolving.apply(seed, n_modelled);
                }
            }
            n_modelled += 1;
        }
        if committed > 0 {
            assert_engine_matches(database.engine(), COLLECTION, &model, &context);
            evolving.check(&database, &context);
        }
        drop(database);
    }
    println!(
        "crash test: {n_kills} SIGKILLs, {n_modelled} batches committed, {total_acked} acknowledgements checked, \
         {kills_with_unacked_tail} kills with committed-but-unacknowledged batches, {n_replayed} batches replayed from the log, {n_schema_changes} schema changes and drops; \
         every acknowledged step present, none partial ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(n_modelled > 0, "no batch was ever committed: the kills came too early to test anything");
    assert!(n_replayed > 0, "no reopen replayed the log: recovery was not tested");
    assert!(n_schema_changes >= 3, "too few schema changes were committed to test them");
}

fn main() {
    // libtest arguments (`--nocapture`, filters) are accepted and ignored: this is one test.
    if let Ok(dir) = std::env::var("ORDO_CRASH_CHILD_DIR") {
        child(Path::new(&dir), env_u64("ORDO_CRASH_SEED", 7));
        return;
    }
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    if filter.is_some_and(|filter| !"crash_kill_reopen".contains(&filter)) {
        return;
    }
    parent();
}
