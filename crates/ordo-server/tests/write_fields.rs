//! Field-level write rules through a real server: the flagship's rule on
//! `members` lets a reader mark its own membership read (`read_upto`, also by
//! `set_max`) and favourite, and nothing else: not its `room` or `owner`, not
//! another atomic or another field's, not the payload, not creating or
//! removing a membership, not someone else's. Every refusal is `403
//! forbidden` naming the op, the id and what is not allowed, writes nothing,
//! and reads the same for a hidden item as for a missing one: on a single
//! batch, a part of `POST /v1/batch`, `DELETE .../items/{id}`, and in cluster
//! mode where an entry applies.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::nats::NatsCluster;
use common::{mint, write_secret, Server};
use serde_json::{json, Value};

/// The flagship's write rule on memberships, and the backend's.
fn flagship_rules() -> Value {
    json!({"rules": [
        {"collection": "members", "roles": ["reader"],
         "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}},
         "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"},
                   "fields": ["read_upto", "favourite"], "atomics": ["set_max"], "payload": false,
                   "create": false, "remove": false}},
        {"collection": "*", "roles": ["writer"], "read": true, "write": true}
    ]})
}

fn create_collections(server: &Server) {
    server.ok(
        "PUT",
        "/v1/collections/rooms",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "last_seq", "type": "u64"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/members",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"},
                          {"name": "read_upto", "type": "u64"}, {"name": "favourite", "type": "bool"}]}),
    );
}

/// The backend's seed: two rooms, alice in both, bob in the first.
fn seed_ops() -> (Value, Value) {
    let rooms = json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"name": "One", "last_seq": 4}},
                               {"op": "upsert", "id": "r2", "fields": {"name": "Two", "last_seq": 9}}]});
    let membership = |owner: &str, room: &str| {
        json!({"op": "upsert", "id": format!("{owner}/{room}"),
               "fields": {"owner": owner, "room": room, "read_upto": 1, "favourite": false}})
    };
    let members = json!({"ops": [membership("alice", "r1"), membership("alice", "r2"), membership("bob", "r1")]});
    (rooms, members)
}

struct Chat {
    server: Server,
    alice: String,
    backend: String,
}

fn start_chat(dir: &Path) -> Chat {
    let secret = write_secret(dir);
    let mut server = Server::start(&dir.join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    create_collections(&server);
    server.ok("PUT", "/v1/rules", flagship_rules());
    let backend = mint(&secret, "backend", "writer", &[]);
    let (rooms, members) = seed_ops();
    for (collection, body) in [("rooms", rooms), ("members", members)] {
        let path = format!("/v1/collections/{collection}/batch");
        let (status, answer) = server.http_as(Some(&backend), "POST", &path, Some(&body));
        assert_eq!(status, 200, "the backend seeds {collection}: {answer}");
    }
    let alice = mint(&secret, "alice", "reader", &[]);
    Chat { server, alice, backend }
}

/// Every membership with its fields and payload, by id (as the admin reads them).
fn memberships(server: &Server) -> Vec<Value> {
    let answer = server.ok("POST", "/v1/collections/members/query", json!({"limit": 100}));
    let mut items: Vec<Value> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| json!({"id": item["id"], "fields": item["fields"], "payload": item["payload"]}))
        .collect();
    items.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    items
}

fn fields_of(server: &Server, id: &str) -> Value {
    memberships(server).into_iter().find(|item| item["id"] == id).map_or(Value::Null, |item| item["fields"].clone())
}

/// The refusal's message, once its status and code are checked.
fn refusal(what: &str, (status, answer): (u16, Value)) -> String {
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{what}: {answer}");
    answer["error"]["message"].as_str().unwrap().to_owned()
}

/// The ops a reader may not do to a membership, each with the words naming
/// what is not allowed. `alice/r1` is hers, `alice/r3` does not exist, `bob/r1`
/// is bob's (hidden from her).
fn refused_ops() -> Vec<(Value, String)> {
    let upsert = |id: &str, key: &str, value: Value| json!({"op": "upsert", "id": id, key: value});
    let not_allowed = |id: &str, what: &str| format!("item `{id}`: its write rule does not allow {what}");
    vec![
        (upsert("alice/r1", "fields", json!({"room": "r2"})), not_allowed("alice/r1", "field `room`")),
        (upsert("alice/r1", "fields", json!({"owner": "bob"})), not_allowed("alice/r1", "field `owner`")),
        (upsert("alice/r1", "fields", json!({"read_upto": 2, "room": "r2"})), not_allowed("alice/r1", "field `room`")),
        (upsert("alice/r1", "set_max", json!({"room": "r9"})), not_allowed("alice/r1", "atomic set_max on `room`")),
        (upsert("alice/r1", "set_max", json!({"owner": "zz"})), not_allowed("alice/r1", "atomic set_max on `owner`")),
        (
            upsert("alice/r1", "increment", json!({"read_upto": 1})),
            not_allowed("alice/r1", "atomic increment on `read_upto`"),
        ),
        (upsert("alice/r1", "payload", Value::Null), not_allowed("alice/r1", "the payload")),
        (upsert("alice/r1", "payload", json!({"note": "x"})), not_allowed("alice/r1", "the payload")),
        (upsert("alice/r3", "fields", json!({"read_upto": 1})), not_allowed("alice/r3", "creating items")),
        (
            upsert("alice/r3", "fields", json!({"owner": "alice", "room": "r1"})),
            not_allowed("alice/r3", "field `owner`"),
        ),
        (json!({"op": "remove", "id": "alice/r1"}), not_allowed("alice/r1", "removing items")),
        (upsert("bob/r1", "fields", json!({"read_upto": 99})), not_allowed("bob/r1", "creating items")),
        (upsert("bob/r1", "set_max", json!({"read_upto": 99})), not_allowed("bob/r1", "creating items")),
        (json!({"op": "remove", "id": "bob/r1"}), not_allowed("bob/r1", "removing items")),
    ]
}

#[test]
fn a_reader_marks_its_own_membership_read_and_favourite() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let write = |ops: Value| {
        chat.server.http_as(Some(&chat.alice), "POST", "/v1/collections/members/batch", Some(&json!({"ops": ops})))
    };
    let (status, answer) =
        write(json!([{"op": "upsert", "id": "alice/r1", "fields": {"read_upto": 3, "favourite": true}}]));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = write(json!([{"op": "upsert", "id": "alice/r1", "set_max": {"read_upto": 2}},
                                        {"op": "upsert", "id": "alice/r2", "fields": {"favourite": true},
                                         "set_max": {"read_upto": 7}, "if": {"exists": true}}]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        fields_of(&chat.server, "alice/r1"),
        json!({"owner": "alice", "room": "r1", "read_upto": 3, "favourite": true})
    );
    assert_eq!(
        fields_of(&chat.server, "alice/r2"),
        json!({"owner": "alice", "room": "r2", "read_upto": 7, "favourite": true})
    );
    assert_eq!(fields_of(&chat.server, "bob/r1")["read_upto"], 1, "bob's membership is his");
    chat.server.stop();
}

/// Each refused op follows an allowed one in the same batch: the refusal names
/// the second op, and neither is written.
#[test]
fn everything_else_on_a_membership_is_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let before = memberships(&chat.server);
    for (op, words) in refused_ops() {
        let allowed = json!({"op": "upsert", "id": "alice/r2", "fields": {"read_upto": 8}});
        let body = json!({"ops": [allowed, op]});
        let answer = chat.server.http_as(Some(&chat.alice), "POST", "/v1/collections/members/batch", Some(&body));
        let message = refusal(&op.to_string(), answer);
        assert_eq!(message, format!("op 1: this identity may not write {words}"), "{op}");
        assert_eq!(memberships(&chat.server), before, "{op}: nothing written");
    }
    chat.server.stop();
}

/// A hidden item and a missing one answer alike, on every write path.
#[test]
fn a_hidden_membership_answers_as_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let (server, alice) = (&chat.server, Some(chat.alice.as_str()));
    let mut answers = Vec::new();
    for id in ["bob/r1", "bob/r9"] {
        let upsert = json!({"ops": [{"op": "upsert", "id": id, "fields": {"read_upto": 5}}]});
        let single = refusal(id, server.http_as(alice, "POST", "/v1/collections/members/batch", Some(&upsert)));
        let multi = json!({"writes": [{"collection": "members", "ops": upsert["ops"]}]});
        let (status, answer) = server.http_as(alice, "POST", "/v1/batch", Some(&multi));
        assert_eq!(status, 422, "{answer}");
        let part = answer["results"][0]["error"]["message"].as_str().unwrap().to_owned();
        let path = format!("/v1/collections/members/items/{}", id.replace('/', "%2F"));
        let removal = refusal(id, server.http_as(alice, "DELETE", &path, None));
        answers.push([single, part, removal].map(|message| message.replace(id, "ID")));
    }
    assert_eq!(answers[0], answers[1], "bob's membership reads as a missing one");
    assert!(answers[0][0].ends_with("creating items"), "{:?}", answers[0]);
    assert!(answers[0][2].ends_with("removing items"), "{:?}", answers[0]);
    chat.server.stop();
}

/// In `POST /v1/batch` each part stands alone: a refused part writes nothing,
/// the others are written, whether it is refused on the network thread (what an
/// op sets) or on the writer (what exists). An item under a restricted rule is
/// still written by one part of a request only.
#[test]
fn a_refused_part_of_a_multi_batch_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let part = |ops: Value| json!({"collection": "members", "ops": ops});
    let body = json!({"writes": [
        part(json!([{"op": "upsert", "id": "alice/r1", "fields": {"read_upto": 4}}])),
        part(json!([{"op": "upsert", "id": "alice/r2", "fields": {"read_upto": 9}},
                    {"op": "upsert", "id": "alice/r2", "fields": {"room": "r1"}}])),
        part(json!([{"op": "upsert", "id": "alice/r7", "fields": {"favourite": true}}])),
        part(json!([{"op": "upsert", "id": "alice/r1", "fields": {"favourite": true}}])),
    ]});
    let (status, answer) = chat.server.http_as(Some(&chat.alice), "POST", "/v1/batch", Some(&body));
    assert_eq!(status, 422, "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert!(results[0]["seq"].is_u64(), "{answer}");
    let message = |index: usize| results[index]["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        message(1),
        "write 1: op 1: this identity may not write item `alice/r2`: its write rule does not allow field `room`"
    );
    assert_eq!(
        message(2),
        "op 0: this identity may not write item `alice/r7`: its write rule does not allow creating items"
    );
    assert!(message(3).contains("also written by an earlier part"), "{answer}");
    for refused in &results[1..] {
        assert_eq!(refused["error"]["code"], "forbidden", "{answer}");
    }
    assert_eq!(fields_of(&chat.server, "alice/r1")["read_upto"], 4);
    assert_eq!(fields_of(&chat.server, "alice/r1")["favourite"], false);
    assert_eq!(fields_of(&chat.server, "alice/r2")["read_upto"], 1, "the refused part wrote nothing");
    assert_eq!(fields_of(&chat.server, "alice/r7"), Value::Null);
    chat.server.stop();
}

/// The backend's rule (`"write": true`) keeps its meaning: every field, the
/// payload, creating and removing.
#[test]
fn the_backend_still_manages_memberships() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let (server, backend) = (&chat.server, Some(chat.backend.as_str()));
    let ops = json!({"ops": [
        {"op": "upsert", "id": "alice/r1", "fields": {"room": "r2", "owner": "carol"}, "increment": {"read_upto": 1},
         "payload": {"note": 1}},
        {"op": "upsert", "id": "carol/r1", "fields": {"owner": "carol", "room": "r1"}},
        {"op": "remove", "id": "bob/r1"}]});
    let (status, answer) = server.http_as(backend, "POST", "/v1/collections/members/batch", Some(&ops));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = server.http_as(backend, "DELETE", "/v1/collections/members/items/alice%2Fr2", None);
    assert_eq!((status, &answer["removed"]), (200, &json!(true)), "{answer}");
    let ids: Vec<Value> = memberships(server).into_iter().map(|item| item["id"].clone()).collect();
    assert_eq!(ids, [json!("alice/r1"), json!("carol/r1")]);
    assert_eq!(
        fields_of(server, "alice/r1"),
        json!({"owner": "carol", "room": "r2", "read_upto": 2, "favourite": false})
    );
    chat.server.stop();
}

/// `PUT /v1/rules` refuses an unknown key of `write` and an unknown atomic
/// kind by name, with the rule's index, and keeps the rules in force.
#[test]
fn unknown_write_keys_and_atomic_kinds_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let chat = start_chat(dir.path());
    let (_, in_force) = chat.server.http("GET", "/v1/rules", None);
    for (write, words) in [
        (json!({"filter": {"field": "owner", "op": "eq", "value": "$sub"}, "feilds": ["read_upto"]}), "`feilds`"),
        (json!({"atomics": ["set_max", "multiply"]}), "`multiply`"),
        (json!({"fields": "read_upto"}), "`fields`"),
        (json!({"create": "no"}), "`create`"),
    ] {
        let rules = json!({"rules": [{"collection": "*", "roles": ["writer"], "write": true},
                                     {"collection": "members", "roles": ["reader"], "write": write}]});
        let (status, answer) = chat.server.http("PUT", "/v1/rules", Some(&rules));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_rules")), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("rule 1: `write`: ") && message.contains(words), "{message}");
    }
    assert_eq!(chat.server.http("GET", "/v1/rules", None).1, in_force, "the rules in force did not change");
    chat.server.stop();
}

/// Cluster mode: every node checks an entry's ops against the caller's rules
/// where it applies, whatever the node that published it checked. Entries put
/// on the stream directly (the network thread's check never ran) carrying
/// alice's identity write only what her rule allows. Through the API, what an
/// op sets is refused before it is published: it takes no seq.
#[test]
fn each_node_checks_the_fields_where_an_entry_applies() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let urls = nats.urls();
    let args = ["--cluster", &urls, "--node-name", "solo", "--stream-replicas", "1", "--auth-secret-file"];
    let mut server = Server::start(&dir.path().join("data"), &[&args[..], &[secret.to_str().unwrap()]].concat());
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    create_collections(&server);
    let admin = json!({"sub": "ops", "role": "admin"});
    let alice = json!({"sub": "alice", "role": "reader"});
    let write =
        |caller: &Value, ops: Value| json!({"kind": "write", "collection": "members", "ops": ops, "caller": caller});
    let (rooms, members) = seed_ops();
    let mut entries = vec![
        json!({"kind": "set_rules", "rules": flagship_rules(), "caller": admin}),
        json!({"kind": "write", "collection": "rooms", "ops": rooms["ops"], "caller": admin}),
        write(&admin, members["ops"].clone()),
        write(
            &alice,
            json!([{"op": "upsert", "id": "alice/r1", "fields": {"favourite": true}, "set_max": {"read_upto": 3}}]),
        ),
    ];
    entries.extend(refused_ops().into_iter().map(|(op, _)| write(&alice, json!([op]))));
    // Applied last: the entries before it have been applied once it has.
    entries.push(write(&admin, json!([{"op": "upsert", "id": "done/r1", "fields": {"owner": "done"}}])));
    let last = publish(&nats, &entries);
    wait_applied(&server, last);
    let expected = json!([
        {"id": "alice/r1", "fields": {"owner": "alice", "room": "r1", "read_upto": 3, "favourite": true}, "payload": null},
        {"id": "alice/r2", "fields": {"owner": "alice", "room": "r2", "read_upto": 1, "favourite": false}, "payload": null},
        {"id": "bob/r1", "fields": {"owner": "bob", "room": "r1", "read_upto": 1, "favourite": false}, "payload": null},
        {"id": "done/r1", "fields": {"owner": "done", "room": null, "read_upto": null, "favourite": null}, "payload": null},
    ]);
    assert_eq!(Value::Array(memberships(&server)), expected, "only alice's allowed write applied");

    let alice_token = mint(&secret, "alice", "reader", &[]);
    // Creation needs the items: decided where the entry applies, so published.
    for (op, words) in refused_ops().into_iter().filter(|(_, words)| !words.ends_with("creating items")) {
        let body = json!({"ops": [op]});
        let answer = server.http_as(Some(&alice_token), "POST", "/v1/collections/members/batch", Some(&body));
        assert_eq!(refusal(&op.to_string(), answer), format!("op 0: this identity may not write {words}"));
    }
    let (_, health) = server.http("GET", "/v1/health", None);
    assert_eq!(health["cluster"]["applied_seq"], last, "a write refused by what it sets is never published");
    server.stop();
}

/// Publishes `entries` to the cluster's stream in order; the last one's seq.
fn publish(nats: &NatsCluster, entries: &[Value]) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url(0)).await.unwrap());
        let mut last = 0;
        for (index, entry) in entries.iter().enumerate() {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(format!("test/write-fields/{index}"))
                .payload(entry.to_string().into_bytes().into());
            last = common::cluster::seq_of_message(
                js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence,
            );
        }
        last
    })
}

/// Waits until the node has applied `seq` (at most 20 s).
fn wait_applied(server: &Server, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, health) = server.http("GET", "/v1/health", None);
        if health["cluster"]["applied_seq"].as_u64().is_some_and(|applied| applied >= seq) {
            return;
        }
        assert!(Instant::now() < deadline, "the node did not apply seq {seq}: {health}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
