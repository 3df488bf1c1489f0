//! Views that read through `ref` fields over the wire (docs/PROTOCOL.md,
//! "Reading through references"): dotted names in `sort`, `filter` and
//! `fields`; the minimal diffs a target update gives (a move, a `Set` for
//! shown data, nothing for unshown data); null for a missing target; bad
//! names; the access rule (a caller reads through a reference only when it may
//! read the whole target; the `through` rule form is in `read_through.rs`); schema changes ending such subscriptions; and a
//! model test where every client list equals a one-shot query.

mod common;

use std::time::{Duration, Instant};

use common::{create_rooms_and_members, mint, query_items, write_secret, Client, LocalList, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

fn batch(server: &Server, collection: &str, ops: Value) -> u64 {
    server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }))["seq"].as_u64().unwrap()
}

/// The subscription of the example: sorted by the room's recency,
/// filtered on its name, showing two room fields.
fn room_list_sub(sub: &str) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "members",
        "filter": {"all": [{"field": "owner", "op": "eq", "value": "a"}, {"field": "room.name", "prefix": "Al"}]},
        "sort": [{"field": "room.recency", "dir": "desc"}],
        "fields": ["unread", "room.name", "room.preview"], "limit": 10})
}

/// The one-shot query of the same view (the subscription's own keys).
fn query_of(sub: &Value) -> Value {
    let mut query = sub.clone();
    let object = query.as_object_mut().unwrap();
    for key in ["op", "sub", "collection"] {
        object.remove(key);
    }
    query
}

/// Reads frames until the client's list for `sub` equals the one-shot query of
/// its view (asked after the change, so it reflects it).
async fn settle(client: &mut Client, server: &Server, sub: &Value, what: &str) {
    let name = sub["sub"].as_str().unwrap();
    let collection = sub["collection"].as_str().unwrap();
    let deadline = Instant::now() + SETTLE;
    loop {
        let answer = server.ok("POST", &format!("/v1/collections/{collection}/query"), query_of(sub));
        let expected = query_items(&answer["items"]);
        if client.lists.get(name).is_some_and(|list| list.items == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: list {name} = {:?}, query = {expected:?}; last frames: {:?}",
            client.lists.get(name).map(|list| &list.items),
            &client.frames[client.frames.len().saturating_sub(3)..],
        );
        client.read_until(Duration::from_millis(100), |_| false).await;
    }
}

/// Diff frames that arrive for `sub` within a short wait.
async fn frames_for(client: &mut Client, sub: &str, wait: Duration) -> Vec<Value> {
    client.diffs_seen.clear();
    client.read_until(wait, |_| false).await;
    client.diffs_seen.iter().filter(|frame| frame["sub"] == sub).cloned().collect()
}

/// Waits for the next diff frame of `sub` and returns its diffs.
async fn next_diffs(client: &mut Client, sub: &str) -> Vec<Value> {
    client.diffs_seen.clear();
    let found = client.read_until(SETTLE, |client| client.diffs_seen.iter().any(|frame| frame["sub"] == sub)).await;
    assert!(found, "no diff frame for {sub}");
    let frame = client.diffs_seen.iter().find(|frame| frame["sub"] == sub).unwrap();
    frame["diffs"].as_array().unwrap().clone()
}

fn kinds(diffs: &[Value]) -> Vec<String> {
    diffs.iter().map(|diff| diff.as_object().unwrap().keys().next().unwrap().clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_sort_filter_and_show_through_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_rooms_and_members(&server);
    batch(
        &server,
        "rooms",
        json!([
            {"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 10, "preview": "hi", "muted": false}},
            {"op": "upsert", "id": "r2", "fields": {"name": "Almond", "recency": 20, "preview": "yo", "muted": false}},
            {"op": "upsert", "id": "r3", "fields": {"name": "Beta", "recency": 30, "preview": "hey", "muted": false}},
        ]),
    );
    batch(
        &server,
        "members",
        json!([
            {"op": "upsert", "id": "a/r1", "fields": {"owner": "a", "room": "r1", "unread": 1}},
            {"op": "upsert", "id": "a/r2", "fields": {"owner": "a", "room": "r2", "unread": 2}},
            {"op": "upsert", "id": "a/r3", "fields": {"owner": "a", "room": "r3", "unread": 3}},
            {"op": "upsert", "id": "b/r1", "fields": {"owner": "b", "room": "r1", "unread": 0}},
        ]),
    );
    let sub = room_list_sub("list");
    let mut client = server.connect().await;
    client.send(sub.clone()).await;
    settle(&mut client, &server, &sub, "subscribed").await;
    // The projection's target fields come flat, under their dotted names.
    let items = &client.lists["list"].items;
    let mut first = items[0].clone();
    assert!(first.as_object_mut().unwrap().remove("version").is_some_and(|version| version.is_u64()), "{first}");
    assert_eq!(
        first,
        json!({"id": "a/r2", "fields": {"unread": 2, "room.name": "Almond", "room.preview": "yo"}, "payload": null})
    );
    assert_eq!(items[1]["id"], "a/r1");
    assert_eq!(items.len(), 2, "Beta fails the filter: {items:?}");

    // The sort key through the reference changes order: a move.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"recency": 40}}]));
    let diffs = next_diffs(&mut client, "list").await;
    assert_eq!(kinds(&diffs), ["Remove", "Insert"], "{diffs:?}");
    settle(&mut client, &server, &sub, "moved").await;
    assert_eq!(client.lists["list"].items[0]["id"], "a/r1");

    // A projected target field with no sort or filter role: a `Set` in place.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r2", "fields": {"preview": "new message"}}]));
    let diffs = next_diffs(&mut client, "list").await;
    assert_eq!(kinds(&diffs), ["Set"], "{diffs:?}");
    assert_eq!(diffs[0]["Set"]["index"], 1);
    assert_eq!(diffs[0]["Set"]["value"]["fields"]["room.preview"], "new message");
    settle(&mut client, &server, &sub, "set").await;

    // A target field the view neither reads nor shows: nothing at all.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r2", "fields": {"muted": true}}]));
    let frames = frames_for(&mut client, "list", Duration::from_millis(700)).await;
    assert!(frames.is_empty(), "an unshown field changed: {frames:?}");

    // The filter through the reference: a rename out of it, and back in.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Gamma"}}]));
    settle(&mut client, &server, &sub, "filtered out").await;
    assert_eq!(client.lists["list"].items.len(), 1);
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alps"}}]));
    settle(&mut client, &server, &sub, "filtered in").await;
    assert_eq!(client.lists["list"].items.len(), 2);

    // A missing target reads null: a view without the filter shows it last.
    let all = json!({"op": "subscribe", "sub": "all", "collection": "members",
        "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["room.name", "room.recency"], "limit": 10});
    client.send(all.clone()).await;
    settle(&mut client, &server, &all, "all").await;
    batch(&server, "members", json!([{"op": "upsert", "id": "a/r9", "fields": {"owner": "a", "room": "r9"}}]));
    settle(&mut client, &server, &all, "a missing target").await;
    let last = client.lists["all"].items.last().unwrap().clone();
    assert_eq!(last["id"], "a/r9");
    assert_eq!(last["fields"], json!({"room.name": null, "room.recency": null}));
    // The target appears: the referencing item moves to where its values put it.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r9", "fields": {"name": "Nine", "recency": 99}}]));
    settle(&mut client, &server, &all, "the target appears").await;
    assert_eq!(client.lists["all"].items[0]["id"], "a/r9");
    assert_eq!(client.lists["all"].items[0]["fields"]["room.name"], "Nine");
    // And goes: null again, last again.
    batch(&server, "rooms", json!([{"op": "remove", "id": "r9"}]));
    settle(&mut client, &server, &all, "the target is removed").await;
    assert_eq!(client.lists["all"].items.last().unwrap()["fields"]["room.name"], Value::Null);

    // set_view through the reference keeps the projection.
    client
        .send(json!({"op": "set_view", "sub": "all", "req": "v1", "filter": {"field": "room.muted", "op": "eq", "value": true},
            "sort": [{"field": "room.name", "dir": "asc"}]}))
        .await;
    let mut changed = all.clone();
    changed["filter"] = json!({"field": "room.muted", "op": "eq", "value": true});
    changed["sort"] = json!([{"field": "room.name", "dir": "asc"}]);
    settle(&mut client, &server, &changed, "set_view").await;
    assert_eq!(client.lists["all"].items[0]["fields"], json!({"room.name": "Almond", "room.recency": 20}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_through_references_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_rooms_and_members(&server);
    let mut client = server.connect().await;
    let cases = [
        // Two hops.
        (json!({"sort": [{"field": "room.name.x"}]}), "more than one reference"),
        // A dot through a field that is not a ref.
        (json!({"filter": {"field": "owner.name", "is_null": true}}), "only a `ref` field"),
        // A field the target does not have.
        (json!({"fields": ["room.nope"]}), "has no field `nope`"),
        // No such field to read through.
        (json!({"sort": [{"field": "nothing.name"}]}), "no field `nothing`"),
        // A literal of the wrong type for the target field.
        (json!({"filter": {"field": "room.recency", "op": "eq", "value": "ten"}}), "u64"),
    ];
    for (index, (keys, message)) in cases.into_iter().enumerate() {
        let mut sub = json!({"op": "subscribe", "sub": format!("s{index}"), "collection": "members", "limit": 5});
        sub.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        client.send(sub.clone()).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], "invalid_view", "{sub}: {error}");
        assert!(error["message"].as_str().unwrap().contains(message), "{sub}: {error}");
        let mut query = query_of(&sub);
        query["limit"] = json!(5);
        let (status, answer) = server.http_as(None, "POST", "/v1/collections/members/query", Some(&query));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_view")), "{query}: {answer}");
    }
}

/// The "unread" list: members whose room's `recency` (standing for its last
/// message number) is past their own `unread` (the number read up to). A
/// target update flips rows in, a mark-as-read flips one out, in a keyed view
/// (the owner's equality) and through `set_view`; every list equals a one-shot
/// query of its view after each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_to_field_filters_follow_targets_and_own_fields() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_rooms_and_members(&server);
    batch(
        &server,
        "rooms",
        json!([
            {"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 10}},
            {"op": "upsert", "id": "r2", "fields": {"name": "Beta", "recency": 20}},
            {"op": "upsert", "id": "r3", "fields": {"name": "Gamma", "recency": 30}},
        ]),
    );
    batch(
        &server,
        "members",
        json!([
            {"op": "upsert", "id": "a/r1", "fields": {"owner": "a", "room": "r1", "unread": 10}},
            {"op": "upsert", "id": "a/r2", "fields": {"owner": "a", "room": "r2", "unread": 15}},
            {"op": "upsert", "id": "a/r3", "fields": {"owner": "a", "room": "r3", "unread": 30}},
            {"op": "upsert", "id": "b/r1", "fields": {"owner": "b", "room": "r1", "unread": 3}},
            {"op": "upsert", "id": "a/r9", "fields": {"owner": "a", "room": "r9", "unread": 0}},
        ]),
    );
    let unread = json!({"field": "room.recency", "op": "gt", "value": {"field": "unread"}});
    let sub = json!({"op": "subscribe", "sub": "unread", "collection": "members",
        "filter": {"all": [{"field": "owner", "op": "eq", "value": "a"}, unread]},
        "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["unread", "room.recency"], "limit": 10});
    let mut client = server.connect().await;
    client.send(sub.clone()).await;
    settle(&mut client, &server, &sub, "subscribed").await;
    let ids = |client: &Client| -> Vec<String> {
        client.lists["unread"].items.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect()
    };
    // r9 does not exist: its recency reads null, which fails the comparison.
    assert_eq!(ids(&client), ["a/r2"]);

    // New messages in r1 and r3: both flip in, in the same batch as they move.
    batch(
        &server,
        "rooms",
        json!([{"op": "upsert", "id": "r1", "fields": {"recency": 40}},
               {"op": "upsert", "id": "r3", "fields": {"recency": 31}}]),
    );
    settle(&mut client, &server, &sub, "new messages").await;
    assert_eq!(ids(&client), ["a/r1", "a/r3", "a/r2"]);

    // Mark as read: an own-field write flips one out.
    batch(&server, "members", json!([{"op": "upsert", "id": "a/r1", "fields": {"unread": 40}}]));
    settle(&mut client, &server, &sub, "marked read").await;
    assert_eq!(ids(&client), ["a/r3", "a/r2"]);

    // The room appears: null no more, and unread.
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r9", "fields": {"name": "Nine", "recency": 1}}]));
    settle(&mut client, &server, &sub, "the target appears").await;
    assert_eq!(ids(&client), ["a/r3", "a/r2", "a/r9"]);

    // set_view to the read ones, written the other way round.
    let read = json!({"all": [{"field": "owner", "op": "eq", "value": "a"},
        {"field": "unread", "op": "ge", "value": {"field": "room.recency"}}]});
    client
        .send(json!({"op": "set_view", "sub": "unread", "req": "v1", "filter": read.clone(),
        "sort": [{"field": "room.recency", "dir": "desc"}]}))
        .await;
    let mut changed = sub.clone();
    changed["filter"] = read;
    settle(&mut client, &server, &changed, "set_view").await;
    assert_eq!(ids(&client), ["a/r1"]);

    // Refused: types that do not compare, a float against an integer, a value
    // object of another shape, an unknown name on the value side.
    let cases = [
        (json!({"field": "room.name", "op": "gt", "value": {"field": "unread"}}), "cannot be compared"),
        (json!({"field": "owner", "op": "eq", "value": {"field": "room.muted"}}), "cannot be compared"),
        (json!({"field": "unread", "op": "eq", "value": {"field": "unread", "as": "u64"}}), "{\"field\": NAME}"),
        (json!({"field": "unread", "op": "eq", "value": {"field": 3}}), "{\"field\": NAME}"),
        (json!({"field": "unread", "op": "eq", "value": {"field": "nope"}}), "no field `nope`"),
    ];
    for (index, (filter, message)) in cases.into_iter().enumerate() {
        let sub = json!({"op": "subscribe", "sub": format!("bad{index}"), "collection": "members",
            "filter": filter, "limit": 5});
        client.send(sub.clone()).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], "invalid_view", "{sub}: {error}");
        assert!(error["message"].as_str().unwrap().contains(message), "{sub}: {error}");
        let mut query = query_of(&sub);
        query["limit"] = json!(5);
        let (status, answer) = server.http_as(None, "POST", "/v1/collections/members/query", Some(&query));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_view")), "{query}: {answer}");
    }
}

/// A reader whose rules let it read its own memberships, and `rooms` as given.
async fn reader_setup(rooms_rule: Option<Value>) -> (tempfile::TempDir, Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    create_rooms_and_members(&server);
    batch(
        &server,
        "rooms",
        json!([
            {"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 1, "preview": "secret one"}},
            {"op": "upsert", "id": "r2", "fields": {"name": "Beta", "recency": 2, "preview": "secret two"}},
        ]),
    );
    batch(
        &server,
        "members",
        json!([
            {"op": "upsert", "id": "alice/r1", "fields": {"owner": "alice", "room": "r1", "unread": 1}},
            {"op": "upsert", "id": "alice/r2", "fields": {"owner": "alice", "room": "r2", "unread": 5}},
        ]),
    );
    let mut rules = vec![json!({"collection": "members", "roles": ["reader"],
        "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}})];
    if let Some(rule) = rooms_rule {
        rules.push(rule);
    }
    server.ok("PUT", "/v1/rules", json!({ "rules": rules }));
    let alice = mint(&secret, "alice", "reader", &[]);
    (dir, server, alice)
}

/// Every way of reading `room.*` must be refused with `forbidden`, naming `rooms`:
/// a sort, a filter on either side of a comparison (the value side of a
/// field-to-field comparison reads the target as much as the field side), a
/// projection.
async fn assert_reads_through_refused(server: &Server, alice: &str, why: &str) {
    let reads = [
        json!({"sort": [{"field": "room.recency", "dir": "desc"}]}),
        json!({"filter": {"field": "room.name", "prefix": "A"}}),
        json!({"filter": {"field": "unread", "op": "le", "value": {"field": "room.recency"}}}),
        json!({"fields": ["room.preview"]}),
    ];
    let check = |what: &str, code: &Value, message: &Value| {
        assert_eq!(code, "forbidden", "{why}, {what}: {message}");
        assert!(message.as_str().unwrap().contains("`rooms`"), "{why}, {what}: the message names rooms: {message}");
    };
    for keys in &reads {
        // subscribe
        let mut client = server.connect_as(Some(alice)).await;
        let mut sub = json!({"op": "subscribe", "sub": "s", "collection": "members", "limit": 5});
        sub.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        client.send(sub.clone()).await;
        let error = client.expect_error().await;
        check(&format!("subscribe {keys}"), &error["code"], &error["message"]);
        assert!(!client.lists.contains_key("s"), "{why}: no frame of the view came");

        // a one-shot query
        let mut query = query_of(&sub);
        query["limit"] = json!(5);
        let (status, answer) = server.http_as(Some(alice), "POST", "/v1/collections/members/query", Some(&query));
        assert_eq!(status, 403, "{why}, query {keys}: {answer}");
        check(&format!("query {keys}"), &answer["error"]["code"], &answer["error"]["message"]);

        // resume (a fresh connection's first message)
        let mut client = server.connect_as(Some(alice)).await;
        let mut entry = sub.clone();
        entry.as_object_mut().unwrap().remove("op");
        entry["last_seq"] = json!(0);
        client.send(json!({"op": "resume", "session": "none", "subs": [entry]})).await;
        let found =
            client.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
        assert!(found, "{why}: no resumed frame: {:?}", client.frames);
        let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
        let outcome = &resumed["subs"][0];
        check(&format!("resume {keys}"), &outcome["error"]["code"], &outcome["error"]["message"]);
        client.read_until(Duration::from_millis(300), |_| false).await;
        assert!(!client.lists.contains_key("s"), "{why}: resume sent the view: {:?}", client.lists);
    }
    // set_view on a subscription of her own fields.
    let mut client = server.connect_as(Some(alice)).await;
    client
        .send(json!({"op": "subscribe", "sub": "own", "collection": "members", "fields": ["unread"], "limit": 5}))
        .await;
    client.read_until(SETTLE, |client| client.lists.contains_key("own")).await;
    assert_eq!(client.lists["own"].items.len(), 2, "{why}: her own memberships");
    for keys in &reads[..3] {
        let mut set_view = json!({"op": "set_view", "sub": "own"});
        set_view.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        client.send(set_view).await;
        let error = client.expect_error().await;
        check(&format!("set_view {keys}"), &error["code"], &error["message"]);
    }
    let shown: Vec<String> = client.lists["own"].items.iter().map(|item| item.to_string()).collect();
    assert!(shown.iter().all(|item| !item.contains("secret")), "{why}: {shown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_through_a_reference_needs_the_whole_target_readable() {
    // No rule at all on rooms.
    let (_dir, server, alice) = reader_setup(None).await;
    assert_reads_through_refused(&server, &alice, "no rule on rooms").await;
    drop(server);

    // A row-limited rule on rooms: she may read r1 only, so reading through the
    // reference (which would show r2's fields too) is refused.
    let row_limited = json!({"collection": "rooms", "roles": ["reader"],
        "read": {"filter": {"field": "name", "op": "eq", "value": "Alpha"}}});
    let (_dir, server, alice) = reader_setup(Some(row_limited)).await;
    assert_reads_through_refused(&server, &alice, "a row-limited rule on rooms").await;
    drop(server);

    // The whole of rooms readable: allowed, and her own rule still applies to members.
    let whole = json!({"collection": "rooms", "roles": ["reader"], "read": true});
    let (_dir, server, alice) = reader_setup(Some(whole)).await;
    let query = json!({"sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["room.preview"], "limit": 5});
    let (status, answer) = server.http_as(Some(&alice), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!(status, 200, "{answer}");
    let previews: Vec<&Value> =
        answer["items"].as_array().unwrap().iter().map(|i| &i["fields"]["room.preview"]).collect();
    assert_eq!(previews, [&json!("secret two"), &json!("secret one")]);
    // A comparison with a target field on its value side is allowed too.
    let query = json!({"filter": {"field": "unread", "op": "le", "value": {"field": "room.recency"}}, "limit": 5});
    let (status, answer) = server.http_as(Some(&alice), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["items"].as_array().unwrap().len(), 1, "alice/r1 only (1 <= 1; 5 > 2): {answer}");
    assert_eq!(answer["items"][0]["id"], "alice/r1");
    // But a rule may not compare two fields: `PUT /v1/rules` refuses it, and the rules stay.
    let unread_rule = json!({"rules": [{"collection": "members", "roles": ["reader"],
        "read": {"filter": {"field": "room.recency", "op": "gt", "value": {"field": "unread"}}}}]});
    let (status, answer) = server.http("PUT", "/v1/rules", Some(&unread_rule));
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_rules")), "{answer}");
    assert_eq!(server.ok("GET", "/v1/rules", Value::Null)["rules"].as_array().unwrap().len(), 2);
    let mut client = server.connect_as(Some(&alice)).await;
    client
        .send(json!({"op": "subscribe", "sub": "s", "collection": "members", "filter": {"field": "room.name", "prefix": "B"},
            "fields": ["room.name"], "limit": 5}))
        .await;
    client.read_until(SETTLE, |client| client.lists.contains_key("s")).await;
    assert_eq!(client.lists["s"].items.len(), 1, "{:?}", client.lists["s"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_field_read_through_a_reference_ends_the_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_rooms_and_members(&server);
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 1}}]));
    batch(&server, "members", json!([{"op": "upsert", "id": "a/r1", "fields": {"owner": "a", "room": "r1"}}]));
    let mut client = server.connect().await;
    let by_preview = json!({"op": "subscribe", "sub": "preview", "collection": "members",
        "fields": ["room.preview"], "limit": 5});
    let by_recency = json!({"op": "subscribe", "sub": "recency", "collection": "members",
        "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["unread"], "limit": 5});
    let own = json!({"op": "subscribe", "sub": "own", "collection": "members",
        "sort": [{"field": "unread", "dir": "desc"}], "fields": ["unread"], "limit": 5});
    for sub in [&by_preview, &by_recency, &own] {
        client.send(sub.clone()).await;
        settle(&mut client, &server, sub, "subscribed").await;
    }
    // The target's field a projection shows.
    server.ok("DELETE", "/v1/collections/rooms/fields/preview", Value::Null);
    let found = client
        .read_until(SETTLE, |client| client.frames.iter().any(|f| f["type"] == "ended" && f["sub"] == "preview"))
        .await;
    assert!(found, "frames: {:?}", client.frames);
    let ended = client.frames.iter().find(|f| f["type"] == "ended" && f["sub"] == "preview").unwrap();
    assert_eq!(ended["reason"], "field_removed", "{ended}");

    // The ref field itself: every subscription reading through it ends.
    server.ok("DELETE", "/v1/collections/members/fields/room", Value::Null);
    let found = client
        .read_until(SETTLE, |client| client.frames.iter().any(|f| f["type"] == "ended" && f["sub"] == "recency"))
        .await;
    assert!(found, "frames: {:?}", client.frames);
    // A subscription reading only its own fields stays, equal to the query.
    batch(&server, "members", json!([{"op": "upsert", "id": "a/r1", "fields": {"unread": 5}}]));
    settle(&mut client, &server, &own, "own fields stay").await;
    assert!(!client.frames.iter().any(|f| f["type"] == "ended" && f["sub"] == "own"), "{:?}", client.frames);
    // Nothing references rooms now: it can be dropped.
    server.ok("DELETE", "/v1/collections/rooms", Value::Null);
}

/// Resumes `session` with one entry for `sub`, whose list the client held as
/// `held`; returns the client once it has the `resumed` answer.
async fn resume_one(server: &Server, session: &str, sub: &Value, held: LocalList) -> Client {
    let mut resumer = server.connect().await;
    let mut entry = sub.clone();
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(held.seq);
    resumer.lists.insert(sub["sub"].as_str().unwrap().to_owned(), held);
    resumer.send(json!({"op": "resume", "session": session, "subs": [entry]})).await;
    let found = resumer.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
    assert!(found, "no resumed: {:?}", resumer.frames);
    resumer
}

/// A parked session (its connection lost) whose subscription reads through a
/// reference: a field added meanwhile ends nothing; a field of the referencing
/// collection removed meanwhile (one the view does not even read) ends it, and
/// the resume says so with `ended` before `resumed`, as a live connection
/// would have seen it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_subscription_through_a_reference_ends_when_a_field_is_removed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    create_rooms_and_members(&server);
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 1}}]));
    batch(&server, "members", json!([{"op": "upsert", "id": "a/r1", "fields": {"owner": "a", "room": "r1"}}]));
    let by_recency = json!({"op": "subscribe", "sub": "recency", "collection": "members",
        "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["unread"], "limit": 5});
    let mut parked = server.connect().await;
    parked.send(by_recency.clone()).await;
    settle(&mut parked, &server, &by_recency, "subscribed").await;
    let (session, held) = (parked.session.clone(), parked.lists["recency"].clone());
    drop(parked);

    // A field added to the members: the subscription goes on.
    server.ok("POST", "/v1/collections/members/fields", json!({"name": "tag", "type": "string"}));
    let mut parked = resume_one(&server, &session, &by_recency, held).await;
    assert!(!parked.frames.iter().any(|frame| frame["type"] == "ended"), "{:?}", parked.frames);
    let resumed = parked.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
    assert!(resumed["subs"][0].get("error").is_none(), "{resumed}");
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"recency": 2}}]));
    settle(&mut parked, &server, &by_recency, "resumed after a field was added").await;
    let (session, held) = (resumed["session"].as_str().unwrap().to_owned(), parked.lists["recency"].clone());
    drop(parked);

    // A field of the members the view neither sorts, filters nor shows, removed.
    server.ok("DELETE", "/v1/collections/members/fields/owner", Value::Null);
    let frames = resume_one(&server, &session, &by_recency, held).await.frames;
    let position = |kind: &str| frames.iter().position(|frame| frame["type"] == kind);
    let ended_at = position("ended").unwrap_or_else(|| panic!("no ended frame: {frames:?}"));
    assert!(ended_at < position("resumed").unwrap(), "{frames:?}");
    assert_eq!((&frames[ended_at]["sub"], &frames[ended_at]["reason"]), (&json!("recency"), &json!("field_removed")));
}
