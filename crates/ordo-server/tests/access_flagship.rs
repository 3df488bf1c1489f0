//! The flagship chat's access rules against a naive model, on a real server:
//! rooms shared by their members and private to them, each reader's room list
//! read through its memberships (`"through": "members.room"`), messages read by
//! relationship (`"related"`), memberships that a reader may only mark read or
//! favourite. A writer (the app's backend) makes users join and leave rooms and
//! writes messages; readers subscribe to their lists (sorted and filtered
//! through the reference, unread as a field compared with a field) and to the
//! messages of rooms, and try everything that must fail: reading rooms
//! directly, messages of a room they are not in (or without pinning the room),
//! rewriting their membership's `room` or `owner`, creating or removing one,
//! marking another's. After every step every list equals the model, every
//! refusal is the documented one, a subscription to a room's messages ends
//! (`ended` / `access_ended`) when its reader leaves the room, and no frame of
//! it ever holds a message written after that.
//!
//! `ORDO_FLAGSHIP_MODEL_SEEDS` and `ORDO_FLAGSHIP_MODEL_STEPS` run it longer.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{mint, write_secret, Client, Rng, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);
const USERS: [&str; 3] = ["u0", "u1", "u2"];
const ROOMS: [&str; 5] = ["!r0", "!r1", "!r2", "!r3", "!r4"];
/// A room id nobody ever creates: refusals must read the same for it.
const NO_ROOM: &str = "!nope";
const LIST_FIELDS: [&str; 4] = ["read_upto", "favourite", "room.name", "room.last_seq"];

#[derive(Clone, Debug)]
struct Room {
    recency: u64,
    last_seq: u64,
    dm: bool,
}

#[derive(Clone, Debug)]
struct Membership {
    read_upto: u64,
    favourite: bool,
}

/// The chat as it is: rooms, who is in which, and the order messages were written in.
#[derive(Default)]
struct World {
    rooms: BTreeMap<&'static str, Room>,
    members: BTreeMap<(&'static str, &'static str), Membership>,
    /// Message id → its place in the order of all writes.
    message_order: BTreeMap<String, u64>,
    n_writes: u64,
}

impl World {
    fn is_member(&self, user: &str, room: &str) -> bool {
        self.members.keys().any(|(owner, member_room)| *owner == user && *member_room == room)
    }

    /// `user`'s list as the server must show it for `sub` (filter, sort, slice, projection).
    fn room_list(&self, user: &str, sub: &Value) -> Vec<Value> {
        let mut rows: Vec<(String, Value)> = self
            .members
            .iter()
            .filter(|((owner, _), _)| *owner == user)
            .map(|((owner, room), membership)| {
                let target = &self.rooms[room];
                let fields = json!({"read_upto": membership.read_upto, "favourite": membership.favourite,
                    "room.name": format!("room {room}"), "room.last_seq": target.last_seq,
                    "room.recency": target.recency, "room.dm": target.dm});
                (format!("{owner}:{room}"), fields)
            })
            .filter(|(_, fields)| list_filter_matches(&sub["filter"], fields))
            .collect();
        let key = sub["sort"][0]["field"].as_str().unwrap();
        let descending = sub["sort"][0]["dir"] == "desc";
        rows.sort_by(|(a_id, a), (b_id, b)| {
            let ordering = compare(&a[key], &b[key]);
            let ordering = if descending { ordering.reverse() } else { ordering };
            ordering.then_with(|| a_id.as_bytes().cmp(b_id.as_bytes()))
        });
        let offset = sub["offset"].as_u64().unwrap() as usize;
        let limit = sub["limit"].as_u64().unwrap() as usize;
        rows.into_iter()
            .skip(offset)
            .take(limit)
            .map(|(id, fields)| {
                let projected: serde_json::Map<String, Value> =
                    LIST_FIELDS.iter().map(|name| (name.to_string(), fields[*name].clone())).collect();
                json!({"id": id, "fields": projected})
            })
            .collect()
    }

    /// The newest `limit` messages of `room`, newest first, as a subscription shows them.
    fn messages(&self, room: &str, limit: usize) -> Vec<Value> {
        let last_seq = self.rooms.get(room).map_or(0, |room| room.last_seq);
        (1..=last_seq)
            .rev()
            .take(limit)
            .map(|seq| json!({"id": message_id(room, seq), "fields": {"seq": seq}}))
            .collect()
    }
}

fn message_id(room: &str, seq: u64) -> String {
    format!("{room}#{seq:04}")
}

fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_u64().cmp(&b.as_u64()),
        (Value::String(a), Value::String(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        _ => std::cmp::Ordering::Equal,
    }
}

/// The list filters the test sends: none, unread, favourites, DMs.
fn list_filter_matches(filter: &Value, fields: &Value) -> bool {
    match filter["field"].as_str() {
        None => true,
        Some("room.last_seq") => fields["room.last_seq"].as_u64() > fields["read_upto"].as_u64(),
        Some(field) => fields[field] == filter["value"],
    }
}

fn random_list_filter(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => Value::Null,
        1 => json!({"field": "room.last_seq", "op": "gt", "value": {"field": "read_upto"}}),
        2 => json!({"field": "favourite", "op": "eq", "value": true}),
        _ => json!({"field": "room.dm", "op": "eq", "value": true}),
    }
}

fn random_list_sort(rng: &mut Rng) -> Value {
    match rng.below(3) {
        0 => json!([{"field": "room.recency", "dir": "desc"}]),
        1 => json!([{"field": "room.name", "dir": "asc"}]),
        _ => json!([{"field": "read_upto", "dir": "desc"}]),
    }
}

/// Frames carry no versions in the model's eyes.
fn strip_versions(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .map(|item| {
            let mut item = item.clone();
            let object = item.as_object_mut().unwrap();
            object.remove("version");
            object.remove("payload");
            item
        })
        .collect()
}

/// A live subscription of a reader.
#[derive(Clone, Debug)]
enum Sub {
    List(Value),
    /// The messages of a room, the newest `limit`; `ended_after` is the write
    /// count when the reader's membership ended (its frames may hold nothing newer).
    Messages {
        room: &'static str,
        limit: usize,
        ended_after: Option<u64>,
    },
}

struct Reader {
    name: &'static str,
    token: String,
    client: Client,
    subs: BTreeMap<String, Sub>,
}

struct Model {
    server: Server,
    world: World,
    readers: Vec<Reader>,
    writer: String,
    rng: Rng,
    next_sub: usize,
    seed: u64,
    _dir: tempfile::TempDir,
}

impl Model {
    fn writer_batch(&self, collection: &str, ops: Value) {
        let path = format!("/v1/collections/{collection}/batch");
        let (status, answer) = self.server.http_as(Some(&self.writer), "POST", &path, Some(&json!({"ops": ops})));
        assert_eq!(status, 200, "seed {}: the writer's {collection} batch: {answer}", self.seed);
    }

    /// The backend adds or removes a membership.
    fn join_or_leave(&mut self) {
        let user = *self.rng.pick(&USERS);
        let room = *self.rng.pick(&ROOMS);
        let id = format!("{user}:{room}");
        if self.world.members.remove(&(user, room)).is_some() {
            self.writer_batch("members", json!([{"op": "remove", "id": id}]));
            let n_writes = self.world.n_writes;
            for reader in self.readers.iter_mut().filter(|reader| reader.name == user) {
                for sub in reader.subs.values_mut() {
                    if let Sub::Messages { room: sub_room, ended_after: ended @ None, .. } = sub {
                        if *sub_room == room {
                            *ended = Some(n_writes);
                        }
                    }
                }
            }
        } else {
            let read_upto = self.world.rooms[room].last_seq;
            self.world.members.insert((user, room), Membership { read_upto, favourite: false });
            self.writer_batch(
                "members",
                json!([{"op": "upsert", "id": id, "fields": {
                "owner": user, "room": room, "read_upto": read_upto, "favourite": false}}]),
            );
        }
    }

    /// The backend writes a message: the message, then the room (one write however many members).
    fn message(&mut self) {
        let room_id = *self.rng.pick(&ROOMS);
        self.world.n_writes += 1;
        let room = self.world.rooms.get_mut(room_id).unwrap();
        room.last_seq += 1;
        room.recency = self.world.n_writes;
        let (seq, recency) = (room.last_seq, room.recency);
        let id = message_id(room_id, seq);
        self.world.message_order.insert(id.clone(), self.world.n_writes);
        self.writer_batch("messages", json!([{"op": "upsert", "id": id, "fields": {"room": room_id, "seq": seq}}]));
        self.writer_batch(
            "rooms",
            json!([{"op": "upsert", "id": room_id, "fields": {
            "recency": recency, "last_seq": seq}}]),
        );
    }

    async fn subscribe_list(&mut self, index: usize) {
        self.next_sub += 1;
        let id = format!("s{}", self.next_sub);
        let sub = json!({"sub": id, "collection": "members", "filter": random_list_filter(&mut self.rng),
            "sort": random_list_sort(&mut self.rng), "offset": self.rng.below(2), "limit": 1 + self.rng.below(5),
            "fields": LIST_FIELDS, "payload": false});
        let mut message = sub.clone();
        message["op"] = json!("subscribe");
        let reader = &mut self.readers[index];
        reader.client.send(message).await;
        reader.subs.insert(id, Sub::List(sub));
    }

    /// A room's messages: allowed while a member, refused alike for another room or a missing one.
    async fn subscribe_messages(&mut self, index: usize, step: usize) {
        self.next_sub += 1;
        let id = format!("s{}", self.next_sub);
        let room = if self.rng.chance(10) { NO_ROOM } else { *self.rng.pick(&ROOMS) };
        let limit = 1 + self.rng.index(4);
        let message = json!({"op": "subscribe", "sub": id, "collection": "messages",
            "filter": {"field": "room", "op": "eq", "value": room}, "sort": [{"field": "seq", "dir": "desc"}],
            "limit": limit, "fields": ["seq"], "payload": false});
        let name = self.readers[index].name;
        let allowed = self.world.is_member(name, room);
        let reader = &mut self.readers[index];
        reader.client.send(message).await;
        if allowed {
            reader.subs.insert(id, Sub::Messages { room, limit, ended_after: None });
            return;
        }
        let error = reader.client.expect_error().await;
        let context = format!("seed {} step {step} {name} messages of {room}", self.seed);
        assert_eq!(
            (error["code"].as_str(), error["sub"].as_str()),
            (Some("forbidden"), Some(id.as_str())),
            "{context}: {error}"
        );
    }

    /// The words of the refusal of `room`'s messages to a query, with the room's id replaced.
    fn refusal_words(&self, token: &str, room: &str) -> String {
        let query =
            json!({"filter": {"field": "room", "op": "eq", "value": room}, "sort": [{"field": "seq"}], "limit": 1});
        let (status, answer) = self.server.http_as(Some(token), "POST", "/v1/collections/messages/query", Some(&query));
        assert_eq!(status, 403, "seed {}: messages of {room}: {answer}", self.seed);
        answer["error"]["message"].as_str().unwrap().replace(room, "R")
    }

    /// Everything a reader must not do, each refused as documented; nothing changes.
    fn trespass(&mut self, index: usize, step: usize) {
        let name = self.readers[index].name;
        let token = self.readers[index].token.clone();
        let context = format!("seed {} step {step} reader {name}", self.seed);
        let expect_403 = |method: &str, path: &str, body: Option<&Value>, what: &str| {
            let (status, answer) = self.server.http_as(Some(&token), method, path, body);
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (403, Some("forbidden")),
                "{context} {what}: {answer}"
            );
            answer["error"]["message"].as_str().unwrap_or_default().to_owned()
        };
        let room = *self.rng.pick(&ROOMS);
        let any = json!({"sort": [{"field": "recency"}], "limit": 5});
        let rooms_words = expect_403("POST", "/v1/collections/rooms/query", Some(&any), "rooms directly");
        let none_words = expect_403("POST", "/v1/collections/no_such/query", Some(&any), "a missing collection");
        assert_eq!(rooms_words.replace("rooms", "C"), none_words.replace("no_such", "C"), "{context}");
        expect_403("GET", &format!("/v1/collections/rooms/items/{}", room.replace('!', "%21")), None, "a room by id");
        for filter in [
            Value::Null,
            json!({"field": "room", "op": "ne", "value": room}),
            json!({"any": [{"field": "room", "op": "eq", "value": room}]}),
        ] {
            let body = json!({"filter": filter, "sort": [{"field": "seq"}], "limit": 5});
            expect_403("POST", "/v1/collections/messages/query", Some(&body), "messages without a pin");
        }
        expect_403(
            "GET",
            &format!("/v1/collections/messages/items/{}", message_id(room, 1).replace('#', "%23")),
            None,
            "a message by id",
        );
        // A room one is not in and a room that does not exist: the same words.
        if let Some(outside) = ROOMS.iter().find(|room| !self.world.is_member(name, room)) {
            assert_eq!(self.refusal_words(&token, outside), self.refusal_words(&token, NO_ROOM), "{context}");
        }
        let own = self.world.members.keys().find(|(owner, _)| *owner == name).copied();
        let target = format!("{}:{room}", name);
        let attempts = [
            json!({"op": "upsert", "id": target, "fields": {"owner": name, "room": room, "read_upto": 0}}),
            json!({"op": "remove", "id": target}),
            json!({"op": "upsert", "id": format!("{}:{room}", USERS[(index + 1) % USERS.len()]), "set_max": {"read_upto": 99}}),
        ];
        for op in attempts {
            expect_403("POST", "/v1/collections/members/batch", Some(&json!({"ops": [op]})), "a membership write");
        }
        if let Some((_, own_room)) = own {
            let id = format!("{name}:{own_room}");
            for op in [
                json!({"op": "upsert", "id": id, "fields": {"room": *self.rng.pick(&ROOMS)}}),
                json!({"op": "upsert", "id": id, "fields": {"owner": USERS[(index + 1) % USERS.len()]}}),
                json!({"op": "upsert", "id": id, "increment": {"read_upto": 1}}),
                json!({"op": "upsert", "id": id, "payload": {"x": 1}}),
            ] {
                expect_403(
                    "POST",
                    "/v1/collections/members/batch",
                    Some(&json!({"ops": [op]})),
                    "rewriting its membership",
                );
            }
        }
    }

    /// A reader marks one of its rooms read, or (un)favourites it: its own writes.
    fn mark(&mut self, index: usize, step: usize) {
        let name = self.readers[index].name;
        let owned: Vec<(&'static str, &'static str)> =
            self.world.members.keys().filter(|(owner, _)| *owner == name).copied().collect();
        if owned.is_empty() {
            return;
        }
        let key = *self.rng.pick(&owned);
        let id = format!("{}:{}", key.0, key.1);
        let op = if self.rng.chance(50) {
            let last_seq = self.world.rooms[key.1].last_seq;
            let membership = self.world.members.get_mut(&key).unwrap();
            membership.read_upto = membership.read_upto.max(last_seq);
            json!({"op": "upsert", "id": id, "set_max": {"read_upto": last_seq}})
        } else {
            let membership = self.world.members.get_mut(&key).unwrap();
            membership.favourite = !membership.favourite;
            json!({"op": "upsert", "id": id, "fields": {"favourite": membership.favourite}})
        };
        let token = self.readers[index].token.clone();
        let (status, answer) =
            self.server.http_as(Some(&token), "POST", "/v1/collections/members/batch", Some(&json!({"ops": [op]})));
        assert_eq!(status, 200, "seed {} step {step} {name} marks {id}: {answer}", self.seed);
    }

    /// Reads frames until every live list of reader `index` equals the model and
    /// every subscription whose access ended got its `ended`.
    async fn settle(&mut self, index: usize, step: usize) {
        let reader = &mut self.readers[index];
        let context = format!("seed {} step {step} reader {}", self.seed, reader.name);
        let deadline = std::time::Instant::now() + SETTLE;
        loop {
            check_message_frames(reader, &self.world, &context);
            let ended: BTreeSet<String> = reader
                .client
                .frames
                .iter()
                .filter(|frame| frame["type"] == "ended")
                .map(|frame| {
                    assert_eq!(frame["reason"], "access_ended", "{context}: {frame}");
                    frame["sub"].as_str().unwrap().to_owned()
                })
                .collect();
            let done = reader.subs.iter().all(|(id, sub)| match sub {
                Sub::Messages { ended_after: Some(_), .. } => ended.contains(id),
                Sub::Messages { room, limit, .. } => {
                    !ended.contains(id) && list_is(&reader.client, id, &self.world.messages(room, *limit))
                }
                Sub::List(definition) => list_is(&reader.client, id, &self.world.room_list(reader.name, definition)),
            });
            if done {
                reader.subs.retain(|id, _| !ended.contains(id));
                return;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let frame = reader.client.next_json(left.max(Duration::from_millis(1))).await;
            match frame {
                Some(frame) if !left.is_zero() => assert_ne!(frame["type"], "error", "{context}: {frame}"),
                _ => panic!(
                    "{context}: lists never matched the model; subs {:?}, lists {:?}",
                    reader.subs, reader.client.lists
                ),
            }
        }
    }
}

fn list_is(client: &Client, id: &str, expected: &[Value]) -> bool {
    client.lists.get(id).is_some_and(|list| strip_versions(&list.items) == expected)
}

/// No frame of a messages subscription holds another room's message, or one
/// written after its reader's membership ended.
fn check_message_frames(reader: &mut Reader, world: &World, context: &str) {
    for frame in std::mem::take(&mut reader.client.diffs_seen) {
        let Some(Sub::Messages { room, ended_after, .. }) = reader.subs.get(frame["sub"].as_str().unwrap()) else {
            continue;
        };
        for diff in frame["diffs"].as_array().unwrap() {
            let body = diff.as_object().unwrap().values().next().unwrap();
            let values: Vec<&Value> = match (body.get("value"), body.get("values")) {
                (Some(value), _) => vec![value],
                (_, Some(Value::Array(values))) => values.iter().collect(),
                _ => vec![],
            };
            for item in values {
                let id = item["id"].as_str().unwrap();
                assert!(id.starts_with(&format!("{room}#")), "{context}: {id} in a subscription of {room}");
                if let Some(ended_after) = ended_after {
                    assert!(
                        world.message_order[id] <= *ended_after,
                        "{context}: {id} was written after the reader left {room}"
                    );
                }
            }
        }
    }
}

async fn start(seed: u64) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    let own = json!({"field": "owner", "op": "eq", "value": "$sub"});
    server.ok(
        "PUT",
        "/v1/collections/rooms",
        json!({"fields": [{"name": "name", "type": "string"},
        {"name": "recency", "type": "u64"}, {"name": "last_seq", "type": "u64"}, {"name": "dm", "type": "bool"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/members",
        json!({"fields": [{"name": "owner", "type": "string"},
        {"name": "room", "type": "ref", "target": "rooms"}, {"name": "read_upto", "type": "u64"},
        {"name": "favourite", "type": "bool"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/messages",
        json!({"fields": [{"name": "room", "type": "string"},
        {"name": "seq", "type": "u64"}]}),
    );
    server.ok("PUT", "/v1/rules", json!({"rules": [
        {"collection": "members", "roles": ["reader"], "read": {"filter": own},
         "write": {"filter": own, "fields": ["read_upto", "favourite"], "atomics": ["set_max"], "payload": false,
                   "create": false, "remove": false}},
        {"collection": "rooms", "roles": ["reader"], "read": {"through": "members.room"}},
        {"collection": "messages", "roles": ["reader"], "read": {"related": {"field": "room", "to": "members.room"}}},
        {"collection": "*", "roles": ["writer"], "read": true, "write": true},
    ]}));
    let writer = mint(&secret, "backend", "writer", &[]);
    let mut rng = Rng::new(seed);
    let mut world = World::default();
    let ops: Vec<Value> = ROOMS
        .iter()
        .map(|room| {
            let dm = rng.chance(40);
            world.rooms.insert(room, Room { recency: 0, last_seq: 0, dm });
            json!({"op": "upsert", "id": room, "fields": {"name": format!("room {room}"), "recency": 0,
                "last_seq": 0, "dm": dm}})
        })
        .collect();
    let (status, answer) =
        server.http_as(Some(&writer), "POST", "/v1/collections/rooms/batch", Some(&json!({"ops": ops})));
    assert_eq!(status, 200, "{answer}");
    let mut readers = Vec::new();
    for name in USERS {
        let token = mint(&secret, name, "reader", &[]);
        let client = server.connect_as(Some(&token)).await;
        readers.push(Reader { name, token, client, subs: BTreeMap::new() });
    }
    Model { server, world, readers, writer, rng, next_sub: 0, seed, _dir: dir }
}

async fn run_seed(seed: u64, n_steps: usize) {
    let mut model = start(seed).await;
    for step in 0..n_steps {
        let index = model.rng.index(USERS.len());
        match model.rng.below(100) {
            0..=24 => model.join_or_leave(),
            25..=49 => model.message(),
            50..=61 => model.subscribe_list(index).await,
            62..=73 => model.subscribe_messages(index, step).await,
            74..=85 => model.mark(index, step),
            _ => model.trespass(index, step),
        }
        for index in 0..model.readers.len() {
            model.settle(index, step).await;
        }
    }
    drop(std::mem::take(&mut model.readers));
    model.server.stop();
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_see_their_rooms_and_messages_and_nothing_else_whatever_they_try() {
    let n_seeds = env_number("ORDO_FLAGSHIP_MODEL_SEEDS", 3);
    let n_steps = env_number("ORDO_FLAGSHIP_MODEL_STEPS", 80);
    for seed in 0..n_seeds as u64 {
        run_seed(seed + 1, n_steps).await;
    }
}
