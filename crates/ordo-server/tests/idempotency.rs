//! `Idempotency-Key` on the write routes, against a real `ordo serve`: a
//! retry gets the first answer and applies nothing again; a key is its
//! caller's own and names one request.

mod common;

use std::io::Write;
use std::net::TcpStream;

use common::{mint, room_schema, write_secret, Server};
use serde_json::{json, Value};

const BATCH: &str = "/v1/collections/rooms/batch";

fn start(dir: &std::path::Path, args: &[&str]) -> Server {
    let server = Server::start(dir, args);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server
}

fn increment(id: &str) -> Vec<u8> {
    json!({"ops": [{"op": "upsert", "id": id, "increment": {"unread": 1}}]}).to_string().into_bytes()
}

/// A request with `Idempotency-Key: key` (and a token, when given).
fn send(server: &Server, token: Option<&str>, method: &str, path: &str, key: &str, body: &[u8]) -> (u16, Value) {
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let headers = format!("{auth}Idempotency-Key: {key}\r\n");
    let (status, bytes) = server.http_with(method, path, &headers, Some(body));
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// The whole answer (head and body) to a batch with `key`, as text.
fn answer_text(server: &Server, key: &str, body: &[u8]) -> String {
    use std::io::Read;
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let head = format!(
        "POST {BATCH} HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.to_ascii_lowercase()
}

fn unread(server: &Server, token: Option<&str>, id: &str) -> Value {
    let (status, item) = server.http_as(token, "GET", &format!("/v1/collections/rooms/items/{id}"), None);
    assert_eq!(status, 200, "{item}");
    item["fields"]["unread"].clone()
}

#[test]
fn a_retry_after_a_lost_answer_applies_once_and_gets_the_first_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let body = increment("r1");
    // The first attempt's answer is lost: the client hangs up without reading it.
    let mut lost = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let head = format!(
        "POST {BATCH} HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: inc-1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    lost.write_all(head.as_bytes()).unwrap();
    lost.write_all(&body).unwrap();
    drop(lost);
    let (status, first) = send(&server, None, "POST", BATCH, "inc-1", &body);
    assert_eq!(status, 200, "{first}");
    let (status, again) = send(&server, None, "POST", BATCH, "inc-1", &body);
    assert_eq!((status, &again), (200, &first));
    assert_eq!(unread(&server, None, "r1"), 1);
    // Another key is another request.
    let (status, other) = send(&server, None, "POST", BATCH, "inc-2", &body);
    assert_eq!(status, 200, "{other}");
    assert!(other["seq"].as_u64() > first["seq"].as_u64(), "{other} {first}");
    assert_eq!(unread(&server, None, "r1"), 2);
    // A replay says so; a first answer does not.
    let first = answer_text(&server, "inc-3", &body);
    assert!(!first.contains("idempotent-replayed: true"), "{first}");
    assert!(answer_text(&server, "inc-3", &body).contains("idempotent-replayed: true"));
    server.stop();
}

#[test]
fn requests_with_one_key_at_once_apply_once_and_all_get_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let body = increment("r1");
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..8).map(|_| scope.spawn(|| send(&server, None, "POST", BATCH, "together", &body))).collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    assert_eq!(answers[0].0, 200, "{}", answers[0].1);
    assert!(answers.iter().all(|answer| *answer == answers[0]), "{answers:?}");
    assert_eq!(unread(&server, None, "r1"), 1);
    server.stop();
}

#[test]
fn a_key_sent_again_with_another_request_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let (status, _) = send(&server, None, "POST", BATCH, "k", &increment("r1"));
    assert_eq!(status, 200);
    // Another body, the same route.
    let (status, refused) = send(&server, None, "POST", BATCH, "k", &increment("r2"));
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{refused}");
    // The same body on another route.
    let multi =
        json!({"writes": [{"collection": "rooms", "ops": [{"op": "upsert", "id": "r1", "increment": {"unread": 1}}]}]});
    let (status, refused) = send(&server, None, "POST", "/v1/batch", "k", multi.to_string().as_bytes());
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{refused}");
    assert_eq!(unread(&server, None, "r1"), 1);
    let (status, missing) = server.http("GET", "/v1/collections/rooms/items/r2", None);
    assert_eq!(status, 404, "{missing}");
    server.stop();
}

/// Each caller's keys are its own: another identity's `k` is another request,
/// and never gets the first caller's answer.
#[test]
fn a_key_is_its_callers_own() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server.ok(
        "PUT",
        "/v1/rules",
        json!({"rules": [{"collection": "rooms", "roles": ["writer"], "read": true, "write": true}]}),
    );
    let alice = mint(&secret, "alice", "writer", &[]);
    let bob = mint(&secret, "bob", "writer", &[]);
    let (status, alices) = send(&server, Some(&alice), "POST", BATCH, "k", &increment("r1"));
    assert_eq!(status, 200, "{alices}");
    let (status, bobs) = send(&server, Some(&bob), "POST", BATCH, "k", &increment("r1"));
    assert_eq!(status, 200, "{bobs}");
    assert_ne!(alices, bobs);
    assert_eq!(unread(&server, Some(&alice), "r1"), 2);
    // Bob's other body under the same key is refused for his key, not alice's.
    let (status, refused) = send(&server, Some(&bob), "POST", BATCH, "k", &increment("r2"));
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{refused}");
    server.stop();
}

#[test]
fn a_removal_and_a_multi_batch_sent_again_answer_as_the_first_time() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    server.ok("POST", BATCH, json!({"ops": [{"op": "upsert", "id": "r1", "fields": {}}]}));
    let path = "/v1/collections/rooms/items/r1";
    let (status, removed) = send(&server, None, "DELETE", path, "del-1", b"");
    assert_eq!((status, &removed["removed"]), (200, &json!(true)), "{removed}");
    let (status, again) = send(&server, None, "DELETE", path, "del-1", b"");
    assert_eq!((status, &again), (200, &removed));
    // Without the key, the same removal is a new one that finds nothing.
    let (_, fresh) = server.http("DELETE", path, None);
    assert_eq!(fresh["removed"], json!(false), "{fresh}");

    let multi = json!({"writes": [{"collection": "rooms", "ops": [{"op": "upsert", "id": "r2", "increment": {"unread": 1}}]},
                                  {"collection": "nowhere", "ops": [{"op": "upsert", "id": "x"}]}]});
    let (status, first) = send(&server, None, "POST", "/v1/batch", "multi-1", multi.to_string().as_bytes());
    assert_eq!(status, 422, "{first}");
    let (status, again) = send(&server, None, "POST", "/v1/batch", "multi-1", multi.to_string().as_bytes());
    assert_eq!((status, &again), (422, &first));
    assert_eq!(unread(&server, None, "r2"), 1);
    server.stop();
}

#[test]
fn keys_are_checked_at_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let longest = "k".repeat(128);
    let (status, answer) = send(&server, None, "POST", BATCH, &longest, &increment("r1"));
    assert_eq!(status, 200, "{answer}");
    for bad in ["k".repeat(129), "a b".to_owned(), "a/b".to_owned(), "é".to_owned()] {
        let (status, answer) = send(&server, None, "POST", BATCH, &bad, &increment("r1"));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{bad}: {answer}");
    }
    let twice = "Idempotency-Key: a\r\nIdempotency-Key: a\r\n";
    let (status, _) = server.http_with("POST", BATCH, twice, Some(&increment("r1")));
    assert_eq!(status, 400);
    assert_eq!(unread(&server, None, "r1"), 1);
    server.stop();
}

/// In cluster mode the node that took a write remembers its answer: a retry
/// there gets it (the same global `seq`), and the write is applied once on
/// every node, a multi-collection batch's parts included.
#[test]
fn in_a_cluster_a_retry_on_the_same_node_applies_once() {
    let cluster = common::cluster::OrdoCluster::start(1, 2);
    let (first_node, other_node) = (cluster.node(0), cluster.node(1));
    first_node.ok("PUT", "/v1/collections/rooms", room_schema());
    let body = increment("r1");
    let (status, first) = send(first_node, None, "POST", BATCH, "inc-1", &body);
    assert_eq!(status, 200, "{first}");
    let (status, again) = send(first_node, None, "POST", BATCH, "inc-1", &body);
    assert_eq!((status, &again), (200, &first));
    let multi = json!({"writes": [{"collection": "rooms", "ops": [{"op": "upsert", "id": "r2", "increment": {"unread": 1}}]},
                                  {"collection": "rooms", "ops": [{"op": "upsert", "id": "r3", "increment": {"unread": 1}}]}]});
    let (status, parts) = send(first_node, None, "POST", "/v1/batch", "multi-1", multi.to_string().as_bytes());
    assert_eq!(status, 200, "{parts}");
    let (status, again) = send(first_node, None, "POST", "/v1/batch", "multi-1", multi.to_string().as_bytes());
    assert_eq!((status, &again), (200, &parts));
    let last_seq = parts["results"][1]["seq"].as_u64().expect("a seq");
    assert!(cluster.wait_converged(std::time::Duration::from_secs(30)) >= last_seq);
    for node in [first_node, other_node] {
        for id in ["r1", "r2", "r3"] {
            let path = format!("/v1/collections/rooms/items/{id}");
            let (status, item) = node.http("GET", &path, None);
            assert_eq!((status, &item["fields"]["unread"]), (200, &json!(1)), "{id}: {item}");
        }
    }
}
