//! Hot backup (`Database::start_backup`, `Backup::write_to`): under a writer
//! thread's load, the backup holds exactly the batches 1..=its seq; the log
//! segments a running backup needs are kept whatever the checkpoint.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ordo_core::{Batch, FieldType, NullSink, Schema, Value};
use ordo_store::{Database, StoreError, StoreOptions, Writer};

fn options() -> StoreOptions {
    // Small segments and frequent checkpoints: rotations, checkpoints and
    // segment removals all happen while the backup runs.
    StoreOptions {
        log_segment_bytes: 64 << 10,
        checkpoint_interval: Duration::from_millis(20),
        ..StoreOptions::default()
    }
}

fn segments(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("wal-0"))
        .collect();
    names.sort();
    names
}

fn marker(id: &str, n: u64) -> Batch {
    let mut batch = Batch::new();
    batch.upsert(id).set("n", Value::U64(n)).payload(&[b'p'; 500]);
    batch
}

#[test]
fn a_backup_under_load_holds_exactly_the_batches_up_to_its_seq() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let (mut database, _) = Database::open(&data, options(), &mut |_| {}).unwrap();
    let schema = Schema::new().with_field("n", FieldType::U64);
    let rooms = database.create_collection("rooms", schema.clone()).unwrap();
    let writer = Arc::new(Writer::spawn(database, Box::new(NullSink), 1024));
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let threads: Vec<_> = (0..3)
        .map(|thread| {
            let (writer, stop, acked) = (Arc::clone(&writer), Arc::clone(&stop), Arc::clone(&acked));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 20_000 {
                    let id = format!("t{thread}-{n}");
                    let (_, result) = writer.submit(rooms, marker(&id, n)).unwrap().wait().unwrap();
                    acked.lock().unwrap().push((result.unwrap().seq, id));
                    n += 1;
                }
            })
        })
        .collect();
    while acked.lock().unwrap().len() < 2_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut reports = Vec::new();
    for round in 0..3 {
        let backup = writer.run(|database, _| database.start_backup()).unwrap().unwrap();
        // One at a time.
        let second = writer.run(|database, _| database.start_backup().map(drop)).unwrap();
        assert!(matches!(second, Err(StoreError::BackupRunning { .. })), "{second:?}");
        let to = root.path().join(format!("backup{round}"));
        let n_before = acked.lock().unwrap().len() as u64;
        let report = backup.write_to(&to).unwrap();
        assert!(report.seq >= n_before, "{report:?} is older than the {n_before} batches acknowledged before it");
        reports.push((to, report));
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    drop(Arc::try_unwrap(writer).ok().expect("the writers are done").shutdown().unwrap());
    assert!(reports.iter().any(|(_, report)| report.seq > report.checkpointed_seq), "no backup had a log tail");
    for (to, report) in reports {
        let (database, open) = Database::open(&to, StoreOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(open.last_seq, report.seq);
        let engine = database.engine();
        let rooms = engine.collection(engine.collection_id("rooms").unwrap()).unwrap();
        for (seq, id) in &acked {
            assert_eq!(rooms.get(id).is_some(), *seq <= report.seq, "batch {seq} ({id}) in the backup at {report:?}");
        }
        assert_eq!(rooms.len() as u64, report.seq);
    }
}

#[test]
fn a_running_backup_keeps_the_log_segments_it_needs() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let options = StoreOptions { checkpoint_interval: Duration::from_secs(3600), ..options() };
    let (mut database, _) = Database::open(&data, options, &mut |_| {}).unwrap();
    let rooms = database.create_collection("rooms", Schema::new().with_field("n", FieldType::U64)).unwrap();
    let write = |database: &mut Database, n: u64| {
        let (_, result) = database.write(rooms, marker(&format!("m{n}"), n), &mut NullSink);
        result.unwrap().seq
    };
    for n in 0..400 {
        write(&mut database, n);
    }
    assert!(segments(&data).len() > 2, "{:?}", segments(&data));
    let backup = database.start_backup().unwrap();
    // The checkpoint covers every segment, but the backup started before it: kept.
    database.checkpoint().unwrap();
    let kept = segments(&data);
    assert!(kept.len() > 2, "segments a running backup needs were removed: {kept:?}");
    for n in 400..800 {
        write(&mut database, n);
    }
    assert!(segments(&data).starts_with(&kept[..kept.len() - 1]), "{:?}", segments(&data));
    drop(backup);
    database.checkpoint().unwrap();
    assert_eq!(segments(&data).len(), 1, "once the backup ended, the checkpoint removed them");
}
