//! Reading a collection only through references (`"read":{"through":"members.room"}`,
//! docs/PROTOCOL.md, "Reading through references"): a member reads its rooms'
//! fields through its own memberships and nothing of any other room; the target
//! itself is refused on every direct path with the words of a collection that does
//! not exist, and left out of the collection list; the grant holds for exactly the
//! reference it names; and a `through` rule is refused while its role could point
//! that reference.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{mint, query_items, write_secret, Client, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

fn members_rule() -> Value {
    json!({"collection": "members", "roles": ["reader"], "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}})
}

fn rooms_through_rule() -> Value {
    json!({"collection": "rooms", "roles": ["reader"], "read": {"through": "members.room"}})
}

fn backend_rule() -> Value {
    json!({"collection": "*", "roles": ["writer"], "read": true, "write": true})
}

/// The flagship's rooms and memberships, and `invites` (readable by every
/// reader) with a `room` reference of its own, which the `through` rule does not name.
fn create_collections(server: &Server) {
    let rooms = json!({"fields": [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"},
        {"name": "last_seq", "type": "u64"}, {"name": "preview", "type": "string"}, {"name": "dm", "type": "bool"}]});
    server.ok("PUT", "/v1/collections/rooms", rooms);
    let members = json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"},
        {"name": "read_upto", "type": "u64"}, {"name": "favourite", "type": "bool"}]});
    server.ok("PUT", "/v1/collections/members", members);
    let invites = json!({"fields": [{"name": "room", "type": "ref", "target": "rooms"}]});
    server.ok("PUT", "/v1/collections/invites", invites);
}

/// Writes as the chat's backend does: with a writer's token, under the rule for writers.
struct Backend<'a> {
    server: &'a Server,
    token: String,
}

impl Backend<'_> {
    fn batch(&self, collection: &str, ops: Value) {
        let path = format!("/v1/collections/{collection}/batch");
        let (status, answer) = self.server.http_as(Some(&self.token), "POST", &path, Some(&json!({ "ops": ops })));
        assert_eq!(status, 200, "{collection}: {answer}");
    }
}

/// The rooms and memberships as the test wrote them: the naive model each
/// member's list is compared with.
#[derive(Default)]
struct Model {
    rooms: BTreeMap<String, (String, u64)>,
    /// Membership id → (owner, room).
    members: BTreeMap<String, (String, String)>,
}

impl Model {
    fn room(&mut self, backend: &Backend, id: &str, name: &str, recency: u64) {
        self.rooms.insert(id.to_owned(), (name.to_owned(), recency));
        let fields = json!({"name": name, "recency": recency, "preview": format!("last words in {name}")});
        backend.batch("rooms", json!([{"op": "upsert", "id": id, "fields": fields}]));
    }

    fn join(&mut self, backend: &Backend, owner: &str, room: &str) {
        let id = format!("{owner}/{room}");
        self.members.insert(id.clone(), (owner.to_owned(), room.to_owned()));
        let fields = json!({"owner": owner, "room": room, "read_upto": 0, "favourite": false});
        backend.batch("members", json!([{"op": "upsert", "id": id, "fields": fields}]));
    }

    fn leave(&mut self, backend: &Backend, owner: &str, room: &str) {
        let id = format!("{owner}/{room}");
        self.members.remove(&id);
        backend.batch("members", json!([{"op": "remove", "id": id}]));
    }

    /// `owner`'s memberships sorted by their room's recency, newest first, as
    /// `(id, room.name)`.
    fn list_of(&self, owner: &str) -> Vec<(String, Value)> {
        let mut rows: Vec<(u64, String, Value)> = self
            .members
            .iter()
            .filter(|(_, (member, _))| member == owner)
            .map(|(id, (_, room))| match self.rooms.get(room) {
                Some((name, recency)) => (*recency, id.clone(), json!(name)),
                None => (0, id.clone(), Value::Null),
            })
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        rows.into_iter().map(|(_, id, name)| (id, name)).collect()
    }

    /// The names of the rooms `owner` is not a member of: none may reach it.
    fn names_hidden_from(&self, owner: &str) -> Vec<String> {
        let visible: Vec<&String> =
            self.members.values().filter(|(member, _)| member == owner).map(|(_, room)| room).collect();
        self.rooms.iter().filter(|(id, _)| !visible.contains(id)).map(|(_, (name, _))| name.clone()).collect()
    }
}

fn batch(server: &Server, collection: &str, ops: Value) {
    server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }));
}

/// A server with auth, the collections, and `rules` in force; the admin's token is the server's.
fn start(dir: &std::path::Path, rules: Vec<Value>) -> (Server, std::path::PathBuf) {
    let secret = write_secret(dir);
    let mut server = Server::start(&dir.join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    create_collections(&server);
    server.ok("PUT", "/v1/rules", json!({ "rules": rules }));
    (server, secret)
}

/// The flagship's room list: memberships by the room's recency, showing its name.
fn room_list(sub: &str) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "members",
        "sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["room.name", "read_upto"], "limit": 20})
}

fn rows_of(items: &[Value]) -> Vec<(String, Value)> {
    items.iter().map(|item| (item["id"].as_str().unwrap().to_owned(), item["fields"]["room.name"].clone())).collect()
}

/// Reads frames until the client's list `sub` equals the model's list of `owner`.
async fn settle(client: &mut Client, model: &Model, owner: &str, sub: &str, what: &str) {
    let expected = model.list_of(owner);
    let deadline = Instant::now() + SETTLE;
    loop {
        if client.lists.get(sub).is_some_and(|list| rows_of(&list.items) == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {owner}'s list = {:?}, model = {expected:?}",
            client.lists.get(sub).map(|list| rows_of(&list.items))
        );
        client.read_until(Duration::from_millis(100), |_| false).await;
    }
}

/// No frame `client` ever received holds a room name it may not read.
fn assert_never_shown(client: &Client, hidden: &[String], what: &str) {
    for frame in client.frames.iter().chain(&client.diffs_seen) {
        let text = frame.to_string();
        for name in hidden {
            assert!(!text.contains(name.as_str()), "{what}: `{name}` reached the member: {text}");
        }
    }
    for list in client.lists.values() {
        let text = serde_json::to_string(&list.items).unwrap();
        for name in hidden {
            assert!(!text.contains(name.as_str()), "{what}: `{name}` is in a list: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_reads_its_rooms_through_its_memberships_and_no_other_room() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret) = start(dir.path(), vec![members_rule(), rooms_through_rule(), backend_rule()]);
    let backend = Backend { server: &server, token: mint(&secret, "backend", "writer", &[]) };
    let mut model = Model::default();
    model.room(&backend, "r1", "Alpha", 10);
    model.room(&backend, "r2", "Shared", 20);
    model.room(&backend, "r3", "Bob private", 30);
    model.room(&backend, "r4", "Nobody", 40);
    model.join(&backend, "alice", "r1");
    model.join(&backend, "alice", "r2");
    model.join(&backend, "bob", "r2");
    model.join(&backend, "bob", "r3");

    let alice_token = mint(&secret, "alice", "reader", &[]);
    let bob_token = mint(&secret, "bob", "reader", &[]);
    let mut alice = server.connect_as(Some(&alice_token)).await;
    let mut bob = server.connect_as(Some(&bob_token)).await;
    alice.send(room_list("list")).await;
    bob.send(room_list("list")).await;
    settle(&mut alice, &model, "alice", "list", "subscribed").await;
    settle(&mut bob, &model, "bob", "list", "subscribed").await;
    assert_eq!(
        rows_of(&alice.lists["list"].items),
        [("alice/r2".to_owned(), json!("Shared")), ("alice/r1".to_owned(), json!("Alpha"))]
    );

    // A room she is in changes: it moves in her list, and in bob's where he is in it.
    model.room(&backend, "r1", "Alpha", 50);
    settle(&mut alice, &model, "alice", "list", "her room moved").await;
    assert_eq!(alice.lists["list"].items[0]["id"], "alice/r1");
    model.room(&backend, "r2", "Shared renamed", 60);
    settle(&mut alice, &model, "alice", "list", "a shared room moved").await;
    settle(&mut bob, &model, "bob", "list", "a shared room moved").await;

    // Rooms she is not in change, appear and go: nothing of them reaches her.
    model.room(&backend, "r3", "Bob private renamed", 70);
    model.room(&backend, "r5", "Later room", 80);
    settle(&mut bob, &model, "bob", "list", "his room moved").await;
    settle(&mut alice, &model, "alice", "list", "other rooms changed").await;
    alice.read_until(Duration::from_millis(300), |_| false).await;
    assert_never_shown(&alice, &model.names_hidden_from("alice"), "rooms she is not in");

    // The backend adds her to a room and takes her out of another: the list follows.
    model.join(&backend, "alice", "r5");
    settle(&mut alice, &model, "alice", "list", "joined r5").await;
    model.leave(&backend, "alice", "r2");
    settle(&mut alice, &model, "alice", "list", "left r2").await;
    model.room(&backend, "r2", "Shared after she left", 90);
    settle(&mut bob, &model, "bob", "list", "r2 changed after she left").await;
    settle(&mut alice, &model, "alice", "list", "r2 changed after she left").await;
    alice.read_until(Duration::from_millis(300), |_| false).await;
    assert_never_shown(&alice, &["Shared after she left".to_owned(), "Bob private".to_owned()], "after leaving");

    // A one-shot query of the same view, and one filtering on a room field.
    let query =
        json!({"sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["room.name", "read_upto"], "limit": 20});
    let (status, answer) = server.http_as(Some(&alice_token), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rows_of(&query_items(&answer["items"])), model.list_of("alice"));
    let query = json!({"filter": {"field": "room.name", "prefix": "Bob"}, "fields": ["room.name"], "limit": 20});
    let (status, answer) = server.http_as(Some(&alice_token), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!((status, answer["items"].as_array().unwrap().len()), (200, 0), "{answer}");

    // Stored rules are compiled again at start: the grant holds after a restart.
    drop((alice, bob));
    let token = server.token.clone();
    drop(server);
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = token;
    let mut alice = server.connect_as(Some(&alice_token)).await;
    alice.send(room_list("list")).await;
    settle(&mut alice, &model, "alice", "list", "after a restart").await;
}

/// Every direct way of reaching `rooms`, answered for `rooms` and for `nowhere`
/// (no such collection, no rule): the answers must be the same but for the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_is_refused_directly_with_the_words_of_a_collection_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret) = start(dir.path(), vec![members_rule(), rooms_through_rule(), backend_rule()]);
    batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 1}}]));
    batch(&server, "members", json!([{"op": "upsert", "id": "alice/r1", "fields": {"owner": "alice", "room": "r1"}}]));
    let alice = mint(&secret, "alice", "reader", &[]);

    let mut answers: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for name in ["rooms", "nowhere"] {
        let mut seen = Vec::new();
        let mut record = |what: &str, status: u16, answer: &Value| {
            seen.push(format!("{what}: {status} {}", answer["error"].to_string().replace(name, "NAME")));
        };
        let http = |method: &str, path: String, body: Option<Value>| {
            server.http_as(Some(&alice), method, &path, body.as_ref())
        };
        let (status, answer) = http("GET", format!("/v1/collections/{name}/items/r1"), None);
        record("item", status, &answer);
        let (status, answer) = http("GET", format!("/v1/collections/{name}"), None);
        record("count", status, &answer);
        for keys in [json!({}), json!({"around": {"id": "r1"}}), json!({"after": "r1"}), json!({"before": "r1"})] {
            let mut query = json!({"limit": 5});
            query.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
            let (status, answer) = http("POST", format!("/v1/collections/{name}/query"), Some(query));
            record(&format!("query {keys}"), status, &answer);
        }
        let mut client = server.connect_as(Some(&alice)).await;
        for keys in [json!({}), json!({"around": {"id": "r1"}}), json!({"after": "r1"})] {
            let mut subscribe = json!({"op": "subscribe", "sub": "s", "collection": name, "limit": 5});
            subscribe.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
            client.send(subscribe).await;
            let error = client.expect_error().await;
            record(
                &format!("subscribe {keys}"),
                0,
                &json!({"error": {"code": error["code"], "message": error["message"]}}),
            );
        }
        assert!(client.lists.is_empty(), "{name}: a view opened: {:?}", client.lists);
        let mut client = server.connect_as(Some(&alice)).await;
        let entry = json!({"sub": "s", "collection": name, "limit": 5, "last_seq": 0});
        client.send(json!({"op": "resume", "session": "none", "subs": [entry]})).await;
        let found =
            client.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
        assert!(found, "{name}: no resumed: {:?}", client.frames);
        let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
        record("resume", 0, &json!({"error": resumed["subs"][0]["error"]}));
        answers.insert(name, seen);
    }
    assert_eq!(answers["rooms"], answers["nowhere"], "rooms answers differently from a collection that does not exist");
    assert!(answers["rooms"].iter().all(|line| line.contains("forbidden")), "{:?}", answers["rooms"]);

    // The collection list names her memberships, never the rooms.
    let (status, answer) = server.http_as(Some(&alice), "GET", "/v1/collections", None);
    assert_eq!(status, 200, "{answer}");
    let names: Vec<&str> =
        answer["collections"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["members"], "{answer}");
}

/// Opens a view of `collection` reading `room.name` as `token`: the error, or `None` when it opened.
async fn room_name_view(server: &Server, token: &str, collection: &str) -> Option<Value> {
    let mut client = server.connect_as(Some(token)).await;
    let subscribe =
        json!({"op": "subscribe", "sub": "s", "collection": collection, "fields": ["room.name"], "limit": 5});
    client.send(subscribe).await;
    let done = |client: &Client| client.lists.contains_key("s") || client.frames.iter().any(|f| f["type"] == "error");
    assert!(client.read_until(SETTLE, done).await, "no answer: {:?}", client.frames);
    client.frames.iter().find(|frame| frame["type"] == "error").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_through_grant_reads_through_exactly_the_reference_it_names() {
    let invites_rule = json!({"collection": "invites", "roles": ["reader"], "read": true});
    for (rooms_rule, members_allowed) in [
        (Some(rooms_through_rule()), true),
        // Without the `through` rule, or through another reference, nothing is read through `members.room`.
        (None, false),
        (Some(json!({"collection": "rooms", "roles": ["reader"], "read": {"through": "invites.room"}})), false),
        (Some(json!({"collection": "rooms", "roles": ["reader"], "read": {"through": "members.owner"}})), false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut rules = vec![members_rule(), invites_rule.clone(), backend_rule()];
        rules.extend(rooms_rule.clone());
        let (server, secret) = start(dir.path(), rules);
        batch(&server, "rooms", json!([{"op": "upsert", "id": "r1", "fields": {"name": "Alpha", "recency": 1}}]));
        batch(
            &server,
            "members",
            json!([{"op": "upsert", "id": "alice/r1", "fields": {"owner": "alice", "room": "r1"}}]),
        );
        batch(&server, "invites", json!([{"op": "upsert", "id": "i1", "fields": {"room": "r1"}}]));
        let alice = mint(&secret, "alice", "reader", &[]);

        let refused = room_name_view(&server, &alice, "members").await;
        match (members_allowed, refused) {
            (true, None) => {}
            (false, Some(error)) => {
                assert_eq!(error["code"], "forbidden", "{rooms_rule:?}: {error}");
                assert!(error["message"].as_str().unwrap().contains("`rooms`"), "{rooms_rule:?}: {error}");
            }
            (allowed, refused) => panic!("{rooms_rule:?}: members allowed = {allowed}, got {refused:?}"),
        }
        // `invites` she reads whole, but its reference is not the one the rule names
        // (where the rule names `invites.room`, the members case above was the other one).
        let through_invites = rooms_rule.as_ref().is_some_and(|rule| rule["read"]["through"] == "invites.room");
        let refused = room_name_view(&server, &alice, "invites").await;
        assert_eq!(refused.is_none(), through_invites, "{rooms_rule:?}: invites: {refused:?}");
        if let Some(error) = refused {
            assert_eq!(error["code"], "forbidden", "{error}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_through_rule_is_refused_while_its_role_may_point_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _secret) = start(dir.path(), vec![members_rule(), rooms_through_rule(), backend_rule()]);
    let in_force = server.ok("GET", "/v1/rules", Value::Null);
    let own_memberships = json!({"collection": "members", "roles": ["reader"],
        "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}});
    let every_collection = json!({"collection": "*", "roles": ["reader"], "write": true});
    for (index, writes) in [own_memberships, every_collection].into_iter().enumerate() {
        let rules = json!({"rules": [members_rule(), rooms_through_rule(), backend_rule(), writes]});
        let (status, answer) = server.http("PUT", "/v1/rules", Some(&rules));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_rules")), "{index}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("rule 1:"), "{index}: {message}");
        assert!(message.contains("rule 3 lets `reader` set `room` of `members`"), "{index}: {message}");
        assert_eq!(server.ok("GET", "/v1/rules", Value::Null), in_force, "{index}: the rules in force changed");
    }
    // The same write rule for writers only is fine: a backend points the references.
    let writers = json!({"collection": "members", "roles": ["writer"], "write": true});
    let rules = json!({"rules": [members_rule(), rooms_through_rule(), backend_rule(), writers]});
    let (status, answer) = server.http("PUT", "/v1/rules", Some(&rules));
    assert_eq!(status, 200, "{answer}");
}
