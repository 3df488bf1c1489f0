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
