//! Crash test. A child process (this same binary, with `ORDO_CRASH_CHILD_DIR` set)
//! writes seeded random batches through a `Writer` as fast as it can, printing
//! `ack <k>` once batch `k` is acknowledged. The parent kills it with `SIGKILL` at a
//! random moment, reopens the data directory and checks that:
//! - every acknowledged batch is present: the committed count covers it;
//! - no batch is partially present: the contents equal the reference model after
//!   exactly the committed batches, and the sequence number agrees;
//! - the committed state never goes backwards from one kill to the next.
//!
//! `ORDO_CRASH_KILLS` sets the number of kills (default 50), `ORDO_CRASH_SEED` the seed.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_engine_matches, fill_batch, random_ops, test_schema, GenOp, Model, Rng};
use ordo_core::{Batch, NullSink, OwnedValue, Value};
use ordo_store::{Database, StoreOptions, Writer};

const COLLECTION: &str = "crash";
/// Holds the number of batches committed so far in its `recency` field; every
/// batch rewrites it, in the same transaction as the rest of the batch.
const PROGRESS_ID: &str = "progress";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The operations of batch `k` (0-based): a function of the seed and `k` only.
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

fn child(dir: &Path, seed: u64) {
    // Every other child checkpoints every few ms, so that kills also land inside
    // LMDB checkpoints and log segment removals, not only between them.
    let checkpoint_interval = Duration::from_millis(env_u64("ORDO_CRASH_CHECKPOINT_MS", 5000));
    let options = StoreOptions { checkpoint_interval, log_segment_bytes: 64 * 1024, ..StoreOptions::default() };
    let (mut database, _) = Database::open(dir, options, &mut |_| {}).expect("child: open");
    let collection = match database.engine().collection_id(COLLECTION) {
        Some(collection) => collection,
        None => database.create_collection(COLLECTION, test_schema()).expect("child: create collection"),
    };
    let first = committed_count(&database);
    let writer = Writer::spawn(database, Box::new(NullSink), 32);
    let (tickets, pending) = std::sync::mpsc::sync_channel(64);
    let acker = std::thread::spawn(move || {
        let mut stdout = std::io::stdout().lock();
        for (k, ticket) in pending {
            let ticket: ordo_store::WriteTicket = ticket;
            let (_, result) = ticket.wait().expect("child: writer alive");
            let ack = result.expect("child: generated batches are valid");
            writeln!(stdout, "ack {k} {}", ack.seq).unwrap();
            stdout.flush().unwrap();
        }
    });
    // Runs until killed; the bound only stops a child whose parent died.
    for k in first..first + 1_000_000 {
        let mut batch = Batch::new();
        fill_batch(&mut batch, &batch_ops(seed, k));
        let ticket = writer.submit(collection, batch).expect("child: writer alive");
        tickets.send((k, ticket)).unwrap();
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
    let mut n_modelled = 0u64;
    let mut rng = Rng::new(seed);
    let (mut total_acked, mut kills_with_unacked_tail, mut n_replayed) = (0u64, 0u64, 0u64);
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
        let committed = committed_count(&database);
        n_replayed += report.n_log_records_replayed;
        let context = format!("kill {kill} (seed {seed}, delay {delay:?})");
        if let Some(max_acked) = outcome.max_acked {
            assert!(
                committed > max_acked,
                "{context}: batch {max_acked} was acknowledged but only {committed} are on disk"
            );
        }
        assert!(committed >= n_modelled, "{context}: committed batches went from {n_modelled} back to {committed}");
        assert_eq!(report.last_seq, committed, "{context}: sequence number and progress item disagree");
        if outcome.max_acked.map_or(0, |max| max + 1) < committed {
            kills_with_unacked_tail += 1;
        }
        while n_modelled < committed {
            model.apply(&schema, &batch_ops(seed, n_modelled));
            n_modelled += 1;
        }
        if committed > 0 {
            assert_engine_matches(database.engine(), COLLECTION, &model, &context);
        }
        drop(database);
    }
    println!(
        "crash test: {n_kills} SIGKILLs, {n_modelled} batches committed, {total_acked} acknowledgements checked, \
         {kills_with_unacked_tail} kills with committed-but-unacknowledged batches, {n_replayed} batches replayed from the log; \
         every acknowledged batch present, none partial ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(n_modelled > 0, "no batch was ever committed: the kills came too early to test anything");
    assert!(n_replayed > 0, "no reopen replayed the log: recovery was not tested");
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
