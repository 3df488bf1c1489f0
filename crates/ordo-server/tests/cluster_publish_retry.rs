//! A publish the stream refuses at once (no stream answers on the subject: a
//! stream just created whose leader is not elected yet, or one being elected
//! again) is sent again with backoff for up to `NO_LEADER_WAIT` before the
//! node answers `503`. Here the refusal is made deterministic: the stream stops
//! listening on the log's subject for a while (its subjects are changed and
//! changed back), which is what a stream without a leader looks like to a
//! publisher ("no responders").

mod common;

use std::time::{Duration, Instant};

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

    // Refused for longer than `NO_LEADER_WAIT`: the node gives up with a clear
    // `503` (bounded: it does not hold the request until the client's timeout).
    set_subjects(&runtime, &nats.url(0), &["ordo.paused"]);
    let started = Instant::now();
    let batch = json!({"ops": [{"op": "upsert", "id": "c", "increment": {"n": 1}}]});
    let (status, answer) =
        common::cluster::request(port, "POST", "/v1/collections/things/batch", Some(&batch), Duration::from_secs(30))
            .unwrap();
    let waited = started.elapsed();
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("cluster_unavailable")), "{answer}");
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(20), "{waited:?}");
    set_subjects(&runtime, &nats.url(0), &["ordo.log"]);
    let seq = server.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap();
    let query = json!({"limit": 10, "min_seq": seq, "payload": false});
    let items = server.ok("POST", "/v1/collections/things/query", query)["items"].clone();
    assert_eq!(items[0]["fields"]["n"], 2, "the refused write was not applied: {items}");
}
