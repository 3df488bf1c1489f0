//! Atomic field operations, conditional writes and item versions over HTTP,
//! against a real `ordo serve`.

mod common;

use std::time::Duration;

use common::{mint, room_schema, write_secret, Server};
use serde_json::{json, Value};

fn start(dir: &std::path::Path) -> Server {
    let server = Server::start(dir, &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server
}

fn batch(server: &Server, ops: Value) -> (u16, Value) {
    server.http("POST", "/v1/collections/rooms/batch", Some(&json!({ "ops": ops })))
}

fn get(server: &Server, id: &str) -> (u16, Value) {
    server.http("GET", &format!("/v1/collections/rooms/items/{id}"), None)
}

/// The test: two writers each doing `unread += 1` fifty times, at once,
/// leave exactly 100 (with read-modify-write from the client they left 78).
#[test]
fn two_concurrent_writers_incrementing_fifty_times_each_give_exactly_100() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [{"op": "upsert", "id": "r1", "fields": {}}]}));
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..50 {
                    let (status, answer) =
                        batch(&server, json!([{"op": "upsert", "id": "r1", "increment": {"unread": 1}}]));
                    assert_eq!(status, 200, "{answer}");
                }
            });
        }
    });
    let (status, item) = get(&server, "r1");
    assert_eq!(status, 200, "{item}");
    assert_eq!(item["fields"]["unread"], 100, "{item}");
    server.stop();
}

#[test]
fn atomic_operations_follow_their_rules_and_refuse_overflows_naming_the_op() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    // Null counts as 0; set_max on null sets; decrement by a negative increment.
    let (status, answer) = batch(
        &server,
        json!([{"op": "upsert", "id": "r1", "increment": {"unread": 3, "score": 0.5},
                "set_max": {"recency": 17}, "set_min": {"name": "m"}},
               {"op": "upsert", "id": "r1", "increment": {"unread": -1}, "set_max": {"recency": 12},
                "set_min": {"name": "b"}, "decrement": {"score": 2}}]),
    );
    assert_eq!(status, 200, "{answer}");
    let (_, item) = get(&server, "r1");
    assert_eq!(item["fields"], json!({"name": "b", "recency": 17, "unread": 2, "dm": null, "score": -1.5}));

    // Overflows at the edges: refused whole, with the op and the field named.
    let u64_max = u64::MAX;
    for (what, ops, op_index) in [
        ("u64 below 0", json!([{"op": "upsert", "id": "r1", "decrement": {"unread": 3}}]), 0),
        (
            "u64 above its maximum",
            json!([{"op": "upsert", "id": "r2", "fields": {"unread": u64_max}},
                   {"op": "upsert", "id": "r2", "increment": {"unread": 1}}]),
            1,
        ),
        (
            "f64 to infinity",
            json!([{"op": "upsert", "id": "r1", "increment": {"score": 1.7e308}},
                                   {"op": "upsert", "id": "r1", "increment": {"score": 1.7e308}}]),
            1,
        ),
    ] {
        let (status, answer) = batch(&server, ops);
        assert_eq!((status, answer["error"]["code"].as_str()), (422, Some("invalid_batch")), "{what}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("op {op_index}:")) && message.contains('`'), "{what}: {message}");
    }
    // Exactly at the edges: accepted.
    let (status, answer) = batch(
        &server,
        json!([{"op": "upsert", "id": "r2", "fields": {"unread": u64_max - 1}, "set_min": {"recency": 0}},
               {"op": "upsert", "id": "r2", "increment": {"unread": 1}},
               {"op": "upsert", "id": "r1", "decrement": {"unread": 2}}]),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(get(&server, "r2").1["fields"]["unread"], u64_max);
    assert_eq!(get(&server, "r1").1["fields"]["unread"], 0);
    assert!(get(&server, "r2").1["fields"]["score"].is_null(), "nothing of the refused batches was written");

    // Misuse: a field named twice in one op, `if` with two conditions, a remove
    // with atomics (400); an operation on a type it does not apply to (422).
    for (what, ops, expected) in [
        (
            "set and increment",
            json!([{"op": "upsert", "id": "r1", "fields": {"unread": 1}, "increment": {"unread": 1}}]),
            (400, "bad_request"),
        ),
        (
            "increment and set_max",
            json!([{"op": "upsert", "id": "r1", "increment": {"unread": 1}, "set_max": {"unread": 1}}]),
            (400, "bad_request"),
        ),
        (
            "two conditions",
            json!([{"op": "upsert", "id": "r1", "if": {"exists": true, "version": 1}}]),
            (400, "bad_request"),
        ),
        ("an unknown condition", json!([{"op": "upsert", "id": "r1", "if": {"newer": 1}}]), (400, "bad_request")),
        (
            "a remove with atomics",
            json!([{"op": "remove", "id": "r1", "increment": {"unread": 1}}]),
            (400, "bad_request"),
        ),
        ("increment a string", json!([{"op": "upsert", "id": "r1", "increment": {"name": 1}}]), (422, "invalid_batch")),
        ("set_max a bool", json!([{"op": "upsert", "id": "r1", "set_max": {"dm": true}}]), (422, "invalid_batch")),
        (
            "increment by a float on u64",
            json!([{"op": "upsert", "id": "r1", "increment": {"unread": 0.5}}]),
            (422, "invalid_batch"),
        ),
        (
            "increment by null",
            json!([{"op": "upsert", "id": "r1", "increment": {"unread": null}}]),
            (422, "invalid_batch"),
        ),
        ("an unknown field", json!([{"op": "upsert", "id": "r1", "set_min": {"nope": 1}}]), (422, "invalid_batch")),
    ] {
        let (status, answer) = batch(&server, ops);
        assert_eq!((status, answer["error"]["code"].as_str().unwrap()), expected, "{what}: {answer}");
    }
    server.stop();
}

#[test]
fn a_failed_precondition_refuses_the_batch_with_a_conflict_naming_the_op() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let (status, answer) =
        batch(&server, json!([{"op": "upsert", "id": "r1", "if": {"exists": false}, "fields": {"unread": 1}}]));
    assert_eq!(status, 200, "{answer}");
    let created = answer["seq"].as_u64().unwrap();
    // The version GET answers is the seq of the write that last changed the item.
    let (_, item) = get(&server, "r1");
    assert_eq!(item["version"], created, "{item}");
    // Compare-and-set: the right version wins, the stale one conflicts.
    let (status, answer) =
        batch(&server, json!([{"op": "upsert", "id": "r1", "if": {"version": created}, "fields": {"unread": 5}}]));
    assert_eq!(status, 200, "{answer}");
    let updated = answer["seq"].as_u64().unwrap();
    let (status, answer) = batch(
        &server,
        json!([{"op": "upsert", "id": "r9", "fields": {"unread": 9}},
               {"op": "remove", "id": "r1"},
               {"op": "upsert", "id": "r1", "if": {"version": created}, "fields": {"unread": 7}}]),
    );
    assert_eq!(status, 409, "{answer}");
    // The remove before it leaves no item: the ops of a batch compose.
    assert_eq!(
        answer["error"],
        json!({"code": "conflict", "op": 2,
               "message": format!("op 2 (`r1`): expected version {created}, found no item")})
    );
    let (status, answer) =
        batch(&server, json!([{"op": "upsert", "id": "r1", "if": {"version": created}, "fields": {"unread": 7}}]));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        format!("op 0 (`r1`): expected version {created}, found {updated}"),
        "{answer}"
    );
    for (ops, op) in [
        (json!([{"op": "upsert", "id": "r1", "if": {"exists": false}}]), 0),
        (json!([{"op": "upsert", "id": "r1"}, {"op": "remove", "id": "r5", "if": {"exists": true}}]), 1),
    ] {
        let (status, answer) = batch(&server, ops);
        assert_eq!((status, &answer["error"]["code"], &answer["error"]["op"]), (409, &json!("conflict"), &json!(op)));
    }
    // Nothing of a refused batch was written.
    assert_eq!(get(&server, "r9").0, 404);
    let (_, item) = get(&server, "r1");
    assert_eq!((item["version"].as_u64(), &item["fields"]["unread"]), (Some(updated), &json!(5)), "{item}");
    // A multi-collection write: the conflicting part alone is refused, with 409.
    let (status, answer) = server.http(
        "POST",
        "/v1/batch",
        Some(&json!({"writes": [
            {"collection": "rooms", "ops": [{"op": "upsert", "id": "r1", "if": {"version": created}}]},
            {"collection": "rooms", "ops": [{"op": "upsert", "id": "r2", "increment": {"unread": 1}}]},
        ]})),
    );
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["results"][0]["error"]["op"], 0, "{answer}");
    assert!(answer["results"][1]["seq"].is_u64(), "{answer}");
    // A remove that holds its condition.
    let (status, answer) = batch(&server, json!([{"op": "remove", "id": "r1", "if": {"version": updated}}]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(get(&server, "r1").0, 404);
    server.stop();
}

/// Versions in GET and one-shot query answers, equal to the writes' seqs, the
/// same after a restart that replays the log (kill -9) and after one that
/// reads them from LMDB (a clean stop checkpoints). Diff frames carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_answered_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut client = server.connect().await;
    client.send(json!({"op": "subscribe", "sub": "all", "collection": "rooms", "offset": 0, "limit": 10})).await;
    let mut versions = Vec::new();
    for (id, unread) in [("a", 1), ("b", 2), ("a", 3)] {
        let (status, answer) = batch(&server, json!([{"op": "upsert", "id": id, "increment": {"unread": unread}}]));
        assert_eq!(status, 200, "{answer}");
        versions.retain(|(known, _)| *known != id);
        versions.push((id, answer["seq"].as_u64().unwrap()));
    }
    let check = |server: &Server, context: &str| {
        let answer = server.ok("POST", "/v1/collections/rooms/query", json!({"limit": 10}));
        for (id, version) in &versions {
            assert_eq!(get(server, id).1["version"], *version, "{context}: GET {id}");
            let item = answer["items"].as_array().unwrap().iter().find(|item| item["id"] == *id).unwrap();
            assert_eq!(item["version"], *version, "{context}: query {id}: {answer}");
        }
        assert_eq!(get(server, "a").1["fields"]["unread"], 4, "{context}");
    };
    check(&server, "before restarts");
    let mut n_frames = 0;
    while let Some(frame) = client.next_json(Duration::from_millis(500)).await {
        // Items in diff frames carry their version (the window digest covers it).
        for diff in frame["diffs"].as_array().into_iter().flatten() {
            let body = diff.as_object().unwrap().values().next().unwrap();
            let items: Vec<&Value> = match (body.get("value"), body.get("values")) {
                (Some(value), _) => vec![value],
                (_, Some(Value::Array(values))) => values.iter().collect(),
                _ => vec![],
            };
            assert!(items.iter().all(|item| item["version"].is_u64()), "an item without its version: {frame}");
        }
        n_frames += 1;
    }
    assert!(n_frames >= 2, "the subscription got its frames");
    drop(client);

    // kill -9: the next start replays the log.
    let mut server = server;
    // SAFETY: `kill` with a pid we own and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGKILL) };
    server.wait();
    let server = Server::start(dir.path(), &[]);
    check(&server, "after a replay");
    // A clean stop checkpoints: the next start reads versions from LMDB.
    server.stop();
    let server = Server::start(dir.path(), &[]);
    check(&server, "after a checkpoint");
    server.stop();
}

/// A write rule's pinned fields (`owner == $sub`) cannot be changed by an
/// atomic operation either; other fields can.
#[test]
fn atomic_operations_stay_inside_a_write_rule() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    server.token = Some(mint(&secret_file, "ops", "admin", &[]));
    server.ok(
        "PUT",
        "/v1/collections/notes",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "score", "type": "i64"}]}),
    );
    server.ok(
        "PUT",
        "/v1/rules",
        json!({"rules": [{"collection": "notes", "roles": ["writer"],
            "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}},
            "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]}),
    );
    let alice = mint(&secret_file, "alice", "writer", &[]);
    let write =
        |ops: Value| server.http_as(Some(&alice), "POST", "/v1/collections/notes/batch", Some(&json!({"ops": ops})));
    let (status, answer) =
        write(json!([{"op": "upsert", "id": "a1", "fields": {"owner": "alice"}, "increment": {"score": 2}}]));
    assert_eq!(status, 200, "{answer}");
    for ops in [
        json!([{"op": "upsert", "id": "a1", "set_max": {"owner": "bob"}}]),
        json!([{"op": "upsert", "id": "a1", "set_min": {"owner": "alice"}}]),
        json!([{"op": "upsert", "id": "a2", "fields": {"score": 1}, "set_max": {"owner": "alice"}}]),
    ] {
        let (status, answer) = write(ops.clone());
        assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{ops}: {answer}");
    }
    let (status, answer) =
        write(json!([{"op": "upsert", "id": "a1", "if": {"exists": true}, "decrement": {"score": 5}}]));
    assert_eq!(status, 200, "{answer}");
    let item = server.ok("POST", "/v1/collections/notes/query", json!({"limit": 10}));
    assert_eq!(item["items"][0]["fields"], json!({"owner": "alice", "score": -3}), "{item}");
    assert_eq!(item["items"].as_array().unwrap().len(), 1, "{item}");
    server.stop();
}
