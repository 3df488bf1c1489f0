//! `ordo serve --pg-table` with `ref` columns and a payload column, against a
//! real PostgreSQL: a `ref` field holds the id of the target row's item, so a
//! view of the referencing collection sorts and filters by the target's
//! fields and moves when the target changes; the payload column is each
//! item's payload (kept across an update that leaves its TOASTed value
//! unchanged). Bad declarations are refused at start, naming table and column.

mod common;

use common::postgres::{
    follow_args, postgres, refused_start_or_started, start_following, wait_applied, APPLY_TIMEOUT, PUBLICATION, SLOT,
};
use common::{Client, Server, StartOptions};
use ordo_test_kit::postgres::PostgresServer;
use serde_json::{json, Value};

/// Above PostgreSQL's 2 KiB TOAST threshold (the column's storage is EXTERNAL: kept out of line).
const BIG_BYTES: usize = 3000;

/// Rooms, their members (a foreign key to rooms, a note as the payload) and
/// documents (a jsonb payload); the member `m4`'s room comes later.
fn create_chat(pg: &PostgresServer) {
    pg.psql(&format!(
        "CREATE TABLE rooms (id text PRIMARY KEY, name text NOT NULL);
         CREATE TABLE members (id text PRIMARY KEY, owner text NOT NULL,
           room text REFERENCES rooms ON DELETE CASCADE, note text);
         ALTER TABLE members ALTER COLUMN note SET STORAGE EXTERNAL;
         CREATE TABLE teams (id int4 PRIMARY KEY, title text NOT NULL);
         CREATE TABLE players (id text PRIMARY KEY, team int8, body jsonb);
         INSERT INTO rooms VALUES ('r1', 'Alpha'), ('r2', 'Beta'), ('r3', 'Gamma');
         INSERT INTO members VALUES ('m1', 'alice', 'r1', 'first'), ('m2', 'alice', 'r2', NULL),
           ('m3', 'alice', 'r3', repeat('n', {BIG_BYTES})), ('m9', 'bob', 'r1', 'bob''s');
         INSERT INTO teams VALUES (1, 'Reds');
         INSERT INTO players VALUES ('p1', 1, '{{\"b\": 1, \"a\": [1, 2]}}'), ('p2', 7, NULL);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE rooms, members, teams, players;"
    ))
    .unwrap();
}

/// The tables as followed: referencing tables listed before their targets,
/// which must still be created first. `players.team` has no foreign key.
const CHAT_TABLES: [&str; 4] =
    ["members:::ref.room=rooms,payload=note", "rooms", "players:::ref.team=teams,payload=body", "teams"];

/// The ids of alice's members sorted by their room's name (then id), from PostgreSQL.
fn postgres_by_room_name(pg: &PostgresServer) -> Vec<String> {
    let rows = pg
        .psql(
            "SELECT m.id FROM members m LEFT JOIN rooms r ON r.id = m.room WHERE m.owner = 'alice'
             ORDER BY r.name COLLATE \"C\" NULLS LAST, m.id COLLATE \"C\"",
        )
        .unwrap();
    rows.lines().filter(|line| !line.is_empty()).map(str::to_owned).collect()
}

fn ids(items: &[Value]) -> Vec<String> {
    items.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect()
}

/// Waits until the subscription `sub` lists exactly `expected` (by id).
async fn wait_list(client: &mut Client, sub: &str, expected: &[String], context: &str) {
    let matches = |client: &Client| client.lists.get(sub).is_some_and(|list| ids(&list.items) == expected);
    if !client.read_until(APPLY_TIMEOUT, matches).await {
        panic!("{context}: the list is {:?}, PostgreSQL says {expected:?}", ids(&client.lists[sub].items));
    }
}

/// An item's payload as the API sends it.
fn payload(server: &Server, collection: &str, id: &str) -> Value {
    server.ok("GET", &format!("/v1/collections/{collection}/items/{id}"), Value::Null)["payload"].clone()
}

/// A payload as PostgreSQL has it: the column's JSON text, or a text as a JSON string.
fn postgres_payload(pg: &PostgresServer, sql: &str) -> Value {
    let text = pg.psql(sql).unwrap();
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refs_and_payloads_are_copied_and_streamed_and_views_follow_the_target() {
    let pg = postgres();
    create_chat(&pg);
    let dir = tempfile::tempdir().unwrap();
    let args = follow_args(&pg, dir.path(), &CHAT_TABLES);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let options = StartOptions { capture_stderr: true, ..StartOptions::default() };
    let server = Server::start_with(&dir.path().join("data"), &args, options);
    let warned = server.stderr_lines().iter().any(|line| {
        line.contains("WARNING: the ref column `public.players.team` has no foreign key to `public.teams`")
    });
    assert!(warned, "a ref without a foreign key is warned about: {:?}", server.stderr_lines());
    assert!(!server.stderr_lines().iter().any(|line| line.contains("members.room` has no foreign key")));

    // The schema: a ref to the target's collection, and no field of the payload column.
    let members = server.ok("GET", "/v1/collections/members", Value::Null);
    assert_eq!(
        members["fields"],
        json!([{"name": "id", "type": "string"}, {"name": "owner", "type": "string"},
               {"name": "room", "type": "ref", "target": "rooms"}]),
        "{members}"
    );
    // The copy: ids as the target's items have them, payloads as PostgreSQL has them.
    let m1 = server.ok("GET", "/v1/collections/members/items/m1", Value::Null);
    assert_eq!((&m1["fields"]["room"], &m1["payload"]), (&json!("r1"), &json!("first")), "{m1}");
    assert_eq!(payload(&server, "members", "m2"), Value::Null, "a NULL payload column is no payload");
    assert_eq!(payload(&server, "members", "m3"), json!("n".repeat(BIG_BYTES)));
    let p1 = server.ok("GET", "/v1/collections/players/items/p1", Value::Null);
    assert_eq!(p1["fields"]["team"], "1", "an integer key's id is its decimal text: {p1}");
    let jsonb_text = pg.psql("SELECT body::text FROM players WHERE id = 'p1'").unwrap();
    assert_eq!(p1["payload"], serde_json::from_str::<Value>(&jsonb_text).unwrap());
    let (_, raw) = server.http_raw("GET", "/v1/collections/players/items/p1", None);
    assert!(String::from_utf8(raw).unwrap().contains(&jsonb_text), "the document's text as PostgreSQL prints it");

    // alice's members by their room's name: a room renamed, added or deleted moves them.
    let mut client = server.connect().await;
    client
        .send(json!({"op": "subscribe", "sub": "mine", "collection": "members",
                     "filter": {"field": "owner", "op": "eq", "value": "alice"},
                     "sort": [{"field": "room.name"}], "fields": ["room", "room.name"], "limit": 100}))
        .await;
    wait_list(&mut client, "mine", &postgres_by_room_name(&pg), "after the copy").await;
    let steps = [
        "UPDATE rooms SET name = 'Zeta' WHERE id = 'r1'",
        "BEGIN; INSERT INTO rooms VALUES ('r4', 'Aardvark'); INSERT INTO members VALUES ('m4', 'alice', 'r4', 'x'); COMMIT",
        "UPDATE members SET room = 'r2' WHERE id = 'm3'",
        "DELETE FROM rooms WHERE id = 'r2'",
    ];
    for (n, sql) in steps.iter().enumerate() {
        pg.psql(sql).unwrap();
        wait_applied(&server, n as u64 + 1);
        wait_list(&mut client, "mine", &postgres_by_room_name(&pg), sql).await;
    }
    let (status, _) = server.http("GET", "/v1/collections/members/items/m3", None);
    assert_eq!(status, 404, "m3 went with its room (ON DELETE CASCADE)");

    // A ref to an item that does not exist (no foreign key): its target's
    // fields read null, until the target appears, and again once it is gone.
    let team_title = |server: &Server| {
        let query = json!({"sort": [{"field": "team.title"}], "fields": ["team", "team.title"], "limit": 10});
        let answer = server.ok("POST", "/v1/collections/players/query", query);
        answer["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| (item["id"].clone(), item["fields"]["team.title"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(team_title(&server), [(json!("p1"), json!("Reds")), (json!("p2"), Value::Null)]);
    pg.psql("INSERT INTO teams VALUES (7, 'Blues')").unwrap();
    wait_applied(&server, 5);
    assert_eq!(team_title(&server), [(json!("p2"), json!("Blues")), (json!("p1"), json!("Reds"))]);
    pg.psql("DELETE FROM teams WHERE id = 1").unwrap();
    wait_applied(&server, 6);
    assert_eq!(team_title(&server), [(json!("p2"), json!("Blues")), (json!("p1"), Value::Null)]);

    // Payloads streamed: a jsonb document as PostgreSQL prints it, a big text,
    // then an update that leaves the TOASTed text unchanged (not sent): kept.
    pg.psql("UPDATE players SET body = '{\"z\": [true, null], \"k\": \"v\"}' WHERE id = 'p2'").unwrap();
    pg.psql(&format!("UPDATE members SET note = repeat('b', {BIG_BYTES}) WHERE id = 'm1'")).unwrap();
    pg.psql("UPDATE members SET owner = 'carol' WHERE id = 'm1'").unwrap();
    pg.psql("UPDATE members SET note = NULL WHERE id = 'm9'").unwrap();
    wait_applied(&server, 10);
    assert_eq!(
        payload(&server, "players", "p2"),
        postgres_payload(&pg, "SELECT body::text FROM players WHERE id = 'p2'")
    );
    let m1 = server.ok("GET", "/v1/collections/members/items/m1", Value::Null);
    assert_eq!(m1["fields"]["owner"], "carol");
    assert_eq!(m1["payload"], json!("b".repeat(BIG_BYTES)), "the unchanged TOASTed payload was kept");
    assert_eq!(payload(&server, "members", "m9"), Value::Null, "set to NULL: no payload");
    assert_eq!(server.ok("GET", "/v1/health", Value::Null)["postgres"]["state"], "streaming");
}

/// A first start on a data directory that holds the collections (a new
/// `--pg-slot`) drops them referrers first (the engine refuses to drop a
/// target), then copies again; a restart whose `ref` or payload columns
/// changed since the copy is refused.
#[test]
fn a_new_slot_copies_again_and_a_changed_declaration_needs_one() {
    let pg = postgres();
    create_chat(&pg);
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &CHAT_TABLES);
    kill_9(&mut server);
    pg.psql("UPDATE rooms SET name = 'Omega' WHERE id = 'r1'").unwrap();
    // The targets listed first: dropped in the order given, they would be refused.
    let targets_first = ["rooms", "teams", CHAT_TABLES[0], CHAT_TABLES[2]];
    let mut args = follow_args(&pg, dir.path(), &targets_first);
    let slot_at = args.iter().position(|arg| arg == SLOT).unwrap();
    args[slot_at] = "second_slot".to_owned();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = Server::start(&dir.path().join("data"), &args);
    let r1 = server.ok("GET", "/v1/collections/rooms/items/r1", Value::Null);
    assert_eq!(r1["fields"]["name"], "Omega", "copied again: {r1}");
    let m1 = server.ok("GET", "/v1/collections/members/items/m1", Value::Null);
    assert_eq!((&m1["fields"]["room"], &m1["payload"]), (&json!("r1"), &json!("first")), "{m1}");
    kill_9(&mut server);

    // Restarts (the slot's position is stored) with the declarations changed.
    let with_members = |members: &str, slot: &str| {
        let mut args = follow_args(&pg, dir.path(), &["rooms", "teams", members, CHAT_TABLES[2]]);
        args[slot_at] = slot.to_owned();
        args
    };
    let refused = refused_start_or_started(dir.path(), &with_members("members", "second_slot"));
    assert!(refused.contains("`room` a ref the configuration does not declare"), "{refused}");
    assert!(refused.contains("needs a new copy (start with a new --pg-slot)"), "{refused}");
    // Copied with `note` as a field (a first start), then restarted with it as the payload.
    let args = with_members("members:::ref.room=rooms", "third_slot");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kill_9(&mut Server::start(&dir.path().join("data"), &args));
    let refused =
        refused_start_or_started(dir.path(), &with_members("members:::ref.room=rooms,payload=note", "third_slot"));
    assert!(refused.contains("`note` a field, not the payload"), "{refused}");
}

fn kill_9(server: &mut Server) {
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
}

/// Each case: the tables, and what the refusal must say. Every case runs and
/// the failures are listed together.
#[test]
fn bad_ref_and_payload_declarations_are_refused_at_start_naming_table_and_column() {
    let pg = postgres();
    pg.psql(&format!(
        "CREATE TABLE rooms (id text PRIMARY KEY, name text, score int4);
         CREATE TABLE pairs (a int4, b int4, PRIMARY KEY (a, b));
         CREATE TABLE members (id text PRIMARY KEY, room text, pair int4, count int8, body text, doc jsonb);
         CREATE TABLE tree (id int4 PRIMARY KEY, parent int4);
         CREATE TABLE left_side (id int4 PRIMARY KEY, right_id int4);
         CREATE TABLE right_side (id int4 PRIMARY KEY, left_id int4);
         CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES;"
    ))
    .unwrap();
    let cases: [(&[&str], &str); 10] = [
        (
            &["members:::ref.room=rooms"],
            "public.members: the ref column `room` points at `public.rooms`, which is not a followed table",
        ),
        (
            &["members:::ref.pair=pairs", "pairs"],
            "the ref column `pair` points at `public.pairs`, whose primary key has 2 columns",
        ),
        (&["members:::ref.count=rooms", "rooms"], "the ref column `count` cannot hold the ids of `public.rooms`"),
        (&["members:::ref.nope=rooms", "rooms"], "public.members: the ref column `nope` is not a column"),
        (&["tree:::ref.parent=tree"], "public.tree: the ref column `parent` points at its own table"),
        (
            &["left_side:::ref.right_id=right_side", "right_side:::ref.left_id=left_side"],
            "public.left_side, public.right_side form a cycle",
        ),
        (&["members:::payload=count"], "public.members: the payload column `count` is not of type text"),
        (&["members:::payload=id"], "public.members: the payload column `id` is in the primary key"),
        (&["members:::payload=gone"], "public.members: the payload column `gone` is not a column"),
        (&["members::body,doc:payload=body"], "the payload column `body` is also a field"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (tables, expected) in cases {
        let output = refused_start_or_started(dir.path(), &follow_args(&pg, dir.path(), tables));
        if !output.contains(expected) {
            failures.push(format!("{tables:?}: expected `{expected}` in:\n{output}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `make pg-demo`'s chat (scripts/pg-demo.sql) followed with `--demo`: the
/// demo installs its rules on the followed collections and writes nothing; a
/// user reads its rooms through its memberships, sorted by the rooms'
/// activity; a message INSERTed in PostgreSQL moves its room; the demo's
/// own writes are refused (`read_only_source`).
#[test]
fn the_demo_on_the_followed_chat_reads_it_under_its_rules() {
    let pg = postgres();
    let sql = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-demo.sql")).unwrap();
    pg.psql(&sql).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = follow_args(&pg, dir.path(), &["rooms", "members:::ref.room=rooms", "messages"]);
    let publication_at = args.iter().position(|arg| arg == PUBLICATION).unwrap();
    args[publication_at] = "ordo_chat".to_owned();
    args.push("--demo".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = Server::start(&dir.path().join("data"), &args).signed_in_as_demo_admin();
    let status = server.ok("GET", "/demo/simulator", Value::Null);
    assert_eq!(status, json!({"follows_postgres": true, "rate": 0, "sent": 0}));
    let bob = server.ok("POST", "/demo/token", json!({"user": "bob"}))["token"].as_str().unwrap().to_owned();
    let as_bob = |path: &str, body: Value| server.http_as(Some(&bob), "POST", path, Some(&body));
    let by_activity = json!({"sort": [{"field": "room.recency", "dir": "desc"}], "fields": ["room.name"], "limit": 20});
    let rooms_of_bob = || {
        let (status, answer) = as_bob("/v1/collections/members/query", by_activity.clone());
        assert_eq!(status, 200, "{answer}");
        ids(answer["items"].as_array().unwrap())
    };
    let before = rooms_of_bob();
    assert_eq!(before.len(), 6, "bob's memberships, and only his: {before:?}");
    pg.psql("INSERT INTO messages (room, author, text) VALUES ('books', 'dave', 'chapter 3?')").unwrap();
    wait_applied(&server, 1);
    assert_eq!(rooms_of_bob()[0], "bob:books", "the room with the new message first");
    let (status, answer) = as_bob("/demo/send", json!({"room": "books", "text": "hi"}));
    assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("read_only_source")), "{answer}");
    // Another room's messages stay out of reach.
    let tokyo = json!({"filter": {"field": "room", "op": "eq", "value": "tokyo"}, "limit": 5});
    assert_eq!(as_bob("/v1/collections/messages/query", tokyo).0, 403, "bob is no member of tokyo");
    kill_9(&mut server);
}
