//! `ordo serve --demo` on loopback: the embedded page and its files, the chat
//! written at start (non-ASCII room names searchable without regard to case),
//! each demo user's own room list under the flagship's rules, a message sent
//! through the demo's backend reaching its room's members and nobody else, the
//! simulator's rate endpoint at its limits, and the simulator's messages
//! reaching a subscriber as ordinary diffs.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

/// A GET that returns the status, the lower-cased header lines and the body.
fn get_with_headers(server: &Server, path: &str) -> (u16, Vec<String>, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a full response");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    (status, lines.map(str::to_ascii_lowercase).collect(), body.to_owned())
}

fn names_matching(server: &Server, needle: &str) -> Vec<String> {
    let answer = server.ok(
        "POST",
        "/v1/collections/rooms/query",
        json!({"filter": {"field": "name", "contains": needle}, "limit": 1000, "fields": ["name"]}),
    );
    answer["items"].as_array().unwrap().iter().map(|item| item["fields"]["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_demo_page_and_its_files_are_served_with_their_types() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]);
    for (path, content_type, marker) in [
        ("/demo", "text/html; charset=utf-8", "id=\"rooms\""),
        ("/demo/", "text/html; charset=utf-8", "id=\"rooms\""),
        ("/demo/index.html", "text/html; charset=utf-8", "/demo/app.js"),
        ("/demo/app.js", "text/javascript; charset=utf-8", "ordoDemo"),
        ("/demo/style.css", "text/css; charset=utf-8", ".room"),
        ("/demo/ordo-client.js", "text/javascript; charset=utf-8", "OrdoClient"),
    ] {
        let (status, headers, body) = get_with_headers(&server, path);
        assert_eq!(status, 200, "{path}");
        assert!(headers.contains(&format!("content-type: {content_type}")), "{path}: {headers:?}");
        assert!(headers.contains(&"cache-control: no-cache".to_owned()), "{path}: {headers:?}");
        assert!(body.contains(marker), "{path} lacks {marker}");
    }
    let (status, answer) = server.http("GET", "/demo/nope.js", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{answer}");
    let (status, answer) = server.http("GET", "/demo/app.js/x", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{answer}");
    let (status, _) = server.http("POST", "/demo", Some(&json!({})));
    assert_eq!(status, 405);
    server.stop();

    // Without --demo there is no demo at all: no page, no simulator, no tokens, no rooms.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    for (method, path) in [
        ("GET", "/demo"),
        ("GET", "/demo/"),
        ("GET", "/demo/app.js"),
        ("GET", "/demo/simulator"),
        ("POST", "/demo/simulator"),
        ("POST", "/demo/token"),
    ] {
        let (status, answer) = server.http(method, path, Some(&json!({"rate": 1, "user": "alice"})));
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("not_found")), "{method} {path}: {answer}");
    }
    let (status, _) = server.http("GET", "/v1/collections/rooms", None);
    assert_eq!(status, 404);
    server.stop();
}

fn demo_token(server: &Server, user: &str) -> String {
    let answer = server.ok("POST", "/demo/token", json!({"user": user}));
    assert_eq!((answer["sub"].as_str(), answer["role"].as_str()), (Some(user), Some("reader")), "{answer}");
    answer["token"].as_str().unwrap().to_owned()
}

/// `user`'s room list as the page asks for it: its memberships by the rooms' activity.
fn room_list(server: &Server, token: &str, limit: usize) -> Value {
    let query = json!({"sort": [{"field": "room.recency", "dir": "desc"}], "limit": limit,
                       "fields": ["owner", "read_upto", "room.name", "room.last_seq"]});
    let (status, answer) = server.http_as(Some(token), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!(status, 200, "{answer}");
    answer
}

#[test]
fn demo_users_sign_in_and_list_only_their_own_rooms() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]);
    let chat = ordo_server::demo::chat::Chat::generate(ordo_server::limits::DEMO_ROOMS);
    for (index, user) in ["alice", "bob", "carol"].into_iter().enumerate() {
        let token = demo_token(&server, user);
        let list = room_list(&server, &token, 1000);
        let items = list["items"].as_array().unwrap();
        assert!(items.iter().all(|item| item["fields"]["owner"] == user), "{user}: {list}");
        assert!(items.iter().all(|item| item["fields"]["room.name"].is_string()), "{user}: {list}");
        let expected = chat.rooms.iter().filter(|room| room.members.contains(&(index as u32))).count();
        assert_eq!(items.len(), expected, "{user}'s list is its rooms");
        // Rooms are read through memberships only; a room's messages only by its members.
        for (path, body) in [
            ("/v1/collections/rooms/query", json!({"limit": 10})),
            ("/v1/collections/messages/query", json!({"limit": 10})),
        ] {
            let (status, answer) = server.http_as(Some(&token), "POST", path, Some(&body));
            assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{user} {path}: {answer}");
        }
    }
    let (status, answer) = server.http("POST", "/demo/token", Some(&json!({"user": "mallory"})));
    assert_eq!(status, 400, "{answer}");
    // A demo user cannot change the simulator; without a token nobody can.
    let alice = demo_token(&server, "alice");
    let (status, answer) = server.http_as(Some(&alice), "POST", "/demo/simulator", Some(&json!({"rate": 100})));
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    let (status, _) = server.http("POST", "/demo/simulator", Some(&json!({"rate": 100})));
    assert_eq!(status, 401);
    assert_eq!(server.ok("GET", "/demo/simulator", json!(null))["rate"], 0);
    server.stop();
}

#[test]
fn a_message_moves_the_room_in_every_members_list_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]);
    let chat = ordo_server::demo::chat::Chat::generate(ordo_server::limits::DEMO_ROOMS);
    let dm = chat.rooms.iter().find(|room| room.name == "alice & bob").unwrap().id.clone();
    let (alice, bob, carol) = (demo_token(&server, "alice"), demo_token(&server, "bob"), demo_token(&server, "carol"));
    let send = |token: &str, room: &str| {
        server.http_as(Some(token), "POST", "/demo/send", Some(&json!({"room": room, "text": "hello bob"})))
    };
    let (status, answer) = send(&alice, &dm);
    assert_eq!(status, 200, "{answer}");
    let seq = answer["seq"].as_u64().unwrap();
    // At the top of both lists; unread for bob, read for alice.
    for (token, unread) in [(&alice, 0), (&bob, 1)] {
        let top = room_list(&server, token, 1)["items"][0].clone();
        assert_eq!(top["id"].as_str().unwrap().split_once(':').unwrap().1, dm, "{top}");
        let fields = &top["fields"];
        assert_eq!(fields["room.last_seq"], seq);
        assert_eq!(fields["room.last_seq"].as_u64().unwrap() - fields["read_upto"].as_u64().unwrap(), unread, "{top}");
    }
    // Carol is in neither: not in her list, not readable, not writable, and no room exists for her to probe.
    let carol_list = room_list(&server, &carol, 1000);
    assert!(carol_list["items"].as_array().unwrap().iter().all(|item| !item["id"].as_str().unwrap().ends_with(&dm)));
    let (status, refused) = send(&carol, &dm);
    let (missing_status, missing) = send(&carol, "!nope:example.org");
    assert_eq!((status, missing_status), (403, 403), "{refused} {missing}");
    assert_eq!(
        refused["error"]["message"].as_str().unwrap().replace(&dm, "R"),
        missing["error"]["message"].as_str().unwrap().replace("!nope:example.org", "R")
    );
    let messages = json!({"filter": {"field": "room", "op": "eq", "value": dm}, "sort": [{"field": "seq"}], "tail": true,
                          "limit": 5, "fields": ["author", "text"]});
    let (status, answer) = server.http_as(Some(&carol), "POST", "/v1/collections/messages/query", Some(&messages));
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = server.http_as(Some(&bob), "POST", "/v1/collections/messages/query", Some(&messages));
    assert_eq!(status, 200, "{answer}");
    let last = answer["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["fields"]["author"].as_str(), last["fields"]["text"].as_str()),
        (Some("alice"), Some("hello bob"))
    );
    // Bob marks it read; he may not point his membership at another room.
    let membership = format!("bob:{dm}");
    let read = json!({"ops": [{"op": "upsert", "id": membership, "set_max": {"read_upto": seq}}]});
    let (status, answer) = server.http_as(Some(&bob), "POST", "/v1/collections/members/batch", Some(&read));
    assert_eq!(status, 200, "{answer}");
    let repoint = json!({"ops": [{"op": "upsert", "id": membership, "fields": {"room": chat.rooms[0].id}}]});
    let (status, answer) = server.http_as(Some(&bob), "POST", "/v1/collections/members/batch", Some(&repoint));
    assert_eq!(status, 403, "{answer}");
    let top = room_list(&server, &bob, 1)["items"][0].clone();
    assert_eq!(top["fields"]["read_upto"], seq, "{top}");
    server.stop();
}

#[test]
fn demo_writes_searchable_rooms_and_checks_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]).signed_in_as_demo_admin();
    let rooms = server.ok("GET", "/v1/collections/rooms", json!(null));
    assert_eq!(rooms["items"], 10_000, "{rooms}");

    // Case-insensitive search across scripts: lower case finds the capitals.
    for (needle, shown) in [("émile", "Émile"), ("ωmega", "Ωmega"), ("łucja", "Łucja"), ("münchen", "München")]
    {
        let names = names_matching(&server, needle);
        assert!(!names.is_empty(), "nothing matches {needle}");
        assert!(names.iter().all(|name| name.contains(shown)), "{needle}: {names:?}");
    }
    assert!(!names_matching(&server, "東京").is_empty());

    assert_eq!(
        server.ok("GET", "/demo/simulator", json!(null)),
        json!({"rate": 0, "sent": 0, "follows_postgres": false})
    );
    for bad in [json!({"rate": 5001}), json!({"rate": -1}), json!({"rate": 2.5}), json!({"rate": "9"}), json!({})] {
        let (status, answer) = server.http("POST", "/demo/simulator", Some(&bad));
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{bad}: {answer}");
    }
    let (status, answer) = server.http_raw("POST", "/demo/simulator", Some(b"{"));
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&answer));
    let (status, _) = server.http("DELETE", "/demo/simulator", None);
    assert_eq!(status, 405);
    assert_eq!(server.ok("GET", "/demo/simulator", json!(null))["rate"], 0, "a refused rate changes nothing");
    assert_eq!(server.ok("POST", "/demo/simulator", json!({"rate": 5000})), json!({"rate": 5000}));
    assert_eq!(server.ok("POST", "/demo/simulator", json!({"rate": 0})), json!({"rate": 0}));
    server.stop();

    // A second start finds the rooms there and writes none.
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]).signed_in_as_demo_admin();
    assert_eq!(server.ok("GET", "/v1/collections/rooms", json!(null))["items"], 10_000);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_messages_reach_a_subscriber_as_diffs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]).signed_in_as_demo_admin();
    let mut client = server.connect().await;
    let sub = json!({"op": "subscribe", "sub": "top", "collection": "rooms",
        "sort": [{"field": "recency", "dir": "desc"}], "limit": 20, "payload": false});
    client.send(sub).await;
    assert!(client.read_until(SETTLE, |client| client.lists.get("top").is_some_and(|list| list.seq == 1)).await);
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;

    server.ok("POST", "/demo/simulator", json!({"rate": 200}));
    assert!(
        client.read_until(SETTLE, |client| client.lists["top"].seq >= 5).await,
        "no diff frames from the simulator"
    );
    server.ok("POST", "/demo/simulator", json!({"rate": 0}));
    // Wait for the simulator's last write, then for the frames it caused.
    let deadline = Instant::now() + SETTLE;
    let mut sent = server.ok("GET", "/demo/simulator", json!(null))["sent"].clone();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = server.ok("GET", "/demo/simulator", json!(null))["sent"].clone();
        if now == sent {
            break;
        }
        assert!(Instant::now() < deadline, "the simulator keeps writing at rate 0");
        sent = now;
    }
    assert!(sent.as_u64().unwrap() > 0);
    let expected: Vec<Value> = common::query_items(
        &server.ok(
            "POST",
            "/v1/collections/rooms/query",
            json!({"sort": [{"field": "recency", "dir": "desc"}], "limit": 20, "payload": false}),
        )["items"],
    );
    assert!(
        client.read_until(SETTLE, |client| client.lists["top"].items == expected).await,
        "the subscriber's list differs from the query"
    );
    // The newest message is stamped with the time it was written, in ms.
    let newest = expected[0]["fields"]["recency"].as_u64().unwrap();
    assert!(newest >= started_ms, "recency {newest} predates the test's start {started_ms}");
    assert!(expected[0]["fields"]["preview"].as_str().is_some_and(|text| text.contains(": ")));
    server.stop();
}

#[test]
fn demo_refuses_a_rooms_collection_of_another_shape_and_a_rate_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", json!({"fields": [{"name": "name", "type": "i64"}]}));
    server.stop();
    let output = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["serve", "--demo", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--demo needs collection `rooms`"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_ordo")).args(["serve", "--demo-rate", "5001"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--demo-rate is 0..=5000"));
}
