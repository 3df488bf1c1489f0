//! `/metrics` figures that are not counters of traffic: the checkpoint lag and
//! the stage histograms, on a real server.

mod common;

use common::{room_schema, Server};
use serde_json::json;

#[test]
fn checkpoint_lag_counts_the_batches_only_the_log_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    // Creating a collection checkpoints first, so the lag starts at 0.
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 0.0);
    for n in 0..3 {
        let op = json!({"op": "upsert", "id": format!("!r{n}"), "fields": {"recency": n}});
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [op]}));
    }
    // The default interval is 60 s: all three are in the log only.
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 3.0);
    // Each write went through every stage once.
    assert_eq!(server.metric("ordo_stage_seconds_count{stage=\"log_append\"}"), 3.0);
    assert_eq!(server.metric("ordo_stage_seconds_count{stage=\"write_queue\"}"), 3.0);
    // A graceful stop checkpoints: the next start replays nothing.
    server.stop();
    let server = Server::start(dir.path(), &[]);
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 0.0);
    assert_eq!(server.metric("ordo_last_seq"), 3.0);
    server.stop();
}

/// The signal handlers are in place before the address is printed: a SIGINT
/// or SIGTERM that comes at once still stops the server gracefully (it used to
/// kill it when it won the race with the handler's installation).
#[test]
fn a_signal_right_after_the_address_is_printed_stops_the_server_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..10 {
        Server::start(dir.path(), &[]).stop();
    }
    let mut server = Server::start(dir.path(), &[]);
    // SAFETY: `kill` with the pid of a child we own and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) };
    let status = server.wait();
    assert!(status.success(), "ordo exited with {status}");
}

/// `ordo_batches_refused_total` is one per error a write request is answered
/// with, wherever it was refused: the body, the collection, a value checked on
/// the network thread, a part of a multi-collection batch, the op limit, the
/// engine. (It used to count only the refusals of the writer thread.)
#[test]
fn refused_batches_are_counted_as_answered() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let upsert = |id: &str, fields: serde_json::Value| json!({"op": "upsert", "id": id, "fields": fields});
    let too_many: Vec<_> =
        (0..=ordo_server::limits::MAX_OPS_PER_REQUEST).map(|n| upsert(&format!("r{n}"), json!({}))).collect();
    let requests: Vec<(&str, String, Vec<u8>)> = vec![
        // A value that does not fit (checked before the writer).
        (
            "POST",
            "/v1/collections/rooms/batch".into(),
            json!({"ops": [upsert("r1", json!({"recency": -1}))]}).to_string().into(),
        ),
        (
            "POST",
            "/v1/collections/rooms/batch".into(),
            json!({"ops": [upsert("r1", json!({"nope": 1}))]}).to_string().into(),
        ),
        // Not JSON, or not a batch.
        ("POST", "/v1/collections/rooms/batch".into(), b"{\"ops\": [".to_vec()),
        ("POST", "/v1/collections/rooms/batch".into(), b"{\"opz\": []}".to_vec()),
        // No such collection.
        ("POST", "/v1/collections/missing/batch".into(), json!({"ops": []}).to_string().into()),
        ("DELETE", "/v1/collections/missing/items/r1".into(), Vec::new()),
        // An empty id: the engine refuses it, on the writer thread.
        ("POST", "/v1/collections/rooms/batch".into(), json!({"ops": [upsert("", json!({}))]}).to_string().into()),
        // Over the op limit.
        ("POST", "/v1/collections/rooms/batch".into(), json!({"ops": too_many}).to_string().into()),
        // Two parts refused before the writer, one written.
        (
            "POST",
            "/v1/batch".into(),
            json!({"writes": [
                {"collection": "missing", "ops": [upsert("r1", json!({}))]},
                {"collection": "rooms", "ops": [upsert("r1", json!({"recency": 1}))]},
                {"collection": "rooms", "ops": [upsert("r2", json!({"score": 9007199254740993u64}))]},
            ]})
            .to_string()
            .into(),
        ),
        // Written.
        (
            "POST",
            "/v1/collections/rooms/batch".into(),
            json!({"ops": [upsert("r3", json!({"recency": 3}))]}).to_string().into(),
        ),
        ("DELETE", "/v1/collections/rooms/items/r3".into(), Vec::new()),
    ];
    let (mut n_errors, mut n_acks) = (0, 0);
    for (method, path, body) in &requests {
        let (status, answer) = server.http_raw(method, path, Some(body));
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let results = match answer.get("results") {
            Some(results) => results.as_array().unwrap().clone(),
            None => vec![answer],
        };
        for result in results {
            if result.get("error").is_some() {
                n_errors += 1;
            } else {
                assert!(status == 200 || path == "/v1/batch", "{path}: {status} {result}");
                n_acks += 1;
            }
        }
    }
    assert_eq!((n_errors, n_acks), (10, 3));
    assert_eq!(server.metric("ordo_batches_refused_total"), n_errors as f64);
    assert_eq!(server.metric("ordo_batches_total"), n_acks as f64);
    server.stop();
}

/// The same agreement with auth on: refusals by the `Origin` gate, by auth and
/// by the rules on the network thread, and by a write rule's guard on the
/// writer thread, in single writes and in parts of a `/v1/batch`.
#[test]
fn refused_batches_are_counted_as_answered_with_auth() {
    let dir = tempfile::tempdir().unwrap();
    let secret = common::write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(common::mint(&secret, "ops", "admin", &[]));
    let schema = json!({"fields": [{"name": "owner", "type": "string"}]});
    server.ok("PUT", "/v1/collections/notes", schema);
    let upsert = |id: &str, owner: &str| json!({"op": "upsert", "id": id, "fields": {"owner": owner}});
    server.ok("POST", "/v1/collections/notes/batch", json!({"ops": [upsert("bobs", "bob")]}));
    server.ok(
        "PUT",
        "/v1/rules",
        json!({"rules": [{"collection": "notes", "roles": ["writer"],
            "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]}),
    );
    let alice = common::mint(&secret, "alice", "writer", &[]);
    let reader = common::mint(&secret, "rita", "reader", &[]);
    let batch = |ops: serde_json::Value| Some(json!({"ops": ops}));
    let answers = [
        server.http_as(None, "POST", "/v1/collections/notes/batch", batch(json!([upsert("a1", "alice")])).as_ref()),
        server.http_as(
            Some(&reader),
            "POST",
            "/v1/collections/notes/batch",
            batch(json!([upsert("a1", "rita")])).as_ref(),
        ),
        server.http_as(
            Some(&alice),
            "POST",
            "/v1/collections/notes/batch",
            batch(json!([upsert("a1", "bob")])).as_ref(),
        ),
        server.http_as(
            Some(&alice),
            "POST",
            "/v1/collections/notes/batch",
            batch(json!([upsert("a1", "alice")])).as_ref(),
        ),
        server.http_as(Some(&alice), "DELETE", "/v1/collections/notes/items/bobs", None),
        server.http_as(
            Some(&alice),
            "POST",
            "/v1/batch",
            Some(&json!({"writes": [
                {"collection": "notes", "ops": [upsert("a2", "bob")]},
                {"collection": "notes", "ops": [upsert("a3", "alice")]},
            ]})),
        ),
    ];
    let mut n_errors = 0;
    for (status, answer) in &answers {
        let results = answer.get("results").and_then(|results| results.as_array()).cloned();
        let results = results.unwrap_or_else(|| vec![answer.clone()]);
        n_errors += results.iter().filter(|result| result.get("error").is_some()).count();
        assert!(*status == 200 || answer.to_string().contains("error"), "{status} {answer}");
    }
    let (status, _) = server.http_with(
        "POST",
        "/v1/collections/notes/batch",
        &format!("Authorization: Bearer {alice}\r\nOrigin: http://evil.example\r\n"),
        Some(json!({"ops": [upsert("a4", "alice")]}).to_string().as_bytes()),
    );
    assert_eq!(status, 403);
    n_errors += 1;
    assert_eq!(n_errors, 6, "{answers:#?}");
    assert_eq!(server.metric("ordo_batches_refused_total"), n_errors as f64);
    // The admin's write, Alice's own item, and her `/v1/batch` part that was hers.
    assert_eq!(server.metric("ordo_batches_total"), 3.0);
    server.stop();
}
