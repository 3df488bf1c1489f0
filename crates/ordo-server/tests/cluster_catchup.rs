//! A node catching up applies the stream in runs, with a batch reused from
//! entry to entry and the caller's identity kept from one entry to the next
//! (`cluster::apply`, docs/bench-history/2026-11-24-cluster-mode.md "Catch-up, third pass"); its consumer
//! is a pull consumer that checks the order itself (`cluster::consume`). Here a
//! stream of entries of every shape is applied one at a time by one node (each
//! published only once the one before is applied) and in runs by a new node,
//! and both must end with exactly the state the entries call for.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::nats::NatsCluster;
use common::Server;
use serde_json::{json, Value};

fn node(dir: &Path, nats: &str, name: &str) -> Server {
    Server::start(dir, &["--cluster", nats, "--node-name", name, "--stream-replicas", "1"])
}

fn applied_seq(server: &Server) -> u64 {
    let (status, body) = server.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    body["cluster"]["applied_seq"].as_u64().expect("cluster.applied_seq")
}

fn wait_applied(server: &Server, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while applied_seq(server) < seq {
        assert!(Instant::now() < deadline, "seq {seq} not applied");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every item of `collection`, with fields, payload and version, in id order.
fn items(server: &Server, collection: &str, min_seq: u64) -> Vec<Value> {
    let query = json!({"limit": 1000, "min_seq": min_seq, "payload": true});
    let answer = server.ok("POST", &format!("/v1/collections/{collection}/query"), query);
    let mut items = answer["items"].as_array().unwrap().clone();
    items.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    items
}

fn write(collection: &str, caller: &Value, ops: Value) -> Value {
    json!({"kind": "write", "collection": collection, "ops": ops, "caller": caller})
}

/// The entries, in stream order. Consecutive write entries of different callers
/// (same `sub`, another role or other claims) and of different shapes (fields,
/// payloads, atomics, removes, preconditions, several ops, refused half-way
/// through its ops) share runs on the node that catches up.
fn entries(rounds: usize) -> Vec<Value> {
    let admin = json!({"sub": "w", "role": "admin"});
    let red = json!({"sub": "w", "role": "writer", "claims": {"team": "red"}});
    let blue = json!({"sub": "w", "role": "writer", "claims": {"team": "blue"}});
    let reader = json!({"sub": "w", "role": "reader", "claims": {"team": "red"}});
    // Two writers told apart by their sub alone (the same role, no claims).
    let zed = json!({"sub": "zed", "role": "writer"});
    let stranger = json!({"sub": "x", "role": "writer"});
    let schema = json!({"fields": [{"name": "n", "type": "u64"}, {"name": "owner", "type": "string"}]});
    let mut entries = vec![
        json!({"kind": "create_collection", "collection": "red", "schema": schema, "caller": admin}),
        json!({"kind": "create_collection", "collection": "blue", "schema": schema, "caller": admin}),
        json!({"kind": "create_collection", "collection": "zed", "schema": schema, "caller": admin}),
        // A writer writes to the collection its `team` claim names, and to the
        // one named as its sub; nowhere else.
        json!({"kind": "set_rules", "caller": admin,
               "rules": {"rules": [{"collection": "{team}", "roles": ["writer"], "read": true, "write": true},
                                   {"collection": "{sub}", "roles": ["writer"], "read": true, "write": true}]}}),
    ];
    for r in 0..rounds {
        entries.extend([
            write(
                "red",
                &admin,
                json!([
                    {"op": "upsert", "id": format!("a{r}"), "fields": {"n": r, "owner": format!("o{r}")},
                     "payload": {"round": r, "tags": ["x", "y"]}},
                    {"op": "upsert", "id": format!("b{r}"), "increment": {"n": 2}},
                ]),
            ),
            write("red", &red, json!([{"op": "upsert", "id": format!("c{r}"), "fields": {"n": 1}}])),
            // After a caller, the same sub and claims with another role, and the
            // same sub and role with other claims: both refused.
            write("red", &reader, json!([{"op": "upsert", "id": format!("e{r}"), "fields": {"n": 1}}])),
            write("red", &red, json!([{"op": "upsert", "id": format!("i{r}"), "fields": {"n": 1}}])),
            write("red", &blue, json!([{"op": "upsert", "id": format!("d{r}"), "fields": {"n": 1}}])),
            // Refused at its second op, once the first is in its batch.
            write(
                "red",
                &admin,
                json!([
                    {"op": "upsert", "id": format!("f{r}"), "fields": {"n": 7}, "payload": "kept?"},
                    {"op": "upsert", "id": format!("a{r}"), "fields": {"nope": 1}},
                ]),
            ),
            write("red", &admin, json!([{"op": "upsert", "id": format!("a{r}"), "set_max": {"n": 1000}}])),
            // A precondition that fails in the store, inside a group: nothing written.
            write(
                "red",
                &admin,
                json!([
                    {"op": "upsert", "id": format!("h{r}"), "fields": {"n": 3}},
                    {"op": "upsert", "id": format!("a{r}"), "if": {"version": 1}, "fields": {"n": 0}},
                ]),
            ),
            write("red", &admin, json!([{"op": "remove", "id": format!("b{}", r.saturating_sub(1))}])),
            write("blue", &blue, json!([{"op": "upsert", "id": format!("g{r}"), "payload": null}])),
            // After `zed`, a caller differing only by its sub: refused.
            write("zed", &zed, json!([{"op": "upsert", "id": format!("j{r}"), "fields": {"n": 1}}])),
            write("zed", &stranger, json!([{"op": "upsert", "id": format!("k{r}"), "fields": {"n": 1}}])),
        ]);
    }
    entries
}

/// What the entries leave: in `red`, `a{r}` (n = 1000, its owner and payload),
/// `b{last}`, `c{r}`, `i{r}`; in `blue`, `g{r}`; in `zed`, `j{r}`. Nothing of
/// `d`, `e`, `f`, `h`, `k`.
fn check_expected(red: &[Value], blue: &[Value], zed: &[Value], rounds: usize) {
    let mut ids: Vec<String> = red.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    let mut expected: Vec<String> = (0..rounds)
        .flat_map(|r| [format!("a{r}"), format!("c{r}"), format!("i{r}")])
        .chain([format!("b{}", rounds - 1)])
        .collect();
    expected.sort();
    assert_eq!(ids, expected, "red's items");
    for item in red.iter().filter(|item| item["id"].as_str().unwrap().starts_with('a')) {
        let r: u64 = item["id"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(item["fields"], json!({"n": 1000, "owner": format!("o{r}")}), "{item}");
        assert_eq!(item["payload"], json!({"round": r, "tags": ["x", "y"]}), "{item}");
    }
    for item in red.iter().filter(|item| item["id"].as_str().unwrap().starts_with(['c', 'i'])) {
        assert_eq!(item["fields"], json!({"n": 1, "owner": null}), "{item}");
        assert_eq!(item["payload"], Value::Null, "{item}");
    }
    let blue_ids: Vec<&str> = blue.iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(blue_ids.len(), rounds, "blue's items: {blue_ids:?}");
    let mut zed_ids: Vec<&str> = zed.iter().map(|item| item["id"].as_str().unwrap()).collect();
    zed_ids.sort();
    let mut expected: Vec<String> = (0..rounds).map(|r| format!("j{r}")).collect();
    expected.sort();
    assert_eq!(zed_ids, expected, "zed's items");
}

#[test]
fn a_node_catching_up_in_runs_reaches_the_state_of_one_applying_each_entry_alone() {
    const ROUNDS: usize = 12;
    let nats = NatsCluster::start(1);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(dir_a.path(), &nats.urls(), "a");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let js = runtime.block_on(async { async_nats::jetstream::new(async_nats::connect(nats.url(0)).await.unwrap()) });
    let mut last = 0;
    for (index, entry) in entries(ROUNDS).iter().enumerate() {
        last = runtime.block_on(async {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(format!("test/catchup/{index}"))
                .payload(entry.to_string().into_bytes().into());
            common::cluster::seq_of_message(js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence)
        });
        // Node a applies each entry in a run of its own.
        wait_applied(&a, last);
    }
    let (red_a, blue_a, zed_a) = (items(&a, "red", last), items(&a, "blue", last), items(&a, "zed", last));
    check_expected(&red_a, &blue_a, &zed_a, ROUNDS);

    // A new node gets the whole stream at once: its consumer hands it runs.
    let b = node(dir_b.path(), &nats.urls(), "b");
    wait_applied(&b, last);
    assert_eq!(applied_seq(&b), last);
    let (red_b, blue_b, zed_b) = (items(&b, "red", last), items(&b, "blue", last), items(&b, "zed", last));
    assert_eq!(red_b, red_a, "the same items, versions and payloads in runs as one by one");
    assert_eq!(blue_b, blue_a);
    assert_eq!(zed_b, zed_a);
    check_expected(&red_b, &blue_b, &zed_b, ROUNDS);
}

/// The names of the stream's consumers, sorted.
fn consumer_names(runtime: &tokio::runtime::Runtime, js: &async_nats::jetstream::Context) -> Vec<String> {
    use futures_util::TryStreamExt;
    runtime.block_on(async {
        let stream = js.get_stream("ORDO").await.unwrap();
        let mut names: Vec<String> = stream.consumer_names().try_collect().await.unwrap();
        names.sort();
        names
    })
}

/// A consumer this node gave up on (here: paused, so it delivers nothing
/// while the stream holds more, and the node consumes again) is deleted by the
/// node, not left to the server's inactivity timeout (30 s).
#[test]
fn the_consumer_of_an_earlier_generation_is_deleted() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), &nats.urls(), "a");
    let schema = json!({"fields": [{"name": "n", "type": "u64"}]});
    let (status, body) = a.http("PUT", "/v1/collections/things", Some(&schema));
    assert_eq!(status, 201, "{body}");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _context = runtime.enter();
    let client = runtime.block_on(async_nats::connect(nats.url(0))).unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let first = consumer_names(&runtime, &js);
    assert_eq!(first.len(), 1, "one consumer: {first:?}");

    let pause = json!({"pause_until": "2100-01-01T00:00:00Z"}).to_string();
    let subject = format!("$JS.API.CONSUMER.PAUSE.ORDO.{}", first[0]);
    let answer = runtime.block_on(client.request(subject, pause.into())).unwrap();
    let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(answer["paused"], true, "{answer}");
    let seq = runtime.block_on(async {
        let entry = write("things", &json!({"sub": "w", "role": "admin"}), json!([{"op": "upsert", "id": "x"}]));
        let publish = async_nats::jetstream::context::Publish::build()
            .message_id("test/generations/1")
            .payload(entry.to_string().into_bytes().into());
        common::cluster::seq_of_message(js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence)
    });
    // The node restarts its consumer once it has lagged, applying nothing, for 2 s.
    wait_applied(&a, seq);
    // Well inside the server's own 30 s: only the node's deletion removes it this soon.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let names = consumer_names(&runtime, &js);
        if names.len() == 1 && !names.contains(&first[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "the first generation's consumer is still there: {names:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
