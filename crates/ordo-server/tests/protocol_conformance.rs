//! What a client written from docs/PROTOCOL.md alone relies on, around schema
//! changes and a few less travelled corners: the Reset after a schema change
//! has that change's `seq` as its `write_seq`; `set_view` on a subscription
//! opened before a field was added can name the new field (also through a new
//! `ref` field); an explicit projection stays as listed when a field is added,
//! even when it listed every field; a resume after a removal that did not end
//! the subscription, and a `set_view` that made it read through a reference,
//! does not end it; tail windows, a `set_view` that changes the view's total
//! but not the window, and the order of projected fields behave as documented.

mod common;

use std::time::{Duration, Instant};

use common::{query_items, Client, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

fn batch(server: &Server, collection: &str, ops: Value) -> u64 {
    server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }))["seq"].as_u64().unwrap()
}

/// Waits for the next diff frame of `sub` (after those already seen) and returns it.
async fn next_frame(client: &mut Client, sub: &str) -> Value {
    client.diffs_seen.clear();
    let found = client.read_until(SETTLE, |client| client.diffs_seen.iter().any(|frame| frame["sub"] == sub)).await;
    assert!(found, "no diff frame for {sub}; other frames: {:?}", client.frames);
    client.diffs_seen.iter().find(|frame| frame["sub"] == sub).unwrap().clone()
}

/// Waits for the answer to the request `req`: a diff frame or a non-diff frame
/// (`ack`, `error`) carrying it.
async fn answer_to(client: &mut Client, req: &str) -> Value {
    let answer = |client: &Client| {
        client.diffs_seen.iter().chain(client.frames.iter()).find(|frame| frame["req"] == req).cloned()
    };
    let found = client.read_until(SETTLE, |client| answer(client).is_some()).await;
    assert!(found, "no answer to {req}; frames: {:?}", client.frames);
    answer(client).unwrap()
}

/// Reads frames until the list of `sub` equals `expected`.
async fn settle_to(client: &mut Client, sub: &str, expected: &[Value], what: &str) {
    let equal =
        client.read_until(SETTLE, |client| client.lists.get(sub).is_some_and(|list| list.items == expected)).await;
    assert!(equal, "{what}: list {sub} = {:?}, expected {expected:?}", client.lists.get(sub).map(|list| &list.items));
}

/// The items a one-shot query of `collection` answers with `body`, as a subscription shows them.
fn query(server: &Server, collection: &str, body: Value) -> Vec<Value> {
    query_items(&server.ok("POST", &format!("/v1/collections/{collection}/query"), body)["items"])
}

/// A connection that is gone for the server: closed, and its session parked.
async fn disconnect(server: &Server, client: Client) {
    let mut socket = client.socket;
    let _ = futures_util::SinkExt::close(&mut socket).await;
    drop(socket);
    let deadline = Instant::now() + SETTLE;
    while server.metric("ordo_connections") > 0.0 {
        assert!(Instant::now() < deadline, "the server still counts the connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reset_after_a_schema_change_carries_that_changes_seq() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/x", json!({"fields": [{"name": "a", "type": "u64"}]}));
    let written = batch(&server, "x", json!([{"op": "upsert", "id": "i1", "fields": {"a": 1}}]));
    let mut client = server.connect().await;
    client.send(json!({"op": "subscribe", "sub": "s", "collection": "x", "limit": 10})).await;
    let first = next_frame(&mut client, "s").await;
    assert_eq!(first["write_seq"], written, "{first}");

    let added = server.ok("POST", "/v1/collections/x/fields", json!({"name": "b", "type": "u64", "default": 7}));
    let frame = next_frame(&mut client, "s").await;
    assert!(frame["diffs"][0].get("Reset").is_some(), "{frame}");
    assert_eq!(frame["write_seq"], added["seq"], "the Reset of an added field: {frame}");

    let removed = server.ok("DELETE", "/v1/collections/x/fields/a", Value::Null);
    let frame = next_frame(&mut client, "s").await;
    assert!(frame["diffs"][0].get("Reset").is_some(), "{frame}");
    assert_eq!(frame["write_seq"], removed["seq"], "the Reset of a removed field: {frame}");
    // write_seq never decreases: a write after the change comes with its own seq.
    let later = batch(&server, "x", json!([{"op": "upsert", "id": "i1", "fields": {"b": 8}}]));
    assert_eq!(next_frame(&mut client, "s").await["write_seq"], later);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_view_on_a_subscription_older_than_an_added_field_can_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", json!({"fields": [{"name": "name", "type": "string"}]}));
    server.ok("PUT", "/v1/collections/x", json!({"fields": [{"name": "a", "type": "u64"}]}));
    batch(
        &server,
        "rooms",
        json!([{"op": "upsert", "id": "r1", "fields": {"name": "zed"}},
                                   {"op": "upsert", "id": "r2", "fields": {"name": "amy"}}]),
    );
    batch(
        &server,
        "x",
        json!([{"op": "upsert", "id": "i1", "fields": {"a": 1}},
                               {"op": "upsert", "id": "i2", "fields": {"a": 2}}]),
    );
    let mut client = server.connect().await;
    client.send(json!({"op": "subscribe", "sub": "s", "collection": "x", "limit": 10, "payload": false})).await;
    next_frame(&mut client, "s").await;

    // A plain field, added after the subscription opened.
    server.ok("POST", "/v1/collections/x/fields", json!({"name": "b", "type": "u64"}));
    next_frame(&mut client, "s").await;
    batch(
        &server,
        "x",
        json!([{"op": "upsert", "id": "i1", "fields": {"b": 9}}, {"op": "upsert", "id": "i2", "fields": {"b": 3}}]),
    );
    let sort_by_b = json!([{"field": "b", "dir": "asc"}]);
    client.send(json!({"op": "set_view", "sub": "s", "sort": sort_by_b, "req": "v1"})).await;
    let answer = answer_to(&mut client, "v1").await;
    assert_ne!(answer["type"], "error", "set_view naming the added field: {answer}");
    let expected = query(&server, "x", json!({"sort": sort_by_b, "limit": 10, "payload": false}));
    settle_to(&mut client, "s", &expected, "sorted by the added field").await;
    assert_eq!(client.lists["s"].items[0]["id"], "i2");

    // A `ref` field, added after the subscription opened: read through by set_view.
    server.ok("POST", "/v1/collections/x/fields", json!({"name": "r2", "type": "ref", "target": "rooms"}));
    next_frame(&mut client, "s").await;
    batch(
        &server,
        "x",
        json!([{"op": "upsert", "id": "i1", "fields": {"r2": "r2"}}, {"op": "upsert", "id": "i2", "fields": {"r2": "r1"}}]),
    );
    let sort_through = json!([{"field": "r2.name", "dir": "asc"}]);
    client.send(json!({"op": "set_view", "sub": "s", "sort": sort_through, "req": "v2"})).await;
    let answer = answer_to(&mut client, "v2").await;
    assert_ne!(answer["type"], "error", "set_view reading through the added ref field: {answer}");
    let expected = query(&server, "x", json!({"sort": sort_through, "limit": 10, "payload": false}));
    settle_to(&mut client, "s", &expected, "sorted through the added ref field").await;
    assert_eq!(client.lists["s"].items[0]["id"], "i1", "amy (r2) before zed (r1)");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_projection_of_every_field_does_not_grow_with_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/x", json!({"fields": [{"name": "a", "type": "u64"}]}));
    batch(&server, "x", json!([{"op": "upsert", "id": "i1", "fields": {"a": 1}}]));
    let mut client = server.connect().await;
    client.send(json!({"op": "subscribe", "sub": "listed", "collection": "x", "limit": 10, "fields": ["a"]})).await;
    client.send(json!({"op": "subscribe", "sub": "default", "collection": "x", "limit": 10})).await;
    settle_to(
        &mut client,
        "listed",
        &[json!({"id": "i1", "version": 1, "fields": {"a": 1}, "payload": null})],
        "subscribed",
    )
    .await;
    settle_to(
        &mut client,
        "default",
        &[json!({"id": "i1", "version": 1, "fields": {"a": 1}, "payload": null})],
        "subscribed",
    )
    .await;

    server.ok("POST", "/v1/collections/x/fields", json!({"name": "b", "type": "u64", "default": 7}));
    let listed = query(&server, "x", json!({"limit": 10, "fields": ["a"]}));
    assert_eq!(listed, [json!({"id": "i1", "version": 1, "fields": {"a": 1}, "payload": null})]);
    // The default projection takes the new field; the listed one stays as listed.
    settle_to(
        &mut client,
        "default",
        &[json!({"id": "i1", "version": 1, "fields": {"a": 1, "b": 7}, "payload": null})],
        "added",
    )
    .await;
    settle_to(&mut client, "listed", &listed, "added").await;
    // And so do later frames.
    batch(&server, "x", json!([{"op": "upsert", "id": "i2", "fields": {"a": 2}}]));
    let listed = query(&server, "x", json!({"limit": 10, "fields": ["a"]}));
    assert_eq!(listed.len(), 2);
    settle_to(&mut client, "listed", &listed, "written after").await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_after_an_unrelated_removal_and_a_set_view_through_a_reference_ends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/scores", json!({"fields": [{"name": "recency", "type": "u64"}]}));
    server.ok(
        "PUT",
        "/v1/collections/x",
        json!({"fields": [{"name": "a", "type": "u64"}, {"name": "note", "type": "string"},
                          {"name": "score", "type": "ref", "target": "scores"}]}),
    );
    batch(
        &server,
        "scores",
        json!([{"op": "upsert", "id": "s1", "fields": {"recency": 5}},
                                    {"op": "upsert", "id": "s2", "fields": {"recency": 1}}]),
    );
    batch(
        &server,
        "x",
        json!([{"op": "upsert", "id": "i1", "fields": {"a": 1, "score": "s1"}},
                               {"op": "upsert", "id": "i2", "fields": {"a": 2, "score": "s2"}}]),
    );
    let mut client = server.connect().await;
    let subscribe = json!({"op": "subscribe", "sub": "s", "collection": "x", "limit": 10, "payload": false,
                           "sort": [{"field": "a", "dir": "asc"}]});
    // On another collection, untouched: its replay shows that the resume adopted the session.
    let witness = json!({"op": "subscribe", "sub": "w", "collection": "scores", "limit": 10});
    client.send(subscribe.clone()).await;
    next_frame(&mut client, "s").await;
    client.send(witness.clone()).await;
    next_frame(&mut client, "w").await;
    // A field the view does not read: nothing ends, the list is reset without it.
    server.ok("DELETE", "/v1/collections/x/fields/note", Value::Null);
    next_frame(&mut client, "s").await;
    // Now the view reads through the reference (the order happens not to change: an `ack`).
    let sort_through = json!([{"field": "score.recency", "dir": "desc"}]);
    client.send(json!({"op": "set_view", "sub": "s", "sort": sort_through, "req": "v"})).await;
    let answer = answer_to(&mut client, "v").await;
    assert_ne!(answer["type"], "error", "{answer}");
    let applied = client.lists["s"].clone();
    let witness_list = client.lists["w"].clone();
    let session = client.session.clone();
    disconnect(&server, client).await;

    let mut client = server.connect().await;
    client.lists.insert("s".into(), applied.clone());
    let mut entry = subscribe.clone();
    entry.as_object_mut().unwrap().remove("op");
    entry["sort"] = sort_through.clone();
    entry["last_seq"] = json!(applied.seq);
    let mut witness_entry = witness.clone();
    witness_entry.as_object_mut().unwrap().remove("op");
    witness_entry["last_seq"] = json!(witness_list.seq);
    client.lists.insert("w".into(), witness_list);
    client.send(json!({"op": "resume", "session": session, "subs": [entry, witness_entry]})).await;
    let found = client.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
    assert!(found, "no resumed: {:?}", client.frames);
    let ended: Vec<&Value> = client.frames.iter().filter(|frame| frame["type"] == "ended").collect();
    assert!(ended.is_empty(), "nothing ended the subscription: {ended:?}");
    let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
    assert!(resumed["subs"][1]["replayed"].is_u64(), "the parked session was adopted: {resumed}");
    // Its schema changed since it opened, so it may reset; it must not end.
    assert!(resumed["subs"][0].get("error").is_none(), "{resumed}");
    // It lives on: a change of a score moves its item.
    batch(&server, "scores", json!([{"op": "upsert", "id": "s2", "fields": {"recency": 9}}]));
    let expected = query(&server, "x", json!({"sort": sort_through, "limit": 10, "payload": false}));
    settle_to(&mut client, "s", &expected, "after the resume").await;
    assert_eq!(client.lists["s"].items[0]["id"], "i2");
    server.stop();
}

/// A collection `t` of items `n1..=n{count}` with a `u64` field `n` equal to their number.
fn create_numbers(server: &Server, count: u64) {
    server.ok("PUT", "/v1/collections/t", json!({"fields": [{"name": "n", "type": "u64"}]}));
    let ops: Vec<Value> =
        (1..=count).map(|n| json!({"op": "upsert", "id": format!("n{n}"), "fields": {"n": n}})).collect();
    batch(server, "t", json!(ops));
}

fn kinds(frame: &Value) -> Vec<String> {
    frame["diffs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|diff| diff.as_object().unwrap().keys().next().unwrap().clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_windows_slide_by_small_diffs_or_a_reset_when_that_is_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_numbers(&server, 5);
    let sort = json!([{"field": "n", "dir": "asc"}]);
    let mut client = server.connect().await;
    for (sub, limit) in [("one", 1), ("two", 2), ("three", 3)] {
        client
            .send(json!({"op": "subscribe", "sub": sub, "collection": "t", "sort": sort, "tail": true, "limit": limit}))
            .await;
        next_frame(&mut client, sub).await;
    }
    let expected =
        |server: &Server, limit: u64| query(server, "t", json!({"sort": sort, "tail": true, "limit": limit}));

    // One row enters at the end.
    client.diffs_seen.clear();
    batch(&server, "t", json!([{"op": "upsert", "id": "n6", "fields": {"n": 6}}]));
    for (sub, limit) in [("one", 1), ("two", 2), ("three", 3)] {
        settle_to(&mut client, sub, &expected(&server, limit), "one row entered").await;
    }
    // A one-row tail whose row changes is one Reset; a longer tail slides by two diffs.
    let frames: Vec<Value> = client.diffs_seen.clone();
    let of = |sub: &str| frames.iter().find(|frame| frame["sub"] == sub).cloned().unwrap();
    assert_eq!(kinds(&of("one")), ["Reset"], "{}", of("one"));
    assert_eq!(kinds(&of("three")).len(), 2, "{}", of("three"));
    assert!(!kinds(&of("three")).contains(&"Reset".to_owned()), "{}", of("three"));

    // Two rows entering a limit-2 tail in one batch replace it whole: a Reset.
    client.diffs_seen.clear();
    batch(
        &server,
        "t",
        json!([{"op": "upsert", "id": "n7", "fields": {"n": 7}}, {"op": "upsert", "id": "n8", "fields": {"n": 8}}]),
    );
    for (sub, limit) in [("one", 1), ("two", 2), ("three", 3)] {
        settle_to(&mut client, sub, &expected(&server, limit), "two rows entered").await;
    }
    let frames: Vec<Value> = client.diffs_seen.clone();
    let two = frames.iter().find(|frame| frame["sub"] == "two").unwrap();
    assert_eq!(kinds(two), ["Reset"], "{two}");
    assert_eq!(two["total"], 8, "a Reset carries the total: {two}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_window_reset_by_a_resume_says_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_numbers(&server, 5);
    let subscribe = json!({"op": "subscribe", "sub": "tail", "collection": "t",
                           "sort": [{"field": "n", "dir": "asc"}], "tail": true, "limit": 2});
    let mut client = server.connect().await;
    client.send(subscribe.clone()).await;
    let first = next_frame(&mut client, "tail").await;
    assert_eq!((first["offset"].as_u64(), first["limit"].as_u64()), (Some(3), Some(2)), "{first}");
    let applied = client.lists["tail"].clone();
    let session = client.session.clone();
    disconnect(&server, client).await;
    batch(&server, "t", json!([{"op": "upsert", "id": "n6", "fields": {"n": 6}}]));

    let mut entry = subscribe.clone();
    entry.as_object_mut().unwrap().remove("op");
    // Both ways a resume resets: the held session with frames it cannot replay
    // (a `last_seq` it never sent), and a session it does not know.
    for (session, what) in [(session.as_str(), "held session"), ("0123456789abcdef", "unknown session")] {
        let mut client = server.connect().await;
        let last_seq = applied.seq + 10;
        client.lists.insert("tail".into(), common::LocalList { seq: last_seq, ..applied.clone() });
        entry["last_seq"] = json!(last_seq);
        client.send(json!({"op": "resume", "session": session, "subs": [entry]})).await;
        let reset = next_frame(&mut client, "tail").await;
        let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").expect("resumed first").clone();
        assert_eq!(resumed["subs"][0]["reset"], true, "{what}: {resumed}");
        assert_eq!(kinds(&reset), ["Reset"], "{what}: {reset}");
        assert_eq!(reset["seq"], last_seq + 1, "{what}: {reset}");
        assert_eq!((reset["offset"].as_u64(), reset["limit"].as_u64()), (Some(4), Some(2)), "{what}: {reset}");
        disconnect(&server, client).await;
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_view_that_changes_the_total_but_not_the_window_tells_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_numbers(&server, 5);
    let sort = json!([{"field": "n", "dir": "asc"}]);
    let mut client = server.connect().await;
    client.send(json!({"op": "subscribe", "sub": "s", "collection": "t", "sort": sort, "limit": 2})).await;
    assert_eq!(next_frame(&mut client, "s").await["total"], 5);

    // The same two rows, of a view of three: a frame with no diffs, and the total.
    let small = json!({"field": "n", "op": "le", "value": 3});
    client.send(json!({"op": "set_view", "sub": "s", "filter": small, "sort": sort, "req": "v1"})).await;
    let answer = answer_to(&mut client, "v1").await;
    assert_eq!(answer["type"], "diffs", "{answer}");
    assert_eq!(answer["diffs"], json!([]), "{answer}");
    assert_eq!(answer["total"], 3, "{answer}");
    // Nothing changes at all: an `ack`.
    let same = json!({"field": "n", "op": "lt", "value": 4});
    client.send(json!({"op": "set_view", "sub": "s", "filter": same, "sort": sort, "req": "v2"})).await;
    let answer = answer_to(&mut client, "v2").await;
    assert_eq!(answer["type"], "ack", "{answer}");
    server.stop();
}

#[test]
fn projected_fields_come_own_fields_first_each_in_the_order_listed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    common::create_rooms_and_members(&server);
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 3}}]));
    batch(
        &server,
        "members",
        json!([{"op": "upsert", "id": "m1", "fields": {"owner": "a", "room": "r1", "unread": 2}}]),
    );
    let body = json!({"limit": 10, "payload": false, "fields": ["room.recency", "unread", "room.name", "owner"]});
    let (status, raw) = server.http_raw("POST", "/v1/collections/members/query", Some(body.to_string().as_bytes()));
    assert_eq!(status, 200);
    let text = String::from_utf8(raw).unwrap();
    let at = |name: &str| text.find(&format!("\"{name}\":")).unwrap_or_else(|| panic!("no {name} in {text}"));
    assert!(at("unread") < at("owner"), "{text}");
    assert!(at("owner") < at("room.recency"), "{text}");
    assert!(at("room.recency") < at("room.name"), "{text}");
    server.stop();
}
