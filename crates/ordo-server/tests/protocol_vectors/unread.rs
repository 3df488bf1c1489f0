//! The `unread_views` case: a member list and its "unread" subset, whose filter
//! compares two fields of each membership, one read through its reference
//! (`room.last_seq > read_upto`). A message (one write to the room) moves the
//! room in the list and flips it into "unread"; a mark-as-read (one write to the
//! membership) flips it out.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::case::Case;
use crate::common::Server;
use crate::recorder::{fresh, Recorder};

fn chat(id: &str, name: &str, recency: u64, last_seq: u64) -> Value {
    json!({"op": "upsert", "id": id, "fields": {"name": name, "recency": recency, "last_seq": last_seq}})
}

fn member(owner: &str, room: &str, read_upto: u64) -> Value {
    json!({"op": "upsert", "id": format!("{owner}/{room}"),
           "fields": {"owner": owner, "room": room, "read_upto": read_upto}})
}

/// `chats` stands for the flagship's `rooms` (the corpus's `rooms` is another
/// layout); `members` reference them.
fn create_collections(server: &Server) {
    server.ok(
        "PUT",
        "/v1/collections/chats",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"},
                          {"name": "last_seq", "type": "u64"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/members",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "chats"},
                          {"name": "read_upto", "type": "u64"}]}),
    );
}

fn member_list(sub: &str, filter: Value) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "members", "filter": filter,
        "sort": [{"field": "room.recency", "dir": "desc"}], "offset": 0, "limit": 5,
        "fields": ["read_upto", "room.name", "room.last_seq"], "payload": false})
}

pub(crate) async fn unread_views(server: &Server) -> Case {
    create_collections(server);
    let write_to = |collection: &str, ops: Value| {
        server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }));
    };
    write_to("chats", json!([chat("c1", "General", 10, 3), chat("c2", "Random", 20, 5), chat("c3", "Ann", 30, 1)]));
    write_to(
        "members",
        json!([member("u1", "c1", 3), member("u1", "c2", 2), member("u1", "c3", 1), member("u2", "c1", 0)]),
    );
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["all", "unread"])).await;
    let initial = recorder.client.lists.clone();
    let own = json!({"field": "owner", "op": "eq", "value": "u1"});
    let unread = json!({"field": "room.last_seq", "op": "gt", "value": {"field": "read_upto"}});
    let views = [member_list("all", own.clone()), member_list("unread", json!({"all": [own, unread]}))];
    for view in &views {
        recorder.request(view.clone()).await;
    }
    recorder.settle(server, &views, "subscribed").await;
    let writes = [
        // A message in c1: it moves to the top of `all` and enters `unread`.
        ("chats", json!([{"op": "upsert", "id": "c1", "fields": {"recency": 40, "last_seq": 4}}])),
        // u1 reads c1: out of `unread`, a `Set` in `all`.
        ("members", json!([{"op": "upsert", "id": "u1/c1", "fields": {"read_upto": 4}}])),
        // A message in c2, already unread: it moves in both.
        ("chats", json!([{"op": "upsert", "id": "c2", "fields": {"recency": 50, "last_seq": 6}}])),
        // A rename: shown, read by neither filter nor sort: a `Set` in both.
        ("chats", json!([{"op": "upsert", "id": "c2", "fields": {"name": "Off-topic"}}])),
        // u1 reads c2 only up to its fifth message: still unread.
        ("members", json!([{"op": "upsert", "id": "u1/c2", "fields": {"read_upto": 5}}])),
        // u1 reads c2 whole: out.
        ("members", json!([{"op": "upsert", "id": "u1/c2", "fields": {"read_upto": 6}}])),
        // Messages in c1 and c3 in one batch: both enter `unread` and move in `all`.
        (
            "chats",
            json!([{"op": "upsert", "id": "c1", "fields": {"recency": 60, "last_seq": 5}},
                   {"op": "upsert", "id": "c3", "fields": {"recency": 70, "last_seq": 2}}]),
        ),
        // Another member's read changes nothing of u1's lists: no frame.
        ("members", json!([{"op": "upsert", "id": "u2/c1", "fields": {"read_upto": 5}}])),
    ];
    for (collection, ops) in writes {
        write_to(collection, ops);
        recorder.settle(server, &views, "after a write").await;
    }
    recorder.drain().await;
    Case {
        name: "unread_views",
        description: "A member list (`members.room` references `chats`) and its unread subset, whose filter \
                      compares two fields of the same item: `room.last_seq > read_upto`, the value being \
                      `{\"field\": \"read_upto\"}`. A message (one write to the room) moves the room in the list \
                      and flips it into the unread list; a mark-as-read (one write to the membership) flips it out \
                      and changes the list's row in place; a rename is a `Set` in both.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}
