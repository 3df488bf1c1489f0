//! Snapshots for new cluster nodes (`cluster::snapshot`), over a real store:
//! the scheduler publishes `snapshot-<seq>` every N entries off the writer's
//! thread while writes go on, keeps the newest few, and a node with an empty
//! data directory restores the newest and opens at exactly its seq with
//! exactly the entries 1..=seq; when the stream no longer reaches back to any
//! snapshot, the start is refused and the data directory left empty.

use std::path::Path;
use std::time::{Duration, Instant};

use ordo_core::{Batch, FieldType, Filter, NullSink, OwnedValue, Schema, SortKey, Value, ViewDef};
use ordo_server::cluster::snapshot::{
    data_dir_is_empty, list_snapshots, prepare_data_dir, SnapshotConfig, SnapshotError, SnapshotScheduler, StartPlan,
    StreamBounds,
};
use ordo_store::{Database, StoreOptions};

const N_KEYS: u64 = 37;

fn open(dir: &Path) -> Database {
    let options = StoreOptions { checkpoint_interval: Duration::from_millis(5), ..StoreOptions::default() };
    Database::open(dir, options, &mut |_| {}).expect("open").0
}

/// The collection's items as (id, n), ordered by n.
fn contents(database: &mut Database) -> Vec<(String, u64)> {
    let marks = database.engine().collection_id("marks").expect("marks exists");
    let view = ViewDef::new(Filter::True, vec![SortKey::asc("n")]);
    let window = database.open_window(marks, &view, 0, 10_000, &mut NullSink).expect("window");
    let items = database.window_items(window).expect("items");
    items
        .into_iter()
        .map(|item| match item.fields[0] {
            OwnedValue::U64(n) => (item.id, n),
            ref other => panic!("n is {other:?}"),
        })
        .collect()
}

/// What a directory at `seq` must hold: each key's last write up to `seq`.
fn expected_at(writes: &[(u64, String)], seq: u64) -> Vec<(String, u64)> {
    let mut latest = std::collections::BTreeMap::new();
    for (write_seq, id) in writes.iter().filter(|(write_seq, _)| *write_seq <= seq) {
        latest.insert(id.clone(), *write_seq);
    }
    let mut items: Vec<(String, u64)> = latest.into_iter().collect();
    items.sort_by_key(|(_, n)| *n);
    items
}

fn wait_idle(scheduler: &SnapshotScheduler) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while scheduler.is_running() {
        assert!(Instant::now() < deadline, "a snapshot ran for a minute");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn snapshots_under_writes_restore_to_exactly_their_seq_and_a_gap_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let snapshot_dir = root.path().join("shared/snapshots");
    let mut database = open(&root.path().join("node-a"));
    let marks = database.create_collection("marks", Schema::new().with_field("n", FieldType::U64)).expect("create");
    let config = SnapshotConfig { dir: snapshot_dir.clone(), every: 100, keep: 3, node: "node a/1".into() };
    let mut scheduler = SnapshotScheduler::new(config, database.last_seq());

    // Each write sets one key's `n` to the write's own seq, so the state at any
    // seq is known. Snapshots start and run while the writes go on.
    let mut writes = Vec::new();
    let mut n_started = 0;
    let mut batch = Batch::new();
    for step in 0..900u64 {
        let seq_next = database.last_seq() + 1;
        let id = format!("k{}", step % N_KEYS);
        batch.clear();
        batch.upsert(&id).set("n", Value::U64(seq_next));
        let (returned, result) = database.write(marks, batch, &mut NullSink);
        batch = returned;
        assert_eq!(result.expect("write").seq, seq_next);
        writes.push((seq_next, id));
        if scheduler.after_apply(&database, ordo_server::cluster::pack::SeqScheme::ONE_PER_MESSAGE) {
            n_started += 1;
        }
        if step == 450 {
            // Once, let the copy finish before going on, so that the next
            // snapshot certainly starts (the others may be skipped while one runs).
            wait_idle(&scheduler);
        }
    }
    wait_idle(&scheduler);
    let stats = scheduler.stats();
    assert!(n_started >= 2, "{n_started} snapshots started");
    assert_eq!(stats.n_written.load(std::sync::atomic::Ordering::Relaxed), n_started);
    assert_eq!(stats.n_failed.load(std::sync::atomic::Ordering::Relaxed), 0);

    let snapshots = list_snapshots(&snapshot_dir).unwrap();
    assert!(!snapshots.is_empty() && snapshots.len() <= 3, "{snapshots:?}");
    assert!(snapshots.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    // Nothing but published snapshots is left in the shared directory.
    let names: Vec<String> = std::fs::read_dir(&snapshot_dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), snapshots.len(), "{names:?}");
    let last_seq = database.last_seq();
    drop(database);

    // Every kept snapshot opens at exactly its seq with exactly the writes up to it.
    for snapshot in &snapshots {
        assert!(snapshot.seq <= last_seq);
        let copy = root.path().join(format!("copy-{}", snapshot.seq));
        ordo_server::cluster::snapshot::restore(snapshot, &copy).unwrap();
        let mut restored = open(&copy);
        assert_eq!(restored.last_seq(), snapshot.seq);
        assert_eq!(contents(&mut restored), expected_at(&writes, snapshot.seq), "snapshot {}", snapshot.seq);
    }

    // A new node, the stream truncated after the newest snapshot: it restores
    // the newest and is told to consume from its seq + 1.
    let newest = snapshots.last().unwrap().clone();
    let stream = StreamBounds { first_seq: newest.seq - 5, last_seq };
    let new_node = root.path().join("node-b");
    let prepared = prepare_data_dir(&new_node, Some(&snapshot_dir), stream).unwrap().expect("an empty directory");
    assert_eq!(prepared.plan, StartPlan::Restore { snapshot: newest.clone() });
    assert_eq!(prepared.plan.from_seq(), newest.seq + 1);
    assert!(prepared.n_bytes_copied > 0);
    let mut node_b = open(&new_node);
    assert_eq!(node_b.last_seq(), newest.seq);
    assert_eq!(contents(&mut node_b), expected_at(&writes, newest.seq));
    drop(node_b);
    // A directory with state is never touched again.
    assert_eq!(prepare_data_dir(&new_node, Some(&snapshot_dir), stream).unwrap(), None);

    // The stream's retention dropped newest.seq + 1: no snapshot reaches it.
    let truncated = StreamBounds { first_seq: newest.seq + 2, last_seq: last_seq + 10 };
    let node_c = root.path().join("node-c");
    std::fs::create_dir(&node_c).unwrap();
    let error = prepare_data_dir(&node_c, Some(&snapshot_dir), truncated).unwrap_err();
    assert!(matches!(error, SnapshotError::Gap { newest_snapshot_seq: Some(seq), .. } if seq == newest.seq));
    assert!(error.to_string().contains(&format!("seq {} or later", newest.seq + 1)), "{error}");
    assert!(data_dir_is_empty(&node_c).unwrap());
    assert_eq!(std::fs::read_dir(&node_c).unwrap().count(), 0);
    // Without snapshots, a new node replays from seq 1 when the stream still has it.
    let empty_snapshots = root.path().join("none");
    let from_start = StreamBounds { first_seq: 1, last_seq };
    let prepared = prepare_data_dir(&node_c, Some(&empty_snapshots), from_start).unwrap().unwrap();
    assert_eq!(prepared.plan, StartPlan::Replay { from_seq: 1 });
    assert!(matches!(
        prepare_data_dir(&node_c, Some(&empty_snapshots), truncated),
        Err(SnapshotError::Gap { newest_snapshot_seq: None, .. })
    ));
}

#[test]
fn prune_keeps_the_newest_and_ignores_what_is_not_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    for seq in [5u64, 40, 7, 300, 12] {
        std::fs::create_dir(dir.path().join(format!("snapshot-{seq}"))).unwrap();
    }
    std::fs::create_dir(dir.path().join(".snapshot-staging-node-1")).unwrap();
    std::fs::create_dir(dir.path().join("snapshot-x")).unwrap();
    std::fs::write(dir.path().join("snapshot-99"), b"a file, not a snapshot").unwrap();
    let seqs = |dir: &Path| list_snapshots(dir).unwrap().into_iter().map(|s| s.seq).collect::<Vec<_>>();
    assert_eq!(seqs(dir.path()), [5, 7, 12, 40, 300]);
    assert_eq!(ordo_server::cluster::snapshot::prune(dir.path(), 2).unwrap(), 3);
    assert_eq!(seqs(dir.path()), [40, 300]);
    // At least one always stays.
    ordo_server::cluster::snapshot::prune(dir.path(), 0).unwrap();
    assert_eq!(seqs(dir.path()), [300]);
    assert!(dir.path().join(".snapshot-staging-node-1").is_dir());
    assert!(dir.path().join("snapshot-x").is_dir());
}
