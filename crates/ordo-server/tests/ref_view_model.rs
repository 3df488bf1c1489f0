//! Model test of views read through a `ref` field over the WebSocket: random
//! room (target) updates and removals, rooms re-created, memberships
//! (referencing items) upserted, re-pointed and removed, references to rooms
//! that never exist. After every step, every client list (rebuilt from its
//! diff frames) equals a one-shot query of its view, and every target field it
//! shows equals a naive lookup of the room (null when the room is absent).
//! Bounded: about 150 steps, a few seconds. `ORDO_MODEL_SEED` picks the seed.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{query_items, Client, Rng, Server};
use serde_json::{json, Map, Value};

const ROOMS: [&str; 8] = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"];
/// Rooms r0..r5 come and go; r6 and r7 are referenced but never created.
const N_CREATED: usize = 6;
const NAMES: [&str; 5] = ["Alpha", "almond", "Beta", "", "Zeta"];

fn subscriptions() -> Vec<Value> {
    vec![
        json!({"sub": "by_recency", "filter": {"field": "owner", "op": "eq", "value": "a"},
            "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["unread", "room.name"], "limit": 6}),
        json!({"sub": "by_name", "filter": {"field": "room.name", "prefix": "a"},
            "sort": [{"field": "room.name", "dir": "asc"}, {"field": "unread", "dir": "desc"}],
            "fields": ["room.name", "room.preview"], "limit": 5}),
        // Shows room fields without sorting or filtering on them.
        json!({"sub": "shown", "sort": [{"field": "unread", "dir": "desc"}],
            "fields": ["owner", "room", "room.preview", "room.muted"], "limit": 8}),
        json!({"sub": "unmuted", "filter": {"field": "room.muted", "op": "eq", "value": false},
            "sort": [{"field": "room.recency", "dir": "asc"}], "offset": 1, "limit": 3, "payload": false}),
    ]
}

fn query_of(sub: &Value) -> Value {
    let mut query = sub.clone();
    query.as_object_mut().unwrap().remove("sub");
    query
}

fn random_room_op(rng: &mut Rng) -> Value {
    let id = ROOMS[rng.below(N_CREATED as u64) as usize];
    if rng.below(5) == 0 {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = Map::new();
    if rng.below(2) == 0 {
        fields.insert("name".into(), json!(NAMES[rng.below(NAMES.len() as u64) as usize]));
    }
    if rng.below(3) != 0 {
        fields.insert("recency".into(), json!(rng.below(20)));
    }
    if rng.below(3) == 0 {
        fields.insert("preview".into(), json!(format!("message {}", rng.below(100))));
    }
    if rng.below(3) == 0 {
        fields.insert("muted".into(), if rng.below(6) == 0 { Value::Null } else { json!(rng.below(2) == 0) });
    }
    json!({"op": "upsert", "id": id, "fields": fields})
}

fn random_member_op(rng: &mut Rng) -> Value {
    let owner = ["a", "b"][rng.below(2) as usize];
    let id = format!("{owner}/{}", rng.below(10));
    if rng.below(6) == 0 {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = Map::new();
    fields.insert("owner".into(), json!(owner));
    if rng.below(2) == 0 {
        let room = if rng.below(10) == 0 { Value::Null } else { json!(ROOMS[rng.below(ROOMS.len() as u64) as usize]) };
        fields.insert("room".into(), room);
    }
    if rng.below(2) == 0 {
        fields.insert("unread".into(), json!(rng.below(5)));
    }
    json!({"op": "upsert", "id": id, "fields": fields})
}

/// Applies an op to a naive map of items (id → fields).
fn apply_naive(items: &mut BTreeMap<String, Map<String, Value>>, op: &Value) {
    let id = op["id"].as_str().unwrap().to_owned();
    if op["op"] == "remove" {
        items.remove(&id);
        return;
    }
    let item = items.entry(id).or_default();
    for (name, value) in op["fields"].as_object().unwrap() {
        item.insert(name.clone(), value.clone());
    }
}

/// Every `room.*` field a list shows equals the naive lookup (null when the
/// membership has no room or its room is absent).
fn check_shown_room_fields(
    list: &[Value],
    members: &BTreeMap<String, Map<String, Value>>,
    rooms: &BTreeMap<String, Map<String, Value>>,
    context: &str,
) {
    for item in list {
        let id = item["id"].as_str().unwrap();
        let room_id = members[id].get("room").and_then(Value::as_str);
        let room = room_id.and_then(|room_id| rooms.get(room_id));
        for (name, shown) in item["fields"].as_object().unwrap() {
            let Some(field) = name.strip_prefix("room.") else { continue };
            let expected = room.and_then(|room| room.get(field)).cloned().unwrap_or(Value::Null);
            assert_eq!(shown, &expected, "{context}: {id} shows {name} = {shown}, its room {room_id:?} has {expected}");
        }
    }
}

async fn settle(client: &mut Client, server: &Server, subs: &[Value], context: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for sub in subs {
        let name = sub["sub"].as_str().unwrap();
        loop {
            let answer = server.ok("POST", "/v1/collections/members/query", query_of(sub));
            let expected = query_items(&answer["items"]);
            if client.lists.get(name).is_some_and(|list| list.items == expected) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{context}, {name}: list = {:?}, query = {expected:?}",
                client.lists.get(name).map(|list| &list.items)
            );
            client.read_until(Duration::from_millis(50), |_| false).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_lists_through_references_equal_one_shot_queries() {
    let seed = std::env::var("ORDO_MODEL_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or(17);
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    common::create_rooms_and_members(&server);
    let mut rooms: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut members: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let subs = subscriptions();
    let mut client = server.connect().await;
    for sub in &subs {
        let mut subscribe = sub.clone();
        subscribe["op"] = json!("subscribe");
        subscribe["collection"] = json!("members");
        client.send(subscribe).await;
    }
    settle(&mut client, &server, &subs, &format!("seed {seed}, subscribed")).await;
    for step in 0..150 {
        let (collection, n_ops) =
            if rng.below(2) == 0 { ("rooms", 1 + rng.below(3)) } else { ("members", 1 + rng.below(3)) };
        let mut ops = Vec::new();
        for _ in 0..n_ops {
            let op = if collection == "rooms" { random_room_op(&mut rng) } else { random_member_op(&mut rng) };
            apply_naive(if collection == "rooms" { &mut rooms } else { &mut members }, &op);
            ops.push(op);
        }
        server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }));
        let context = format!("seed {seed}, step {step}");
        settle(&mut client, &server, &subs, &context).await;
        for sub in &subs {
            let list = &client.lists[sub["sub"].as_str().unwrap()].items;
            check_shown_room_fields(list, &members, &rooms, &context);
        }
    }
}
