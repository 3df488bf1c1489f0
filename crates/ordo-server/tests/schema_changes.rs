//! Schema changes and drops against a real server: `POST /v1/collections/{name}/fields`,
//! `DELETE /v1/collections/{name}/fields/{field}`, `DELETE /v1/collections/{name}`.
//! Subscriptions whose view reads a removed field, and every subscription of a
//! dropped collection, get an `ended` frame and nothing after it; the others
//! get a Reset in the new shape and stay equal to a one-shot query; a dropped
//! name can be created again; everything survives a restart; only admins may.

mod common;

use std::time::Duration;

use common::{mint, room_schema, write_secret, Client, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);

fn subscribe(sub: &str, collection: &str, filter: Value, sort: Value, fields: Value) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": collection, "filter": filter, "sort": sort,
           "offset": 0, "limit": 20, "fields": fields, "payload": false})
}

fn query(server: &Server, sub: &Value) -> Vec<Value> {
    let body = json!({"filter": sub["filter"], "sort": sub["sort"], "offset": sub["offset"],
                      "limit": sub["limit"], "fields": sub["fields"], "payload": sub["payload"]});
    let path = format!("/v1/collections/{}/query", sub["collection"].as_str().unwrap());
    common::query_items(&server.ok("POST", &path, body)["items"])
}

async fn settle(client: &mut Client, server: &Server, subs: &[&Value], context: &str) {
    for sub in subs {
        let id = sub["sub"].as_str().unwrap().to_owned();
        let expected = query(server, sub);
        let equal =
            client.read_until(SETTLE, |client| client.lists.get(&id).is_some_and(|list| list.items == expected)).await;
        let got = client.lists.get(&id).map(|list| list.items.clone());
        assert!(equal, "{context}: subscription {id}\n got      {got:?}\n expected {expected:?}");
    }
}

/// Waits for the `ended` frames of `subs`, and returns them.
async fn ended(client: &mut Client, subs: &[&str]) -> Vec<Value> {
    let n_before = client.frames.len();
    let found = client
        .read_until(SETTLE, |client| {
            subs.iter().all(|sub| {
                client.frames[n_before..].iter().any(|frame| frame["type"] == "ended" && frame["sub"] == *sub)
            })
        })
        .await;
    assert!(found, "no `ended` for {subs:?}; frames: {:?}", &client.frames[n_before..]);
    client.frames[n_before..].iter().filter(|frame| frame["type"] == "ended").cloned().collect()
}

fn write_rooms(server: &Server, collection: &str, from: u64, to: u64) {
    let ops: Vec<Value> = (from..to)
        .map(|n| {
            json!({"op": "upsert", "id": format!("r{n:02}"),
                        "fields": {"name": format!("room {n}"), "recency": n, "unread": n % 3, "dm": n % 2 == 0}})
        })
        .collect();
    server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({"ops": ops}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_are_added_and_removed_live_and_readers_of_a_removed_field_are_ended() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    write_rooms(&server, "rooms", 0, 12);
    let by_recency =
        subscribe("by_recency", "rooms", Value::Null, json!([{"field": "recency", "dir": "desc"}]), Value::Null);
    let unread =
        subscribe("unread", "rooms", json!({"field": "unread", "op": "gt", "value": 0}), json!([]), Value::Null);
    let sorted_by_unread =
        subscribe("sorted", "rooms", Value::Null, json!([{"field": "unread", "dir": "desc"}]), Value::Null);
    // Projects `unread` but neither filters nor sorts on it: it stays, without the field.
    let projected = subscribe(
        "projected",
        "rooms",
        json!({"field": "dm", "op": "eq", "value": true}),
        json!([]),
        json!(["name", "unread"]),
    );
    let mut client = server.connect().await;
    for sub in [&by_recency, &unread, &sorted_by_unread, &projected] {
        client.send(sub.clone()).await;
    }
    settle(&mut client, &server, &[&by_recency, &unread, &sorted_by_unread, &projected], "subscribed").await;

    // A field with a default: every item has it, and every subscription is reset to show it.
    let added =
        server.ok("POST", "/v1/collections/rooms/fields", json!({"name": "pinned", "type": "bool", "default": false}));
    assert_eq!(added["name"], "rooms");
    assert_eq!(added["fields"].as_array().unwrap().last().unwrap(), &json!({"name": "pinned", "type": "bool"}));
    let add_seq = added["seq"].as_u64().expect("a seq");
    settle(&mut client, &server, &[&by_recency, &unread, &sorted_by_unread, &projected], "field added").await;
    assert_eq!(
        client.lists["by_recency"].items[0]["fields"]["pinned"], false,
        "{:?}",
        client.lists["by_recency"].items[0]
    );
    assert!(client.lists["projected"].items[0]["fields"].get("pinned").is_none(), "an explicit projection is kept");
    // The new field is writable, filterable and sortable at once.
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "r03", "fields": {"pinned": true}}]}),
    );
    let pinned =
        subscribe("pinned", "rooms", json!({"field": "pinned", "op": "eq", "value": true}), json!([]), Value::Null);
    client.send(pinned.clone()).await;
    settle(&mut client, &server, &[&by_recency, &pinned], "written").await;
    assert_eq!(client.lists["pinned"].items.len(), 1);

    // A field removed: the subscriptions reading it end, the others are reset without it.
    let removed = server.ok("DELETE", "/v1/collections/rooms/fields/unread", Value::Null);
    assert!(removed["seq"].as_u64().unwrap() > add_seq);
    assert!(removed["fields"].as_array().unwrap().iter().all(|field| field["name"] != "unread"), "{removed}");
    let frames = ended(&mut client, &["unread", "sorted"]).await;
    for frame in &frames {
        assert_eq!(frame["reason"], "field_removed", "{frame}");
        assert!(frame["message"].as_str().unwrap().contains("unread"), "{frame}");
    }
    assert_eq!(frames.len(), 2, "only the readers of `unread` end: {frames:?}");
    // What `projected` shows now: its projection without the removed field.
    let mut projected = projected;
    projected["fields"] = json!(["name"]);
    settle(&mut client, &server, &[&by_recency, &projected, &pinned], "field removed").await;
    assert!(client.lists["by_recency"].items[0]["fields"].get("unread").is_none());
    assert!(client.lists["projected"].items[0]["fields"].get("unread").is_none());
    assert!(client.lists["projected"].items[0]["fields"].get("name").is_some());

    // No frame of an ended subscription follows; later writes reach the others.
    client.diffs_seen.clear();
    let ops: Vec<Value> = (40..43)
        .map(|n| json!({"op": "upsert", "id": format!("r{n}"), "fields": {"name": "later", "recency": n, "dm": true}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "r40", "fields": {"pinned": true, "recency": 1}}]}),
    );
    settle(&mut client, &server, &[&by_recency, &projected, &pinned], "after the removal").await;
    let stray: Vec<_> =
        client.diffs_seen.iter().filter(|frame| frame["sub"] == "unread" || frame["sub"] == "sorted").collect();
    assert!(stray.is_empty(), "frames after `ended`: {stray:?}");

    // The removed field is gone for everyone: subscribe, query and write name it in vain.
    client
        .send(subscribe("again", "rooms", json!({"field": "unread", "op": "gt", "value": 0}), json!([]), Value::Null))
        .await;
    assert_eq!(client.expect_error().await["code"], "invalid_view");
    let (status, body) = server.http(
        "POST",
        "/v1/collections/rooms/query",
        Some(&json!({"sort": [{"field": "unread", "dir": "asc"}], "limit": 10})),
    );
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_view")), "{body}");
    let (status, body) = server.http(
        "POST",
        "/v1/collections/rooms/batch",
        Some(&json!({"ops": [{"op": "upsert", "id": "x", "fields": {"unread": 1}}]})),
    );
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_batch")), "{body}");
    // The ended ids are free again.
    client.send(unread.clone().tap_filter(json!({"field": "dm", "op": "eq", "value": true}))).await;
    let unread_again = unread.clone().tap_filter(json!({"field": "dm", "op": "eq", "value": true}));
    client.lists.remove("unread");
    settle(&mut client, &server, &[&unread_again], "an ended id reused").await;

    // Refusals: unknown field, duplicate, bad default, unknown type, unknown collection.
    let refusals = [
        ("DELETE", "/v1/collections/rooms/fields/nope", None, 404, "not_found"),
        (
            "POST",
            "/v1/collections/rooms/fields",
            Some(json!({"name": "name", "type": "string"})),
            400,
            "invalid_schema",
        ),
        (
            "POST",
            "/v1/collections/rooms/fields",
            Some(json!({"name": "n", "type": "u64", "default": "x"})),
            400,
            "invalid_schema",
        ),
        ("POST", "/v1/collections/rooms/fields", Some(json!({"name": "n", "type": "text"})), 400, "invalid_schema"),
        (
            "POST",
            "/v1/collections/rooms/fields",
            Some(json!({"name": "n", "type": "u64", "extra": 1})),
            400,
            "bad_request",
        ),
        ("POST", "/v1/collections/nope/fields", Some(json!({"name": "n", "type": "u64"})), 404, "unknown_collection"),
        ("DELETE", "/v1/collections/nope", None, 404, "unknown_collection"),
    ];
    for (method, path, body, status, code) in refusals {
        let (got_status, got) = server.http(method, path, body.as_ref());
        assert_eq!((got_status, got["error"]["code"].as_str()), (status, Some(code)), "{method} {path}: {got}");
    }

    // After a restart the schema is the new one and the items agree with it.
    server.stop();
    let server = Server::start(dir.path(), &[]);
    let collection = server.ok("GET", "/v1/collections/rooms", Value::Null);
    let names: Vec<&str> =
        collection["fields"].as_array().unwrap().iter().map(|field| field["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["name", "recency", "dm", "score", "pinned"]);
    let items = query(
        &server,
        &subscribe("q", "rooms", json!({"field": "pinned", "op": "eq", "value": true}), json!([]), Value::Null),
    );
    let ids: Vec<&str> = items.iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["r03", "r40"]);
    server.stop();
}

trait TapFilter {
    fn tap_filter(self, filter: Value) -> Value;
}

impl TapFilter for Value {
    fn tap_filter(mut self, filter: Value) -> Value {
        self["filter"] = filter;
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_ends_every_subscription_frees_the_name_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server.ok("PUT", "/v1/collections/other", room_schema());
    write_rooms(&server, "rooms", 0, 10);
    write_rooms(&server, "other", 0, 3);
    let all = subscribe("all", "rooms", Value::Null, json!([{"field": "recency", "dir": "desc"}]), Value::Null);
    let dms = subscribe("dms", "rooms", json!({"field": "dm", "op": "eq", "value": true}), json!([]), Value::Null);
    let kept = subscribe("kept", "other", Value::Null, json!([{"field": "recency", "dir": "asc"}]), Value::Null);
    let mut client = server.connect().await;
    // A second client shares the window of `all` (same definition): it ends too.
    let mut sharer = server.connect().await;
    for sub in [&all, &dms, &kept] {
        client.send(sub.clone()).await;
    }
    sharer.send(all.clone()).await;
    settle(&mut client, &server, &[&all, &dms, &kept], "subscribed").await;
    settle(&mut sharer, &server, &[&all], "subscribed").await;
    // A parked session: its client went away, to resume later.
    let mut parked = server.connect().await;
    parked.send(dms.clone()).await;
    settle(&mut parked, &server, &[&dms], "subscribed").await;
    let parked_list = parked.lists["dms"].clone();
    let parked_session = parked.session.clone();
    drop(parked);

    let dropped = server.ok("DELETE", "/v1/collections/rooms", Value::Null);
    assert_eq!(dropped["dropped"], "rooms");
    let seq = dropped["seq"].as_u64().unwrap();
    for frame in ended(&mut client, &["all", "dms"]).await {
        assert_eq!(frame["reason"], "collection_dropped", "{frame}");
        assert!(frame["message"].as_str().unwrap().contains("rooms"), "{frame}");
    }
    assert_eq!(ended(&mut sharer, &["all"]).await[0]["reason"], "collection_dropped");

    // Gone for every route; the other collection goes on.
    assert_eq!(server.http("GET", "/v1/collections/rooms", None).0, 404);
    let (status, body) =
        server.http("POST", "/v1/collections/rooms/batch", Some(&json!({"ops": [{"op": "remove", "id": "r01"}]})));
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_collection")));
    assert_eq!(server.http("POST", "/v1/collections/rooms/query", Some(&json!({}))).0, 404);
    assert_eq!(server.http("DELETE", "/v1/collections/rooms", None).0, 404);
    let listed = server.ok("GET", "/v1/collections", Value::Null);
    assert_eq!(listed["collections"].as_array().unwrap().len(), 1, "{listed}");
    client.send(dms.clone()).await;
    assert_eq!(client.expect_error().await["code"], "unknown_collection");
    write_rooms(&server, "other", 5, 7);
    settle(&mut client, &server, &[&kept], "the other collection after the drop").await;

    // The parked session's subscription ended too: the resume says so first.
    let mut resumer = server.connect().await;
    let mut entry = dms.clone();
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(parked_list.seq);
    resumer.send(json!({"op": "resume", "session": parked_session, "subs": [entry]})).await;
    let found = resumer.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
    assert!(found, "no resumed: {:?}", resumer.frames);
    let position = |kind: &str| resumer.frames.iter().position(|frame| frame["type"] == kind);
    let ended_at = position("ended").unwrap_or_else(|| panic!("no ended frame: {:?}", resumer.frames));
    assert!(ended_at < position("resumed").unwrap(), "{:?}", resumer.frames);
    assert_eq!(resumer.frames[ended_at]["reason"], "collection_dropped");
    let resumed = resumer.frames.iter().find(|frame| frame["type"] == "resumed").unwrap();
    assert_eq!(resumed["subs"][0]["error"]["code"], "unknown_collection", "{resumed}");

    // The name is free: a new collection of that name, with another schema, starts empty.
    let (status, created) =
        server.http("PUT", "/v1/collections/rooms", Some(&json!({"fields": [{"name": "title", "type": "string"}]})));
    assert_eq!(status, 201, "{created}");
    let written = server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "new", "fields": {"title": "fresh"}}]}),
    );
    assert!(written["seq"].as_u64().unwrap() > seq);
    let fresh = subscribe("fresh", "rooms", Value::Null, json!([]), Value::Null);
    client.send(fresh.clone()).await;
    settle(&mut client, &server, &[&fresh], "re-created").await;
    assert_eq!(client.lists["fresh"].items.len(), 1);

    server.stop();
    let server = Server::start(dir.path(), &[]);
    let collection = server.ok("GET", "/v1/collections/rooms", Value::Null);
    assert_eq!(collection["fields"], json!([{"name": "title", "type": "string"}]));
    assert_eq!(collection["items"], 1, "the dropped collection's items stayed dropped");
    assert_eq!(server.ok("GET", "/v1/collections/other", Value::Null)["items"], 5);
    server.stop();
}

#[test]
fn only_admins_change_schemas_and_drop_collections() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    let admin = mint(&secret_file, "ops", "admin", &[]);
    server.token = Some(admin.clone());
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    // Even with rules that let them do everything else to the collection.
    server.ok("PUT", "/v1/rules", json!({"rules": [{"collection": "rooms", "roles": ["reader", "writer"], "read": true, "write": true, "create": true}]}));
    let add = json!({"name": "pinned", "type": "bool"});
    for role in ["reader", "writer"] {
        let token = mint(&secret_file, "u1", role, &[]);
        let attempts = [
            ("POST", "/v1/collections/rooms/fields", Some(&add)),
            ("DELETE", "/v1/collections/rooms/fields/name", None),
            ("DELETE", "/v1/collections/rooms", None),
        ];
        for (method, path, body) in attempts {
            let (status, answer) = server.http_as(Some(&token), method, path, body);
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (403, Some("forbidden")),
                "{role} {method} {path}: {answer}"
            );
        }
        let (status, _) = server.http_as(None, "DELETE", "/v1/collections/rooms", None);
        assert_eq!(status, 401, "no token");
    }
    // Nothing changed; an admin may, but not on the server's own collections.
    let collection = server.ok("GET", "/v1/collections/rooms", Value::Null);
    assert_eq!(collection["fields"], room_schema()["fields"]);
    let (status, answer) = server.http_as(Some(&admin), "DELETE", "/v1/collections/_ordo%2Frules", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    assert_eq!(server.http_as(Some(&admin), "POST", "/v1/collections/rooms/fields", Some(&add)).0, 200);
    assert_eq!(server.http_as(Some(&admin), "DELETE", "/v1/collections/rooms/fields/pinned", None).0, 200);
    assert_eq!(server.http_as(Some(&admin), "DELETE", "/v1/collections/rooms", None).0, 200);
    server.stop();
}
