//! Group commit on the stream (`cluster::coalesce`, `cluster::pack`,
//! `cluster::batch`), over real `nats-server` processes: requests that arrive
//! together are published as one message, a pack of their entries (or, on a
//! stream created before packs, one JetStream atomic batch), each entry still
//! at its own seq with its own outcome; a pack or a batch sent again after it
//! was stored is stored once.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::nats::NatsCluster;
use common::Server;
use ordo_server::cluster::batch::{self, BatchAnswer};
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"fields": [{"name": "n", "type": "u64"}]})
}

fn node(dir: &Path, nats: &str, name: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--cluster", nats, "--node-name", name, "--stream-replicas", "1"];
    args.extend_from_slice(extra);
    Server::start(dir, &args)
}

fn applied_seq(server: &Server) -> u64 {
    let (_, health) = server.http("GET", "/v1/health", None);
    health["cluster"]["applied_seq"].as_u64().expect("cluster.applied_seq")
}

/// The value of a counter of `/metrics`.
fn metric(server: &Server, name: &str) -> u64 {
    let (_, text) = server.http_raw("GET", "/metrics", None);
    let text = String::from_utf8(text).unwrap();
    let line = text.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
    line[name.len() + 1..].trim().parse().unwrap()
}

fn counter(server: &Server, id: &str, min_seq: u64) -> Option<u64> {
    let query = json!({"sort": [{"field": "n"}], "limit": 1000, "min_seq": min_seq});
    let answer = server.ok("POST", "/v1/collections/things/query", query);
    answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["id"] == id)
        .map(|item| item["fields"]["n"].as_u64().unwrap())
}

fn increment_entry(id: &str) -> Bytes {
    let entry = json!({
        "kind": "write", "collection": "things",
        "ops": [{"op": "upsert", "id": id, "increment": {"n": 1}}],
        "caller": {"sub": "test", "role": "admin"},
    });
    Bytes::from(entry.to_string())
}

/// The stream `ORDO` as a build before packs created it: no `ordo_seq_shift`
/// in its metadata, so nodes keep one entry per message and atomic batches.
fn create_stream_without_packs(runtime: &tokio::runtime::Runtime, url: &str) {
    runtime.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let config = async_nats::jetstream::stream::Config {
            name: "ORDO".to_owned(),
            subjects: vec![ordo_server::cluster::SUBJECT.to_owned()],
            storage: async_nats::jetstream::stream::StorageType::File,
            duplicate_window: ordo_server::cluster::DUPLICATE_WINDOW,
            ..Default::default()
        };
        async_nats::jetstream::new(client).create_stream(config).await.unwrap();
    });
}

fn stream_last_seq(runtime: &tokio::runtime::Runtime, url: &str) -> u64 {
    runtime.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let mut stream = async_nats::jetstream::new(client).get_stream("ORDO").await.unwrap();
        stream.info().await.unwrap().state.last_sequence
    })
}

#[test]
fn an_atomic_batch_sent_again_after_it_was_stored_is_stored_once() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    create_stream_without_packs(&runtime, &nats.url(0));
    let server = node(dir.path(), &nats.urls(), "solo", &[]);
    assert_eq!(server.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let entries: Vec<(String, Bytes)> = (0..3).map(|n| (format!("test/batch/{n}"), increment_entry("dup"))).collect();
    let answers = runtime.block_on(async {
        let client = async_nats::connect(nats.url(0)).await.unwrap();
        let mut answers = Vec::new();
        // The node turned `allow_atomic` on when it bound to the stream. The
        // second attempt (after a lost answer) has a new batch id and the same
        // message ids.
        for batch_id in ["attempt-1", "attempt-2"] {
            answers.push(batch::send(&client, batch_id, &entries, Duration::from_secs(5)).await);
        }
        answers
    });
    assert_eq!(answers, [BatchAnswer::Stored, BatchAnswer::Stored]);
    let stream_last = 1 + entries.len() as u64; // the collection's entry, then the batch
    assert_eq!(counter(&server, "dup", stream_last), Some(3), "three entries, the second attempt dropped whole");
    assert_eq!(applied_seq(&server), stream_last);
}

/// A pack published twice with the same message id (an attempt whose answer
/// was lost, sent again) is stored once: its three increments apply once,
/// each at a seq of its own within the message's.
#[test]
fn a_pack_sent_again_after_it_was_stored_is_stored_once() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &nats.urls(), "solo", &[]);
    assert_eq!(server.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let entries: Vec<(String, Bytes)> = (0..3).map(|n| (format!("test/pack/{n}"), increment_entry("dup"))).collect();
    let mut pack = bytes::BytesMut::new();
    ordo_server::cluster::pack::encode(&entries, &mut pack);
    let pack = pack.freeze();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let acked: Vec<u64> = runtime.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url(0)).await.unwrap());
        let mut acked = Vec::new();
        for _ in 0..2 {
            let publish =
                async_nats::jetstream::context::Publish::build().message_id("test/pack").payload(pack.clone());
            let ack = js.send_publish(ordo_server::cluster::SUBJECT, publish).await.unwrap().await.unwrap();
            acked.push(ack.sequence);
        }
        acked
    });
    assert_eq!(acked, [2, 2], "the second publish is the first one's message");
    assert_eq!(stream_last_seq(&runtime, &nats.url(0)), 2, "the collection's entry, then the pack");
    let scheme = ordo_server::cluster::pack::SeqScheme::PACKED;
    let last_entry_seq = scheme.entry_seq(2, 3, 2);
    assert_eq!(counter(&server, "dup", last_entry_seq), Some(3), "three increments, applied once");
    assert_eq!(applied_seq(&server), last_entry_seq);
    let (_, health) = server.http("GET", "/v1/health", None);
    assert_eq!(health["cluster"]["applied_stream_seq"], 2, "{health}");
    assert_eq!(health["cluster"]["lag_entries"], 0, "{health}");
}

/// A request's answer: its status and the seq it was given.
fn send(server: &Server, id: &str, failing: bool) -> (u16, Option<u64>) {
    let mut op = json!({"op": "upsert", "id": id, "increment": {"n": 1}});
    if failing {
        // The item never reaches this version: refused at apply time, on every node.
        op["if"] = json!({"version": 1_000_000});
    }
    let (status, body) = server.http("POST", "/v1/collections/things/batch", Some(&json!({"ops": [op]})));
    (status, body["seq"].as_u64())
}

#[test]
fn requests_arriving_together_share_a_batch_and_each_gets_its_own_outcome() {
    let nats = NatsCluster::start(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    // One batch in flight, which waits 50 ms for more: requests sent at once share it.
    let coalescing = ["--coalesce-in-flight", "1", "--coalesce-wait-us", "50000"];
    let a = node(dirs[0].path(), &nats.urls(), "a", &coalescing);
    let b = node(dirs[1].path(), &nats.urls(), "b", &[]);
    assert_eq!(a.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let (groups_before, entries_before) =
        (metric(&a, "ordo_cluster_publish_groups_total"), metric(&a, "ordo_cluster_publish_group_entries_total"));
    let n_requests = 24;
    let answers: Vec<(u16, Option<u64>)> = std::thread::scope(|scope| {
        let a = &a;
        let threads: Vec<_> =
            (0..n_requests).map(|i| scope.spawn(move || send(a, &format!("c{}", i % 3), i % 4 == 3))).collect();
        threads.into_iter().map(|thread| thread.join().unwrap()).collect()
    });
    let groups = metric(&a, "ordo_cluster_publish_groups_total") - groups_before;
    let entries = metric(&a, "ordo_cluster_publish_group_entries_total") - entries_before;
    assert_eq!(entries, n_requests as u64, "every request is one entry");
    assert!(groups < entries, "requests sent at once share batches: {groups} groups for {entries} entries");
    for (i, (status, seq)) in answers.iter().enumerate() {
        let expected = if i % 4 == 3 { 409 } else { 200 };
        assert_eq!(*status, expected, "request {i}: only the requests whose precondition fails are refused");
        assert_eq!(seq.is_some(), expected == 200, "request {i}");
    }
    let mut seqs: Vec<u64> = answers.iter().filter_map(|(_, seq)| *seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), answers.iter().filter(|(status, _)| *status == 200).count(), "each its own seq");
    let last = applied_seq(&a);
    for server in [&a, &b] {
        let total: u64 = (0..3).map(|c| counter(server, &format!("c{c}"), last).unwrap_or(0)).sum();
        assert_eq!(total, 18, "every accepted increment applied exactly once, on every node");
    }
}

#[test]
fn a_request_with_more_entries_than_a_batch_takes_is_published_in_several_in_order() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &nats.urls(), "solo", &["--coalesce-entries", "2"]);
    assert_eq!(server.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let part = |i: u64| json!({"collection": "things", "ops": [{"op": "upsert", "id": "p", "fields": {"n": i}}]});
    let entries_before = metric(&server, "ordo_cluster_publish_group_entries_total");
    let answer = server.ok("POST", "/v1/batch", json!({"writes": (1..=5).map(part).collect::<Vec<_>>()}));
    assert_eq!(metric(&server, "ordo_cluster_publish_group_entries_total") - entries_before, 5, "{answer}");
    let seqs: Vec<u64> =
        answer["results"].as_array().unwrap().iter().map(|part| part["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "the parts in their order: {seqs:?}");
    let last = *seqs.last().unwrap();
    assert_eq!(counter(&server, "p", last), Some(5), "the last part is the item's state");
}
