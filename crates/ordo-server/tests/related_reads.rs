//! Reads by relationship (docs/SECURITY.md, "Reading by relationship"): the
//! flagship's `messages`, readable by a reader only in views pinned to a room
//! it holds a membership of (`"read":{"related":{"field":"room","to":"members.room"}}`).
//! A room one is in reads (tail window, live frames, one-shot query); one is
//! not in, or that does not exist, is `forbidden` in the same words; views
//! without a pin, with `ne`, `any` or null, item reads by id, anchors outside
//! the pinned room and a `set_view` to another room are refused; leaving the
//! room (the membership removed or moved out of the reader's rule by a writer)
//! ends the subscription with `ended` / `access_ended` and nothing after it,
//! live or across a resume.

mod common;

use std::time::Duration;

use common::{mint, write_secret, Client, Server};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

struct Chat {
    dir: tempfile::TempDir,
    server: Server,
    alice: String,
}

/// The flagship's collections and rules; rooms r1..r3; alice is in r1 and r2,
/// bob in r2 and r3; each room holds messages 1..=5.
fn chat() -> Chat {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    let admin = mint(&secret, "ops", "admin", &[]);
    let last_seq = fill_chat(&server, &admin);
    assert!(last_seq > 0);
    server.token = Some(admin);
    let alice = mint(&secret, "alice", "reader", &[]);
    Chat { dir, server, alice }
}

/// The collections, rules and items of `chat`, written as `admin`; the last `seq`.
fn fill_chat(server: &Server, admin: &str) -> u64 {
    let call = |method: &str, path: &str, body: Value| {
        let (status, answer) = server.http_as(Some(admin), method, path, Some(&body));
        assert!((200..300).contains(&status), "{method} {path} {body}: {status} {answer}");
        answer["seq"].as_u64().unwrap_or(0)
    };
    call("PUT", "/v1/collections/rooms", json!({"fields": [{"name": "name", "type": "string"}]}));
    call(
        "PUT",
        "/v1/collections/members",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"},
                          {"name": "read_upto", "type": "u64"}]}),
    );
    call(
        "PUT",
        "/v1/collections/messages",
        json!({"fields": [{"name": "room", "type": "string"}, {"name": "seq", "type": "u64"},
                          {"name": "author", "type": "string"}, {"name": "text", "type": "string"}]}),
    );
    call(
        "PUT",
        "/v1/rules",
        json!({"rules": [
            {"collection": "members", "roles": ["reader"],
             "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}},
            {"collection": "messages", "roles": ["reader"], "read": {"related": {"field": "room", "to": "members.room"}}},
            {"collection": "*", "roles": ["writer"], "read": true, "write": true},
        ]}),
    );
    let batch = |collection: &str, ops: Value| {
        call("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }))
    };
    let rooms: Vec<Value> =
        ["r1", "r2", "r3"].iter().map(|id| json!({"op": "upsert", "id": id, "fields": {"name": id}})).collect();
    batch("rooms", json!(rooms));
    batch("members", json!([join("alice", "r1"), join("alice", "r2"), join("bob", "r2"), join("bob", "r3")]));
    let mut last_seq = 0;
    for room in ["r1", "r2", "r3"] {
        let messages: Vec<Value> = (1..=5).map(|seq| message(room, seq)).collect();
        last_seq = batch("messages", json!(messages));
    }
    last_seq
}

fn join(owner: &str, room: &str) -> Value {
    json!({"op": "upsert", "id": format!("{owner}/{room}"), "fields": {"owner": owner, "room": room, "read_upto": 0}})
}

fn message(room: &str, seq: u64) -> Value {
    json!({"op": "upsert", "id": format!("{room}-{seq}"),
           "fields": {"room": room, "seq": seq, "author": "bob", "text": format!("{room} says {seq}")}})
}

fn write(server: &Server, collection: &str, ops: Value) -> u64 {
    server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }))["seq"].as_u64().unwrap()
}

fn pin(room: &str) -> Value {
    json!({"field": "room", "op": "eq", "value": room})
}

/// The open room's last messages: a tail window sorted by `seq`.
fn room_view(sub: &str, filter: Value) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "messages", "filter": filter,
           "sort": [{"field": "seq"}], "tail": true, "limit": 3})
}

fn texts(client: &Client, sub: &str) -> Vec<String> {
    let list = client.lists.get(sub).map(|list| list.items.as_slice()).unwrap_or_default();
    list.iter().map(|item| item["fields"]["text"].as_str().unwrap().to_owned()).collect()
}

async fn wait_for_texts(client: &mut Client, sub: &str, expected: &[&str]) {
    let held = client.read_until(WAIT, |client| texts(client, sub) == expected).await;
    assert!(held, "{sub}: {:?}, expected {expected:?}; frames {:?}", texts(client, sub), client.frames);
}

/// A subscribe that must be refused: the error frame's `code` and `message`.
async fn refused_subscribe(client: &mut Client, subscribe: Value) -> (String, String) {
    let n_diffs_before = client.diffs_seen.len();
    client.send(subscribe.clone()).await;
    let error = client.expect_error().await;
    assert_eq!(error["sub"], subscribe["sub"], "{error}");
    let sub = &subscribe["sub"];
    assert!(client.diffs_seen[n_diffs_before..].iter().all(|frame| &frame["sub"] != sub), "{subscribe}: no frame");
    (error["code"].as_str().unwrap().to_owned(), error["message"].as_str().unwrap().to_owned())
}

/// The frames after the connection's `welcome` and `authed`.
fn frames_after_auth(client: &Client) -> Vec<&Value> {
    client.frames.iter().filter(|frame| frame["type"] != "welcome" && frame["type"] != "authed").collect()
}

fn query_as(server: &Server, token: &str, filter: Value) -> (u16, Value) {
    let body = json!({"filter": filter, "sort": [{"field": "seq"}], "tail": true, "limit": 3});
    server.http_as(Some(token), "POST", "/v1/collections/messages/query", Some(&body))
}

#[tokio::test]
async fn messages_of_a_room_one_is_in_are_read_live() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    // The pin may also sit in a top-level `all`, beside the client's own filter.
    let within_all = json!({"all": [{"field": "seq", "op": "gt", "value": 1}, pin("r2")]});
    client.send(room_view("r2", within_all.clone())).await;
    wait_for_texts(&mut client, "r2", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;

    write(server, "messages", json!([message("r1", 6), message("r3", 6)]));
    wait_for_texts(&mut client, "r1", &["r1 says 4", "r1 says 5", "r1 says 6"]).await;
    write(server, "messages", json!([message("r2", 6)]));
    wait_for_texts(&mut client, "r2", &["r2 says 4", "r2 says 5", "r2 says 6"]).await;
    assert!(client.frames.iter().all(|frame| frame["type"] != "error"), "{:?}", client.frames);

    let (status, answer) = query_as(server, alice, within_all);
    assert_eq!(status, 200, "{answer}");
    let items = answer["items"].as_array().unwrap();
    let seqs: Vec<u64> = items.iter().map(|item| item["fields"]["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [4, 5, 6], "{answer}");
    assert!(items.iter().all(|item| item["fields"]["room"] == "r2"), "{answer}");
}

#[tokio::test]
async fn a_room_one_is_not_in_is_refused_in_the_same_words_whether_it_exists_or_not() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    let (code, not_in) = refused_subscribe(&mut client, room_view("s", pin("r3"))).await;
    assert_eq!(code, "forbidden", "{not_in}");
    let (code, missing) = refused_subscribe(&mut client, room_view("s", pin("r9"))).await;
    assert_eq!(code, "forbidden", "{missing}");
    assert_eq!(not_in.replace("\"r3\"", "\"r9\""), missing, "only the value differs");

    let (status, not_in) = query_as(server, alice, pin("r3"));
    let (status_missing, missing) = query_as(server, alice, pin("r9"));
    assert_eq!((status, status_missing), (403, 403), "{not_in} {missing}");
    assert_eq!(not_in["error"]["code"], "forbidden");
    assert_eq!(not_in["error"]["message"].as_str().unwrap().replace("\"r3\"", "\"r9\""), missing["error"]["message"]);

    // A membership of someone else's relates nothing: bob's `bob/r3` is outside alice's rule.
    let (code, _) = refused_subscribe(&mut client, room_view("s", json!({"all": [pin("r3"), pin("r1")]}))).await;
    assert_eq!(code, "forbidden", "the first pin is the one checked, and every pin is in the view");
}

#[tokio::test]
async fn views_that_do_not_pin_the_room_are_refused() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    let unpinned = [
        Value::Null,
        json!({"field": "room", "op": "ne", "value": "r3"}),
        json!({"field": "room", "op": "eq", "value": null}),
        json!({"field": "room", "in": ["r1"]}),
        json!({"any": [pin("r1"), pin("r3")]}),
        json!({"not": pin("r3")}),
        json!({"all": [{"any": [pin("r1")]}]}),
        json!({"field": "author", "op": "eq", "value": "bob"}),
    ];
    let mut words = None;
    for filter in unpinned {
        let (code, message) = refused_subscribe(&mut client, room_view("s", filter.clone())).await;
        assert_eq!(code, "forbidden", "{filter}: {message}");
        assert!(message.contains("must pin `room`"), "{filter}: {message}");
        assert_eq!(words.get_or_insert_with(|| message.clone()), &message, "one refusal for every unpinned view");
        let (status, answer) = query_as(server, alice, filter.clone());
        assert_eq!((status, &answer["error"]["code"]), (403, &json!("forbidden")), "{filter}: {answer}");
    }

    // By id: refused whatever the item, one of alice's rooms included.
    for id in ["r1-1", "r3-1", "r9-1"] {
        let (status, answer) =
            server.http_as(Some(alice), "GET", &format!("/v1/collections/messages/items/{id}"), None);
        assert_eq!((status, &answer["error"]["code"]), (403, &json!("forbidden")), "{id}: {answer}");
    }
}

#[tokio::test]
async fn anchors_and_view_changes_stay_within_the_pinned_room() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("s", pin("r1"))).await;
    wait_for_texts(&mut client, "s", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;

    // An item of another room, as an anchor, reads as a missing one.
    let mut missing = None;
    for id in ["r3-2", "r9-2"] {
        client.send(json!({"op": "set_range", "sub": "s", "around": {"id": id}, "limit": 2})).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], "not_found", "{id}: {error}");
        let message = error["message"].as_str().unwrap().replace(id, "ID");
        assert_eq!(missing.get_or_insert_with(|| message.clone()), &message, "{id}");
        let anchored = json!({"op": "subscribe", "sub": "a", "collection": "messages", "filter": pin("r1"),
                              "sort": [{"field": "seq"}], "around": {"id": id}, "limit": 2});
        let (code, message) = refused_subscribe(&mut client, anchored).await;
        assert_eq!((code.as_str(), message.replace(id, "ID")), ("not_found", missing.clone().unwrap()), "{id}");
    }

    // `set_view` to a room alice is not in: refused, and the subscription goes on as it was.
    for filter in [pin("r3"), pin("r9"), json!({"field": "room", "op": "ne", "value": "r1"})] {
        client.send(json!({"op": "set_view", "sub": "s", "filter": filter, "sort": [{"field": "seq"}]})).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], "forbidden", "{filter}: {error}");
    }
    write(server, "messages", json!([message("r3", 7), message("r1", 6)]));
    wait_for_texts(&mut client, "s", &["r1 says 4", "r1 says 5", "r1 says 6"]).await;
    // To a room alice is in: allowed.
    client.send(json!({"op": "set_view", "sub": "s", "filter": pin("r2"), "sort": [{"field": "seq"}]})).await;
    wait_for_texts(&mut client, "s", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;
}

#[tokio::test]
async fn the_collection_is_listed_without_an_item_count() {
    let Chat { server, alice, .. } = &chat();
    let (status, list) = server.http_as(Some(alice), "GET", "/v1/collections", None);
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> =
        list["collections"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["members", "messages"], "{list}");
    let (status, messages) = server.http_as(Some(alice), "GET", "/v1/collections/messages", None);
    assert_eq!(status, 200, "{messages}");
    assert!(messages.get("items").is_none(), "no count for a reader by relationship: {messages}");
    let (_, as_admin) = server.http("GET", "/v1/collections/messages", None);
    assert_eq!(as_admin["items"], 15, "{as_admin}");
}

/// Reads frames until `marker` (a frame of another subscription written after
/// everything under test) arrives: the connection's frames are in order, so
/// whatever the server sent before it has arrived by then.
async fn read_past_marker(client: &mut Client, marker_sub: &str, marker_text: &str) {
    let text = marker_text.to_owned();
    let came = client.read_until(WAIT, |client| texts(client, marker_sub).contains(&text)).await;
    assert!(came, "the marker {marker_text} came on {marker_sub}: {:?}", client.frames);
}

fn ended_frames<'a>(client: &'a Client, sub: &str) -> Vec<&'a Value> {
    client.frames.iter().filter(|frame| frame["type"] == "ended" && frame["sub"] == sub).collect()
}

#[tokio::test]
async fn leaving_the_room_ends_the_subscription_and_nothing_follows() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    client.send(room_view("r2", pin("r2"))).await;
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    wait_for_texts(&mut client, "r2", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;

    // The membership removed, then a message, then a marker in the same request
    // (one command on the writer, three batches): `ended` comes before the marker.
    let body = json!({"writes": [
        {"collection": "members", "ops": [{"op": "remove", "id": "alice/r1"}]},
        {"collection": "messages", "ops": [message("r1", 6)]},
        {"collection": "messages", "ops": [message("r2", 6)]},
    ]});
    server.ok("POST", "/v1/batch", body);
    read_past_marker(&mut client, "r2", "r2 says 6").await;
    let ended = ended_frames(&client, "r1");
    assert_eq!(ended.len(), 1, "{:?}", client.frames);
    assert_eq!(ended[0]["reason"], "access_ended", "{}", ended[0]);
    // And nothing after it, as messages keep coming.
    write(server, "messages", json!([message("r1", 7)]));
    write(server, "messages", json!([message("r2", 7)]));
    read_past_marker(&mut client, "r2", "r2 says 7").await;
    assert_eq!(ended_frames(&client, "r1").len(), 1, "{:?}", client.frames);
    assert_eq!(texts(&client, "r1"), ["r1 says 3", "r1 says 4", "r1 says 5"], "no message written after leaving");
    assert!(client.diffs_seen.iter().all(|frame| frame["sub"] != "r1" || frame["diffs"][0].get("Reset").is_some()));

    // Its id is free; subscribing again is refused now that alice left.
    let (code, _) = refused_subscribe(&mut client, room_view("r1", pin("r1"))).await;
    assert_eq!(code, "forbidden");

    // A membership moved out of alice's rule (someone else's now) ends the same way.
    write(server, "members", json!([{"op": "upsert", "id": "alice/r2", "fields": {"owner": "carol"}}]));
    write(server, "messages", json!([message("r2", 8)]));
    client.send(room_view("r3", pin("r1"))).await;
    let refused = client.expect_error().await;
    assert_eq!(refused["code"], "forbidden", "{refused}");
    let came = client.read_until(WAIT, |client| !ended_frames(client, "r2").is_empty()).await;
    assert!(came, "{:?}", client.frames);
    assert_eq!(ended_frames(&client, "r2")[0]["reason"], "access_ended");
    assert_eq!(texts(&client, "r2"), ["r2 says 5", "r2 says 6", "r2 says 7"], "{:?}", client.diffs_seen);

    // Joining again opens the room again.
    write(server, "members", json!([join("alice", "r1")]));
    client.send(room_view("again", pin("r1"))).await;
    wait_for_texts(&mut client, "again", &["r1 says 5", "r1 says 6", "r1 says 7"]).await;
}

#[tokio::test]
async fn a_subscription_outlives_one_of_two_memberships_of_its_room() {
    let Chat { server, alice, .. } = &chat();
    // A second membership of alice's in r1 (the rule lets her read both).
    write(
        server,
        "members",
        json!([{"op": "upsert", "id": "alice/r1-again",
                                      "fields": {"owner": "alice", "room": "r1", "read_upto": 0}}]),
    );
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    client.send(room_view("r2", pin("r2"))).await;
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    write(server, "members", json!([{"op": "remove", "id": "alice/r1"}]));
    write(server, "messages", json!([message("r1", 6)]));
    wait_for_texts(&mut client, "r1", &["r1 says 4", "r1 says 5", "r1 says 6"]).await;
    write(server, "members", json!([{"op": "remove", "id": "alice/r1-again"}]));
    write(server, "messages", json!([message("r1", 7), message("r2", 6)]));
    read_past_marker(&mut client, "r2", "r2 says 6").await;
    assert_eq!(ended_frames(&client, "r1").len(), 1, "{:?}", client.frames);
    assert_eq!(texts(&client, "r1"), ["r1 says 4", "r1 says 5", "r1 says 6"]);
}

/// Waits until the server counts `n` open WebSockets: a connection dropped by
/// the client has then been closed and its session parked.
async fn wait_for_connections(server: &Server, n: f64) {
    let deadline = std::time::Instant::now() + WAIT;
    while server.metric("ordo_connections") != n {
        assert!(std::time::Instant::now() < deadline, "{} connections", server.metric("ordo_connections"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_resume_after_leaving_gets_ended_and_nothing_of_the_room() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    let session = client.session.clone();
    let last_seq = client.lists["r1"].seq;
    drop(client);
    wait_for_connections(server, 0.0).await;

    write(server, "members", json!([{"op": "remove", "id": "alice/r1"}]));
    write(server, "messages", json!([message("r1", 6)]));
    let mut entry = room_view("r1", pin("r1"));
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(last_seq);

    let mut client = server.connect_as(Some(alice)).await;
    client.lists.entry("r1".to_owned()).or_default().seq = last_seq;
    client.send(json!({"op": "resume", "session": session, "subs": [entry.clone()]})).await;
    let resumed = client.read_until(WAIT, |client| client.frames.iter().any(|f| f["type"] == "resumed")).await;
    assert!(resumed, "{:?}", client.frames);
    // The parked subscription's end comes first; the entry, now a new
    // subscribe, is then refused by the writer thread's check of the relationship.
    client.expect_error().await;
    let frames = frames_after_auth(&client);
    let types: Vec<&str> = frames.iter().map(|frame| frame["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ended", "resumed", "error"], "{frames:?}");
    assert_eq!(frames[0]["reason"], "access_ended", "{frames:?}");
    assert_eq!((&frames[2]["sub"], &frames[2]["code"]), (&json!("r1"), &json!("forbidden")), "{frames:?}");
    // A fresh resume (an unknown session) refuses the entry the same way.
    let mut fresh = server.connect_as(Some(alice)).await;
    fresh.send(json!({"op": "resume", "session": "0000000000000000", "subs": [entry]})).await;
    let error = fresh.expect_error().await;
    assert_eq!((&error["sub"], &error["code"]), (&json!("r1"), &json!("forbidden")), "{error}");
    // Nothing of r1 on either connection, the message written after leaving included.
    write(server, "members", json!([join("alice", "r3")]));
    fresh.send(room_view("r3", pin("r3"))).await;
    wait_for_texts(&mut fresh, "r3", &["r3 says 3", "r3 says 4", "r3 says 5"]).await;
    client.read_until(Duration::from_millis(200), |_| false).await;
    assert!(client.diffs_seen.is_empty() && fresh.diffs_seen.iter().all(|f| f["sub"] == "r3"));
}

#[tokio::test]
async fn malformed_relationships_are_invalid_rules() {
    let Chat { server, .. } = &chat();
    for related in [json!("members.room"), json!({"field": "room", "to": "members"}), json!({"field": "room"})] {
        let rules = json!({"rules": [{"collection": "messages", "roles": ["reader"], "read": {"related": related}}]});
        let (status, answer) = server.http("PUT", "/v1/rules", Some(&rules));
        assert_eq!((status, &answer["error"]["code"]), (400, &json!("invalid_rules")), "{related}: {answer}");
    }
}

#[tokio::test]
async fn a_drop_or_a_field_removal_of_the_related_collection_ends_the_subscriptions() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    client.send(room_view("r2", pin("r2"))).await;
    wait_for_texts(&mut client, "r2", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;
    // `read_upto` is read by no relationship: nothing ends.
    server.ok("DELETE", "/v1/collections/members/fields/read_upto", json!(null));
    // `owner` is read by alice's rule on `members`, so by both relationships.
    server.ok("DELETE", "/v1/collections/members/fields/owner", json!(null));
    let came =
        client.read_until(WAIT, |client| ["r1", "r2"].iter().all(|sub| !ended_frames(client, sub).is_empty())).await;
    assert!(came, "{:?}", client.frames);
    assert!(["r1", "r2"].iter().all(|sub| ended_frames(&client, sub)[0]["reason"] == "access_ended"));
    assert_eq!(ended_frames(&client, "r1").len() + ended_frames(&client, "r2").len(), 2, "{:?}", client.frames);
    // The rule no longer fits `members`: refused, in words that name no room.
    let (code, message) = refused_subscribe(&mut client, room_view("r1", pin("r1"))).await;
    assert_eq!(code, "forbidden", "{message}");

    server.ok("DELETE", "/v1/collections/members", json!(null));
    let (code, message) = refused_subscribe(&mut client, room_view("r1", pin("r1"))).await;
    assert_eq!(code, "forbidden", "{message}");
}

#[tokio::test]
async fn in_a_cluster_each_node_checks_and_watches_the_relationship() {
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = write_secret(secret_dir.path());
    let cluster = common::cluster::OrdoCluster::start_with(1, 2, &["--auth-secret-file", secret.to_str().unwrap()]);
    let admin = mint(&secret, "ops", "admin", &[]);
    let alice = mint(&secret, "alice", "reader", &[]);
    let (writer_node, reader_node) = (cluster.node(0), cluster.node(1));
    let last_seq = fill_chat(writer_node, &admin);
    // The rules too, before alice connects (a change of rules closes her socket).
    assert!(cluster.wait_converged(WAIT) >= last_seq);

    let mut client = reader_node.connect_as(Some(&alice)).await;
    for (sub, room) in [("r1", "r1"), ("r2", "r2"), ("r3", "r3")] {
        let mut subscribe = room_view(sub, pin(room));
        subscribe["min_seq"] = json!(last_seq);
        client.send(subscribe).await;
    }
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    wait_for_texts(&mut client, "r2", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;
    let error = client.expect_error().await;
    assert_eq!((&error["sub"], &error["code"]), (&json!("r3"), &json!("forbidden")), "{error}");

    let body = json!({"writes": [
        {"collection": "members", "ops": [{"op": "remove", "id": "alice/r1"}]},
        {"collection": "messages", "ops": [message("r1", 6)]},
        {"collection": "messages", "ops": [message("r2", 6)]},
    ]});
    let (status, answer) = writer_node.http_as(Some(&admin), "POST", "/v1/batch", Some(&body));
    assert_eq!(status, 200, "{answer}");
    read_past_marker(&mut client, "r2", "r2 says 6").await;
    let ended = ended_frames(&client, "r1");
    assert_eq!(ended.len(), 1, "{:?} {:?}", frames_after_auth(&client), client.diffs_seen);
    assert_eq!(ended[0]["reason"], "access_ended", "{}", ended[0]);
    assert_eq!(texts(&client, "r1"), ["r1 says 3", "r1 says 4", "r1 says 5"], "no message written after leaving");
}

#[tokio::test]
async fn a_resume_after_the_rules_changed_checks_the_relationship_again() {
    let Chat { server, alice, .. } = &chat();
    let mut client = server.connect_as(Some(alice)).await;
    client.send(room_view("r1", pin("r1"))).await;
    wait_for_texts(&mut client, "r1", &["r1 says 3", "r1 says 4", "r1 says 5"]).await;
    let (session, last_seq) = (client.session.clone(), client.lists["r1"].seq);

    // Memberships now relate only once read (`read_upto` past 0): alice's r1 no longer does.
    let (_, rules) = server.http("GET", "/v1/rules", None);
    let mut rules = json!({"rules": rules["rules"]});
    rules["rules"][0]["read"]["filter"] = json!({"all": [{"field": "owner", "op": "eq", "value": "$sub"},
                                                         {"field": "read_upto", "op": "gt", "value": 0}]});
    server.ok("PUT", "/v1/rules", rules);
    // The socket closes at its next frame, before it is sent.
    write(server, "messages", json!([message("r1", 6)]));
    let closed = client.read_until(WAIT, |client| client.frames.iter().any(|frame| frame["type"] == "close")).await;
    assert!(closed, "a change of rules closes the socket: {:?}", client.frames);
    drop(client);
    wait_for_connections(server, 0.0).await;

    // The same view of the same room: the parked subscription is not kept, since
    // the relationship it was opened with is not the one the rules give now.
    let mut entry = room_view("r1", pin("r1"));
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(last_seq);
    let mut client = server.connect_as(Some(alice)).await;
    client.lists.entry("r1".to_owned()).or_default().seq = last_seq;
    client.send(json!({"op": "resume", "session": session, "subs": [entry]})).await;
    let error = client.expect_error().await;
    assert_eq!((&error["sub"], &error["code"]), (&json!("r1"), &json!("forbidden")), "{error}");
    let resumed = frames_after_auth(&client).into_iter().find(|frame| frame["type"] == "resumed").cloned();
    assert_eq!(resumed.unwrap()["subs"][0]["reset"], true);
    write(server, "messages", json!([message("r1", 7)]));
    write(server, "members", json!([{"op": "upsert", "id": "alice/r2", "fields": {"read_upto": 1}}]));
    client.send(room_view("r2", pin("r2"))).await;
    wait_for_texts(&mut client, "r2", &["r2 says 3", "r2 says 4", "r2 says 5"]).await;
    assert!(client.diffs_seen.iter().all(|frame| frame["sub"] == "r2"), "{:?}", client.diffs_seen);
}

/// The naive model of `random_joins_leaves_and_messages_match_a_naive_model`.
#[derive(Default)]
struct Model {
    /// Membership id → (owner, room).
    members: std::collections::BTreeMap<String, (String, String)>,
    /// Per room, its messages' texts in `seq` order.
    messages: std::collections::BTreeMap<String, Vec<String>>,
    /// Live subscriptions: (user, sub id) → room.
    subs: std::collections::BTreeMap<(usize, String), String>,
    /// Subscriptions whose relationship ended: (user, sub id) → the texts they showed then.
    ended: std::collections::BTreeMap<(usize, String), Vec<String>>,
}

impl Model {
    fn relates(&self, user: &str, room: &str) -> bool {
        self.members.values().any(|(owner, at)| owner == user && at == room)
    }

    fn tail(&self, room: &str) -> Vec<String> {
        let texts = &self.messages[room];
        texts[texts.len().saturating_sub(3)..].to_vec()
    }

    /// After a change of memberships: the subscriptions it ends, with what they show.
    fn end_lost(&mut self, users: &[&str]) {
        let lost: Vec<(usize, String)> = (self.subs.iter())
            .filter(|((user, _), room)| !self.relates(users[*user], room))
            .map(|(key, _)| key.clone())
            .collect();
        for key in lost {
            let room = self.subs.remove(&key).unwrap();
            self.ended.insert(key, self.tail(&room));
        }
    }
}

/// Every frame the writer queued for `client` before this call: a subscribe the
/// writer thread refuses (a room nobody is in) is answered through the same
/// ordered queue as the frames.
async fn barrier(client: &mut Client, n: usize) {
    let sub = format!("barrier-{n}");
    client.send(room_view(&sub, pin("nowhere"))).await;
    let came = client
        .read_until(WAIT, |client| client.frames.iter().any(|frame| frame["type"] == "error" && frame["sub"] == sub))
        .await;
    assert!(came, "barrier {n}");
}

#[tokio::test]
async fn random_joins_leaves_and_messages_match_a_naive_model() {
    let seed = std::env::var("ORDO_TEST_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or(7);
    eprintln!("seed {seed} (ORDO_TEST_SEED)");
    let mut rng = common::Rng::new(seed);
    let Chat { dir, server, .. } = &chat();
    let users = ["alice", "bob", "carol"];
    let rooms = ["r1", "r2", "r3"];
    let secret = dir.path().join("secret");
    let mut clients = Vec::new();
    for user in users {
        clients.push(server.connect_as(Some(&mint(&secret, user, "reader", &[]))).await);
    }
    let mut model = Model::default();
    for (id, owner, room) in
        [("alice/r1", "alice", "r1"), ("alice/r2", "alice", "r2"), ("bob/r2", "bob", "r2"), ("bob/r3", "bob", "r3")]
    {
        model.members.insert(id.to_owned(), (owner.to_owned(), room.to_owned()));
    }
    for room in rooms {
        model.messages.insert(room.to_owned(), (1..=5).map(|seq| format!("{room} says {seq}")).collect());
    }
    let mut n_subscriptions = 0;
    for step in 0..120 {
        let (user, room) = (rng.index(users.len()), *rng.pick(&rooms));
        let what = rng.below(100);
        if what < 20 {
            // A writer adds a membership (its id names who it was made for).
            let id = format!("{}/{room}", users[user]);
            write(
                server,
                "members",
                json!([{"op": "upsert", "id": id, "fields": {"owner": users[user], "room": room}}]),
            );
            // (An id handed to someone else earlier comes back: theirs ends.)
            model.members.insert(id, (users[user].to_owned(), room.to_owned()));
            model.end_lost(&users);
        } else if what < 35 && !model.members.is_empty() {
            // A writer removes one, or hands it to someone else (out of its owner's rule).
            let ids: Vec<String> = model.members.keys().cloned().collect();
            let id = rng.pick(&ids).clone();
            if rng.chance(50) {
                write(server, "members", json!([{"op": "remove", "id": id}]));
                model.members.remove(&id);
            } else {
                write(server, "members", json!([{"op": "upsert", "id": id, "fields": {"owner": users[user]}}]));
                model.members.get_mut(&id).unwrap().0 = users[user].to_owned();
            }
            model.end_lost(&users);
        } else if what < 70 {
            let texts = model.messages.get_mut(room).unwrap();
            let seq = texts.len() as u64 + 1;
            write(server, "messages", json!([message(room, seq)]));
            texts.push(format!("{room} says {seq}"));
        } else if what < 90 {
            n_subscriptions += 1;
            let sub = format!("{room}-{n_subscriptions}");
            clients[user].send(room_view(&sub, pin(room))).await;
            if model.relates(users[user], room) {
                model.subs.insert((user, sub), room.to_owned());
            }
        } else if let Some(key) = model.subs.keys().find(|(owner, _)| *owner == user).cloned() {
            clients[user].send(json!({"op": "unsubscribe", "sub": key.1})).await;
            model.subs.remove(&key);
        }
        for (index, client) in clients.iter_mut().enumerate() {
            barrier(client, step).await;
            check_client(client, index, &model, step, seed);
        }
    }
    assert!(!model.ended.is_empty() && n_subscriptions > 10, "the run ended some subscriptions ({seed})");
}

/// One client against the model after a step: every live subscription shows
/// its room's tail; every ended one got one `ended` and shows what it showed
/// then; a refused subscribe is `forbidden`; nothing else ended.
fn check_client(client: &Client, user: usize, model: &Model, step: usize, seed: u64) {
    let context = format!("seed {seed}, step {step}, user {user}");
    for ((owner, sub), room) in &model.subs {
        if *owner == user {
            assert_eq!(texts(client, sub), model.tail(room), "{context}: {sub}");
            assert!(ended_frames(client, sub).is_empty(), "{context}: {sub} ended");
        }
    }
    for ((owner, sub), shown) in &model.ended {
        if *owner == user {
            assert_eq!(&texts(client, sub), shown, "{context}: {sub} after its end");
            let ended = ended_frames(client, sub);
            assert_eq!(ended.len(), 1, "{context}: {sub}: {:?}", client.frames);
            assert_eq!(ended[0]["reason"], "access_ended", "{context}");
        }
    }
    for frame in &client.frames {
        let sub = frame["sub"].as_str().unwrap_or_default();
        if frame["type"] == "ended" {
            assert!(model.ended.contains_key(&(user, sub.to_owned())), "{context}: unexpected {frame}");
        }
        if frame["type"] == "error" && !sub.starts_with("barrier-") {
            assert_eq!(frame["code"], "forbidden", "{context}: {frame}");
            let known =
                model.subs.contains_key(&(user, sub.to_owned())) || model.ended.contains_key(&(user, sub.to_owned()));
            assert!(!known, "{context}: a subscription the model holds was refused: {frame}");
        }
    }
}
