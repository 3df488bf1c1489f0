//! The `rooms` collection every recorded case writes to: its schema, rooms
//! made by hand or at random, random views of them, and one-shot queries to
//! check a subscription's list against.

use serde_json::{json, Value};

use crate::common::{self, Rng, Server};

pub(crate) fn schema() -> Value {
    json!({"fields": [
        {"name": "name", "type": "string"},
        {"name": "recency", "type": "u64"},
        {"name": "unread", "type": "u64"},
        {"name": "dm", "type": "bool"},
    ]})
}

/// The one-shot query of a subscription's view, on its collection.
pub(crate) fn query(server: &Server, view: &Value) -> Vec<Value> {
    let mut body = json!({"filter": view["filter"], "sort": view["sort"], "limit": view["limit"]});
    if view.get("tail").is_some_and(|tail| tail == true) {
        body["tail"] = json!(true);
    } else {
        body["offset"] = view["offset"].clone();
    }
    if let Some(fields) = view.get("fields") {
        body["fields"] = fields.clone();
    }
    if let Some(payload) = view.get("payload") {
        body["payload"] = payload.clone();
    }
    let collection = view["collection"].as_str().unwrap_or("rooms");
    let answer = server.ok("POST", &format!("/v1/collections/{collection}/query"), body);
    common::query_items(&answer["items"])
}

pub(crate) fn write(server: &Server, ops: Value) {
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
}

pub(crate) fn room(n: u64, name: &str, recency: u64, unread: u64, dm: bool) -> Value {
    json!({"op": "upsert", "id": format!("!r{n:02}:example.org"), "fields": {
        "name": name, "recency": recency, "unread": unread, "dm": dm,
    }, "payload": {"last": format!("message {recency}")}})
}

pub(crate) fn random_op(rng: &mut Rng, n_ids: u64) -> Value {
    let id = format!("!r{:02}:example.org", rng.below(n_ids));
    if rng.chance(12) {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = serde_json::Map::new();
    if rng.chance(70) {
        fields.insert("recency".into(), json!(rng.below(1_000)));
    }
    if rng.chance(40) {
        fields.insert("unread".into(), json!(rng.below(4)));
    }
    if rng.chance(25) {
        fields.insert("dm".into(), json!(rng.chance(50)));
    }
    if rng.chance(30) {
        let names = ["alice", "Bob", "Chloé", "Émile", "émile", "zoë", "Łucja", "東京", "ab", "Abby"];
        fields.insert("name".into(), json!(names[rng.below(names.len() as u64) as usize]));
    }
    let mut op = json!({"op": "upsert", "id": id, "fields": fields});
    if rng.chance(25) {
        op["payload"] = json!({"last": format!("message {}", rng.below(100))});
    }
    op
}

pub(crate) fn random_filter(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => Value::Null,
        1 => json!({"field": "unread", "op": "gt", "value": 0}),
        2 => json!({"field": "dm", "op": "eq", "value": true}),
        3 => json!({"field": "name", "contains": "É"}),
        _ => json!({"any": [{"field": "dm", "op": "eq", "value": true}, {"field": "unread", "op": "ge", "value": 2}]}),
    }
}

pub(crate) fn random_sort(rng: &mut Rng) -> Value {
    match rng.below(3) {
        0 => json!([{"field": "recency", "dir": "desc"}]),
        1 => json!([{"field": "name", "dir": "asc", "case_insensitive": true}]),
        _ => json!([{"field": "unread", "dir": "desc"}, {"field": "recency", "dir": "desc"}]),
    }
}

/// A fresh collection with `n` rooms.
pub(crate) fn reset_rooms(server: &Server, n: u64) {
    let existing = query(server, &json!({"filter": null, "sort": [], "offset": 0, "limit": 1000}));
    let removes: Vec<Value> = existing.iter().map(|item| json!({"op": "remove", "id": item["id"]})).collect();
    if !removes.is_empty() {
        write(server, Value::Array(removes));
    }
    let names = ["alice", "Bob", "Chloé", "Dmitri", "Émile", "zoë", "Łucja", "東京"];
    let ops: Vec<Value> =
        (0..n).map(|i| room(i, names[(i % 8) as usize], 100 + i * 7 % 50, i % 3, i % 4 == 0)).collect();
    if !ops.is_empty() {
        write(server, Value::Array(ops));
    }
}

pub(crate) fn subscribe(sub: &str, filter: Value, sort: Value, offset: u64, limit: u64) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "rooms", "filter": filter, "sort": sort,
           "offset": offset, "limit": limit})
}
