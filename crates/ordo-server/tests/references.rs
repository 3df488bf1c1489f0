//! `ref` fields on the wire: created with a collection or added later, listed
//! with their target's name, checked (unknown target, missing target, a target
//! on a non-ref field), kept across a restart, and a referenced collection is
//! not dropped.

mod common;

use common::Server;
use serde_json::{json, Value};

fn error_code(answer: &Value) -> Option<&str> {
    answer["error"]["code"].as_str()
}

#[test]
fn ref_fields_are_created_listed_checked_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    server.ok(
        "PUT",
        "/v1/collections/rooms",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"}]}),
    );
    let members =
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"}]});
    let created = server.ok("PUT", "/v1/collections/members", members.clone());
    assert_eq!(created["fields"], members["fields"]);

    // Bad input: each a clear `invalid_schema`.
    let bad = [
        json!({"fields": [{"name": "room", "type": "ref", "target": "nope"}]}),
        json!({"fields": [{"name": "room", "type": "ref"}]}),
        json!({"fields": [{"name": "room", "type": "string", "target": "rooms"}]}),
    ];
    for body in bad {
        let (status, answer) = server.http_as(None, "PUT", "/v1/collections/bad", Some(&body));
        assert_eq!((status, error_code(&answer)), (400, Some("invalid_schema")), "{body}: {answer}");
    }
    // A cycle of references is refused.
    let (status, answer) = server.http_as(
        None,
        "POST",
        "/v1/collections/rooms/fields",
        Some(&json!({"name": "back", "type": "ref", "target": "members"})),
    );
    assert_eq!((status, error_code(&answer)), (400, Some("invalid_schema")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("cycle"), "{answer}");
    // Values are strings: the target's id.
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"recency": 5}}]}),
    );
    server.ok(
        "POST",
        "/v1/collections/members/batch",
        json!({"ops": [{"op": "upsert", "id": "a/r1", "fields": {"owner": "a", "room": "r1"}}]}),
    );
    let (status, answer) = server.http_as(
        None,
        "POST",
        "/v1/collections/members/batch",
        Some(&json!({"ops": [{"op": "upsert", "id": "a/r2", "fields": {"room": 7}}]})),
    );
    assert_eq!((status, error_code(&answer)), (422, Some("invalid_batch")), "{answer}");
    // A referenced collection stays until the ref field is removed.
    let (status, answer) = server.http_as(None, "DELETE", "/v1/collections/rooms", None);
    assert_eq!((status, error_code(&answer)), (400, Some("invalid_schema")), "{answer}");
    // Added later, and kept across a restart.
    server.ok("PUT", "/v1/collections/topics", json!({"fields": [{"name": "title", "type": "string"}]}));
    let added = server.ok(
        "POST",
        "/v1/collections/members/fields",
        json!({"name": "topic", "type": "ref", "target": "topics"}),
    );
    assert_eq!(added["fields"][2], json!({"name": "topic", "type": "ref", "target": "topics"}));
    server.stop();
    let server = Server::start(&data, &[]);
    let listed = server.ok("GET", "/v1/collections/members", Value::Null);
    assert_eq!(listed["fields"][1], json!({"name": "room", "type": "ref", "target": "rooms"}));
    assert_eq!(listed["fields"][2], json!({"name": "topic", "type": "ref", "target": "topics"}));
    let item = server.ok("GET", "/v1/collections/members/items/a%2Fr1", Value::Null);
    assert_eq!(item["fields"]["room"], "r1");
    server.ok("DELETE", "/v1/collections/members/fields/room", Value::Null);
    server.ok("DELETE", "/v1/collections/rooms", Value::Null);
    server.stop();
}
