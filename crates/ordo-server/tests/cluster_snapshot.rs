//! New nodes from snapshots (`cluster::snapshot`, docs/SCALING.md "New and
//! lagging nodes"), over a real `nats-server`: a node writes snapshots into a
//! shared directory while the stream's retention drops old entries; a new node
//! with an empty data directory restores the newest snapshot, replays the rest
//! of the stream and converges; without a usable snapshot (none, or one older
//! than what the stream still holds) a new node refuses to start and says why.
//! A running node that falls past retention stops rather than fill the gap; an
//! existing stream whose configuration breaks a guarantee is refused.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::nats::NatsCluster;
use common::Server;
use ordo_server::cluster::snapshot::list_snapshots;
use serde_json::{json, Value};

/// The stream keeps this many entries; snapshots every `EVERY` (the rule:
/// retention ≥ 2 × interval + what arrives during a copy).
const RETENTION: u64 = 60;
const EVERY: u64 = 25;

fn cluster_args<'a>(nats: &'a str, name: &'a str, snapshots: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["--cluster", nats, "--node-name", name, "--stream-replicas", "1"].iter().map(|arg| arg.to_string()).collect();
    args.extend(["--stream-max-msgs".into(), RETENTION.to_string(), "--snapshot-dir".into()]);
    args.push(snapshots.to_str().unwrap().to_owned());
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args
}

fn start(dir: &Path, args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(dir, &args)
}

use common::cluster::message_of;

fn applied_seq(server: &Server) -> u64 {
    let (status, body) = server.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    body["cluster"]["applied_seq"].as_u64().expect("cluster.applied_seq")
}

fn wait_applied(server: &Server, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while applied_seq(server) < seq {
        assert!(Instant::now() < deadline, "seq {seq} not applied in 30 s (at {})", applied_seq(server));
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn items(server: &Server, min_seq: u64) -> Value {
    let query = json!({"sort": [{"field": "n"}], "limit": 1000, "min_seq": min_seq, "payload": false});
    server.ok("POST", "/v1/collections/things/query", query)["items"].clone()
}

/// `n` writes through `server`, each one entry; returns the last seq.
fn write(server: &Server, from: u64, n: u64) -> u64 {
    let mut seq = 0;
    for i in from..from + n {
        let batch = json!({"ops": [{"op": "upsert", "id": format!("k{}", i % 17), "fields": {"n": i}}]});
        seq = server.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap();
    }
    seq
}

/// Waits until the newest snapshot reaches back to what the stream holds.
fn wait_snapshot_at_least(dir: &Path, seq: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let newest = list_snapshots(dir).unwrap().last().map_or(0, |snapshot| snapshot.seq);
        if newest >= seq {
            return newest;
        }
        assert!(Instant::now() < deadline, "no snapshot at seq {seq} or later within 30 s (newest {newest})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `ordo serve ARGS` on `data_dir`, which must exit (refuse) within 30 s; its stderr.
fn refused_start(data_dir: &Path, args: &[String]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting ordo");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started instead of refusing (data dir {})", data_dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    stderr
}

#[test]
fn a_new_node_joins_from_a_snapshot_after_retention_and_refuses_without_one() {
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let snapshots = root.path().join("snapshots");
    let every = EVERY.to_string();
    let a_dir = root.path().join("a");
    let a = start(&a_dir, &cluster_args(&nats.urls(), "node-a", &snapshots, &["--snapshot-every", &every]));
    let schema = json!({"fields": [{"name": "n", "type": "u64"}]});
    let (status, body) = a.http("PUT", "/v1/collections/things", Some(&schema));
    assert_eq!(status, 201, "{body}");

    // 200 entries, one message each: the stream keeps the last 60, so seq 1 is long gone.
    let last_seq = write(&a, 0, 200);
    let first_kept = message_of(last_seq) + 1 - RETENTION;
    let newest = wait_snapshot_at_least(&snapshots, first_kept - 1);
    // The newest three are kept: a new snapshot is renamed into place before
    // the oldest is removed, so a listing between the two may see four.
    let deadline = Instant::now() + Duration::from_secs(10);
    while list_snapshots(&snapshots).unwrap().len() > 3 {
        assert!(Instant::now() < deadline, "{:?}", list_snapshots(&snapshots).unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }

    // A node with an empty data directory: restores `newest`, replays from newest + 1.
    let b_dir = root.path().join("b");
    let b = start(&b_dir, &cluster_args(&nats.urls(), "node-b", &snapshots, &[]));
    wait_applied(&b, last_seq);
    assert_eq!(items(&b, last_seq), items(&a, last_seq));
    assert_eq!(items(&b, last_seq).as_array().unwrap().len(), 17);
    // It took the snapshot's directory (and so its log segment name) as its own.
    assert!(newest > 1 && newest <= message_of(last_seq));

    // More writes after it joined reach both.
    let last_seq = write(&b, 200, 30);
    wait_applied(&a, last_seq);
    assert_eq!(items(&a, last_seq), items(&b, last_seq));

    // No snapshot at all: a new node cannot replay from seq 1 and refuses.
    let nothing = root.path().join("no-snapshots");
    let c_dir = root.path().join("c");
    let stderr = refused_start(&c_dir, &cluster_args(&nats.urls(), "node-c", &nothing, &[]));
    assert!(stderr.contains("cannot start without a gap"), "{stderr}");
    assert!(stderr.contains("holds no snapshot"), "{stderr}");
    assert!(!c_dir.join("data.mdb").exists(), "a refused node wrote a data directory");

    // A snapshot older than what the stream still holds: refused, naming both seqs.
    let stale = root.path().join("stale");
    std::fs::create_dir(&stale).unwrap();
    let oldest = list_snapshots(&snapshots).unwrap()[0].clone();
    ordo_server::cluster::snapshot::restore(&oldest, &stale.join(format!("snapshot-{}", oldest.seq))).unwrap();
    let last_seq = write(&a, 300, RETENTION + 10);
    let first_kept = message_of(last_seq) + 1 - RETENTION;
    assert!(oldest.seq + 1 < first_kept);
    let d_dir = root.path().join("d");
    let stderr = refused_start(&d_dir, &cluster_args(&nats.urls(), "node-d", &stale, &[]));
    assert!(stderr.contains(&format!("newest snapshot in {} is at seq {}", stale.display(), oldest.seq)), "{stderr}");
    assert!(stderr.contains(&format!("needs a snapshot at seq {} or later", first_kept - 1)), "{stderr}");
    drop(b);
    drop(a);
}

/// Never a silent gap, for a node that is already running: it is
/// frozen (SIGSTOP) while another node writes far past the stream's retention,
/// then continues. Its consumer then meets seqs beyond the one it needs (the
/// stream dropped them), either mid-stream or when it starts again. Filling
/// them with seq markers would leave its items silently wrong at the stream's
/// seq; it must apply nothing past the gap and stop, saying why, and refuse to
/// start again on that data directory.
#[test]
fn a_running_node_that_falls_past_retention_stops_instead_of_filling_the_gap() {
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let snapshots = root.path().join("snapshots");
    // One entry per message, so that a's requests of 50 writes run far past the retention of 60 messages.
    let a_args = cluster_args(&nats.urls(), "node-a", &snapshots, &["--coalesce-entries", "1"]);
    let a = start(&root.path().join("a"), &a_args);
    let (status, body) =
        a.http("PUT", "/v1/collections/things", Some(&json!({"fields": [{"name": "n", "type": "u64"}]})));
    assert_eq!(status, 201, "{body}");
    let b_dir = root.path().join("b");
    let b_args: Vec<String> = cluster_args(&nats.urls(), "node-b", &snapshots, &[]);
    let b_args_str: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let mut b =
        Server::start_with(&b_dir, &b_args_str, common::StartOptions { capture_stderr: true, ..Default::default() });
    let before = write(&a, 0, 5);
    wait_applied(&b, before);

    // SAFETY: `kill` with the pid of a child this test owns and a valid signal.
    unsafe { libc::kill(b.pid() as i32, libc::SIGSTOP) };
    // Far more entries than the stream keeps and than the pull requests of b's
    // consumer hold (1024 each, a second one sent once half of the first has
    // arrived: what it already has in its socket is contiguous), in requests
    // of 50 entries: a, which applies each before it answers, never falls
    // behind the retention of 60 itself.
    let mut last = before;
    for round in 0..40 {
        let writes: Vec<Value> = (0..50)
            .map(|i| json!({"collection": "things", "ops": [{"op": "upsert", "id": format!("k{}", i % 17), "fields": {"n": round * 50 + i}}]}))
            .collect();
        let answer = a.ok("POST", "/v1/batch", json!({"writes": writes}));
        last = answer["results"].as_array().unwrap().last().unwrap()["seq"].as_u64().unwrap();
    }
    assert!(message_of(last) > message_of(before) + 1536 + RETENTION);
    // SAFETY: as above.
    unsafe { libc::kill(b.pid() as i32, libc::SIGCONT) };

    let status = b.wait_exit(Duration::from_secs(25)).expect("the node that fell past retention did not stop");
    assert!(!status.success());
    let stderr = b.stderr_lines().join("\n");
    assert!(stderr.contains("applies nothing more and stops"), "{stderr}");
    assert!(stderr.contains("cannot start without a gap"), "{stderr}");
    assert!(!stderr.contains("recording it as empty"), "a seq marker filled the gap: {stderr}");
    // Its data directory stops before the gap: a start refuses it, naming it.
    let stderr = refused_start(&b_dir, &b_args);
    assert!(stderr.contains("cannot start without a gap"), "{stderr}");
    let last_message = message_of(last);
    assert!(stderr.contains(&format!("holds entries {}..={last_message}", last_message + 1 - RETENTION)), "{stderr}");
    // The node that kept up is untouched.
    assert_eq!(items(&a, last).as_array().unwrap().len(), 17);
}

/// An existing stream is checked before a node binds to it
/// (`cluster::stream_check`): a configuration that breaks a guarantee refuses
/// the start, naming what is wrong; a harmless difference is logged and the
/// node starts with the stream as it is.
#[test]
fn an_existing_stream_is_checked_before_a_node_binds_to_it() {
    use async_nats::jetstream::stream::{Config, StorageType};
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let js = async_nats::jetstream::new(runtime.block_on(async_nats::connect(nats.urls())).unwrap());
    let ordo_config = |name: &str| Config {
        name: name.to_owned(),
        subjects: vec!["ordo.log".to_owned()],
        num_replicas: 1,
        storage: StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    let node_args = |name: &str, replicas: &str| -> Vec<String> {
        ["--cluster", &nats.urls(), "--node-name", "n", "--stream", name, "--stream-replicas", replicas]
            .iter()
            .map(|arg| arg.to_string())
            .collect()
    };
    let cases: Vec<(Config, &str, &str)> = vec![
        (Config { subjects: vec!["ordo.>".to_owned()], ..ordo_config("WIDE") }, "1", "its subjects are [\"ordo.>\"]"),
        (Config { duplicate_window: Duration::from_secs(5), ..ordo_config("SHORT") }, "1", "duplicate window is 5s"),
        (ordo_config("R1"), "3", "1 replica(s) where this node asks for 3"),
        (Config { storage: StorageType::Memory, ..ordo_config("MEMORY") }, "1", "storage is memory"),
    ];
    // The server frees the subject of a deleted stream a moment later, now and
    // then ("error creating store for stream"): each creation retries a while.
    let create = |config: Config| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(error) = runtime.block_on(js.create_stream(config.clone())) {
            assert!(Instant::now() < deadline, "creating {}: {error}", config.name);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for (index, (config, replicas, expected)) in cases.into_iter().enumerate() {
        let name = config.name.clone();
        create(config);
        let dir = root.path().join(format!("refused-{index}"));
        let stderr = refused_start(&dir, &node_args(&name, replicas));
        assert!(
            stderr.contains(&format!("the stream `{name}` exists with a configuration Ordo cannot use")),
            "{stderr}"
        );
        assert!(stderr.contains(expected), "{name}: {stderr}");
        // Two streams may not share a subject: the next case needs it.
        runtime.block_on(js.delete_stream(&name)).unwrap();
    }

    // A retention of its own: the stream's stands, with a warning, and the node serves.
    create(Config { max_messages: 1000, ..ordo_config("KEEPS") });
    let args = node_args("KEEPS", "1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let node = Server::start_with(
        &root.path().join("warned"),
        &args,
        common::StartOptions { capture_stderr: true, ..Default::default() },
    );
    let lines = node.wait_for_stderr_line(|line| line.contains("stream `KEEPS` keeps 1000 entries"));
    assert!(lines.iter().any(|line| line.contains("the stream's retention stands")), "{lines:?}");
    let (status, body) =
        node.http("PUT", "/v1/collections/things", Some(&json!({"fields": [{"name": "n", "type": "u64"}]})));
    assert_eq!(status, 201, "{body}");
    let info = runtime.block_on(async { js.get_stream("KEEPS").await.unwrap().get_info().await.unwrap() });
    assert_eq!(info.config.max_messages, 1000);
    assert_eq!(info.state.last_sequence, 1);
}
