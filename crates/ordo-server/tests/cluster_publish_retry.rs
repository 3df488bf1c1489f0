//! How a node publishes through the stream's troubles, each made deterministic:
//!
//! - a publish the stream refuses at once (no stream answers on the subject: a
//!   stream just created whose leader is not elected yet, or one being elected
//!   again) is sent again with backoff for up to `NO_LEADER_WAIT` *per attempt*
//!   before the node answers `503`. The refusal: the stream stops listening on
//!   the log's subject for a while (its subjects are changed and changed back),
//!   which is what a stream without a leader looks like to a publisher ("no
//!   responders"); a subscriber that never answers on the subject makes an
//!   attempt time out, as a killed or frozen NATS server does;
//! - a publish answered "duplicate message id is in process" (the stream leader
//!   has the first attempt in flight, and both followers are frozen) waits for
//!   the stream's decision instead of answering `503`.

mod common;

use std::time::{Duration, Instant};

use common::cluster::request;
use common::nats::NatsCluster;
use common::Server;
use serde_json::json;

const STREAM: &str = "ORDO";

/// Points the stream at `subjects` (through a client of its own).
fn set_subjects(runtime: &tokio::runtime::Runtime, url: &str, subjects: &[&str]) {
    runtime.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream(STREAM).await.unwrap();
        let mut config = stream.info().await.unwrap().config.clone();
        config.subjects = subjects.iter().map(|subject| subject.to_string()).collect();
        js.update_stream(config).await.unwrap();
    });
}

#[test]
fn a_write_refused_at_once_by_the_stream_is_sent_again_until_the_stream_answers() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start(dir.path(), &["--cluster", &nats.urls(), "--node-name", "solo", "--stream-replicas", "1"]);
    let schema = json!({"fields": [{"name": "n", "type": "u64"}]});
    let (status, body) = server.http("PUT", "/v1/collections/things", Some(&schema));
    assert_eq!(status, 201, "{body}");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    // Nothing answers on the log's subject for `PAUSE`, well inside `NO_LEADER_WAIT`.
    const PAUSE: Duration = Duration::from_millis(1500);
    set_subjects(&runtime, &nats.url(0), &["ordo.paused"]);
    let port = server.port;
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let batch = json!({"ops": [{"op": "upsert", "id": "c", "increment": {"n": 1}}]});
        common::cluster::request(port, "POST", "/v1/collections/things/batch", Some(&batch), Duration::from_secs(30))
    });
    std::thread::sleep(PAUSE);
    assert!(!writer.is_finished(), "the write was answered while the stream could not take it");
    set_subjects(&runtime, &nats.url(0), &["ordo.log"]);
    let (status, answer) = writer.join().unwrap().expect("the write's answer");
    assert_eq!(status, 200, "the write waited for the stream instead of failing: {answer}");
    assert!(started.elapsed() >= PAUSE);
    let seq = answer["seq"].as_u64().unwrap();
    let query = json!({"limit": 10, "min_seq": seq, "payload": false});
    let items = server.ok("POST", "/v1/collections/things/query", query)["items"].clone();
    assert_eq!(items, json!([{"id": "c", "version": seq, "fields": {"n": 1}}]), "applied once");

    // Refused for longer than `NO_LEADER_WAIT` on each of the 3 attempts: the
    // node gives up with a clear `503` (bounded: it does not hold the request
    // until the client's timeout).
    set_subjects(&runtime, &nats.url(0), &["ordo.paused"]);
    let started = Instant::now();
    let batch = json!({"ops": [{"op": "upsert", "id": "c", "increment": {"n": 1}}]});
    let (status, answer) =
        common::cluster::request(port, "POST", "/v1/collections/things/batch", Some(&batch), Duration::from_secs(90))
            .unwrap();
    let waited = started.elapsed();
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("cluster_unavailable")), "{answer}");
    assert!(waited >= Duration::from_secs(12) && waited < Duration::from_secs(60), "{waited:?}");
    set_subjects(&runtime, &nats.url(0), &["ordo.log"]);
    let seq = server.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap();
    let query = json!({"limit": 10, "min_seq": seq, "payload": false});
    let items = server.ok("POST", "/v1/collections/things/query", query)["items"].clone();
    assert_eq!(items[0]["fields"]["n"], 2, "the refused write was not applied: {items}");
}

/// The chaos run's case: an attempt times out (the NATS server died, or froze,
/// with the publish in flight), and the next one meets the election that
/// followed ("no stream found"). That attempt waits for the leader for its own
/// `NO_LEADER_WAIT`, not for what remains of one counted from the request's
/// start (which had run out, so the write was answered `503` at once).
#[test]
fn an_attempt_after_a_timeout_waits_for_the_stream_leader_for_its_own_wait() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start(dir.path(), &["--cluster", &nats.urls(), "--node-name", "solo", "--stream-replicas", "1"]);
    let schema = json!({"fields": [{"name": "n", "type": "u64"}]});
    let (status, body) = server.http("PUT", "/v1/collections/things", Some(&schema));
    assert_eq!(status, 201, "{body}");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // NATS clients dropped by a failing assertion need the runtime.
    let _context = runtime.enter();

    // The stream stops answering on the log's subject, and a subscriber that
    // never answers takes the first attempt: it times out.
    set_subjects(&runtime, &nats.url(0), &["ordo.paused"]);
    let client = runtime.block_on(async_nats::connect(nats.url(0))).unwrap();
    let mut silent = runtime.block_on(client.subscribe("ordo.log")).unwrap();
    runtime.block_on(client.flush()).unwrap();
    let port = server.port;
    let writer = std::thread::spawn(move || {
        let batch = json!({"ops": [{"op": "upsert", "id": "c", "increment": {"n": 1}}]});
        request(port, "POST", "/v1/collections/things/batch", Some(&batch), Duration::from_secs(90))
    });
    let first_attempt = runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(30), futures_util::StreamExt::next(&mut silent)).await
        })
        .expect("the node's first publish")
        .expect("a message");
    let seen_at = Instant::now();
    let entry = String::from_utf8_lossy(&first_attempt.payload).into_owned();
    assert!(entry.contains("increment"), "not the node's entry: {entry}");
    // The next attempts meet no responder at all: the election.
    runtime.block_on(silent.unsubscribe()).unwrap();
    runtime.block_on(client.flush()).unwrap();
    // The first attempt times out after `PUBLISH_TIMEOUT` (5 s); the leader
    // comes back 2 s into the second attempt's wait.
    std::thread::sleep(Duration::from_secs(7).saturating_sub(seen_at.elapsed()));
    set_subjects(&runtime, &nats.url(0), &["ordo.log"]);
    let (status, answer) = writer.join().unwrap().expect("the write's answer");
    assert_eq!(status, 200, "the second attempt waited for the leader: {answer}");
    let seq = answer["seq"].as_u64().unwrap();
    let query = json!({"limit": 10, "min_seq": seq, "payload": false});
    let items = server.ok("POST", "/v1/collections/things/query", query)["items"].clone();
    assert_eq!(items, json!([{"id": "c", "version": seq, "fields": {"n": 1}}]), "applied once");
}

/// The chaos run's other case: both followers of the stream frozen, so the
/// leader cannot commit the node's publish; the attempt times out, and the
/// next one (the same message id) is answered "duplicate message id is in
/// process" (JetStream's 10158). The node waits for the stream's decision and
/// answers the write's outcome once the followers are back, instead of `503`
/// (a client retrying that `503` would have applied the increment twice).
#[test]
fn a_publish_whose_message_id_is_in_process_waits_for_the_streams_decision() {
    let nats = NatsCluster::start(3);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _context = runtime.enter();
    let js = async_nats::jetstream::new(runtime.block_on(async_nats::connect(nats.url(0))).unwrap());
    let config = async_nats::jetstream::stream::Config {
        name: STREAM.to_owned(),
        subjects: vec!["ordo.log".to_owned()],
        num_replicas: 3,
        storage: async_nats::jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    runtime.block_on(js.create_stream(config)).unwrap();
    assert!(nats.wait_stream_settled(STREAM, Duration::from_secs(30)), "the stream has no leader");
    let leader = nats.leaders(STREAM).1.expect("a stream leader");
    // The node talks to the leader only, so its publish reaches the leader first hand.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--cluster", &nats.url(leader), "--node-name", "solo"]);
    let schema = json!({"fields": [{"name": "n", "type": "u64"}]});
    let (status, body) = server.http("PUT", "/v1/collections/things", Some(&schema));
    assert_eq!(status, 201, "{body}");
    assert_eq!(nats.leaders(STREAM).1, Some(leader), "the stream's leader changed");

    let followers: Vec<usize> = (0..3).filter(|&index| index != leader).collect();
    for &follower in &followers {
        nats.stop(follower);
    }
    let port = server.port;
    let writer = std::thread::spawn(move || {
        let batch = json!({"ops": [{"op": "upsert", "id": "c", "increment": {"n": 1}}]});
        request(port, "POST", "/v1/collections/things/batch", Some(&batch), Duration::from_secs(90))
    });
    // The first attempt times out after `PUBLISH_TIMEOUT` (5 s), the next ones
    // find it in process; the followers come back before the leader gives up
    // its leadership for want of a quorum.
    std::thread::sleep(Duration::from_secs(8));
    for &follower in &followers {
        nats.cont(follower);
    }
    let (status, answer) = writer.join().unwrap().expect("the write's answer");
    assert_eq!(status, 200, "the write waited for the stream's decision: {answer}");
    let seq = answer["seq"].as_u64().unwrap();
    let query = json!({"limit": 10, "min_seq": seq, "payload": false});
    let items = server.ok("POST", "/v1/collections/things/query", query)["items"].clone();
    assert_eq!(items, json!([{"id": "c", "version": seq, "fields": {"n": 1}}]), "applied once");
}
