//! `ordo serve --demo` on loopback: the embedded page and its files, the rooms
//! written at start (non-ASCII names searchable without regard to case), the
//! simulator's rate endpoint at its limits, and the simulator's messages reaching
//! a subscriber as ordinary diffs.

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

#[test]
fn demo_users_sign_in_and_see_only_their_own_rooms() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--demo", "--demo-rate", "0"]);
    let mut totals = Vec::new();
    for user in ["alice", "bob"] {
        let answer = server.ok("POST", "/demo/token", json!({"user": user}));
        assert_eq!((answer["sub"].as_str(), answer["role"].as_str()), (Some(user), Some("reader")), "{answer}");
        let token = answer["token"].as_str().unwrap();
        let query = json!({"limit": 1000, "fields": ["owner"]});
        let (status, rooms) = server.http_as(Some(token), "POST", "/v1/collections/rooms/query", Some(&query));
        assert_eq!(status, 200, "{rooms}");
        let items = rooms["items"].as_array().unwrap();
        assert!(!items.is_empty() && items.iter().all(|item| item["fields"]["owner"] == user), "{user}: {rooms}");
        totals.push(rooms["total"].as_u64().unwrap());
    }
    assert_eq!(totals.iter().sum::<u64>(), 10_000, "the two users' rooms are all the rooms: {totals:?}");
    let (status, answer) = server.http("POST", "/demo/token", Some(&json!({"user": "mallory"})));
    assert_eq!(status, 400, "{answer}");
    // A demo user cannot change the simulator; without a token nobody can.
    let alice = server.ok("POST", "/demo/token", json!({"user": "alice"}))["token"].as_str().unwrap().to_owned();
    let (status, answer) = server.http_as(Some(&alice), "POST", "/demo/simulator", Some(&json!({"rate": 100})));
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    let (status, _) = server.http("POST", "/demo/simulator", Some(&json!({"rate": 100})));
    assert_eq!(status, 401);
    assert_eq!(server.ok("GET", "/demo/simulator", json!(null))["rate"], 0);
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

    assert_eq!(server.ok("GET", "/demo/simulator", json!(null)), json!({"rate": 0, "sent": 0}));
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
        "sort": [{"field": "recency", "dir": "desc"}], "limit": 20});
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
            json!({"sort": [{"field": "recency", "dir": "desc"}], "limit": 20}),
        )["items"],
    );
    assert!(
        client.read_until(SETTLE, |client| client.lists["top"].items == expected).await,
        "the subscriber's list differs from the query"
    );
    // The newest message is stamped with the time it was written, in ms.
    let newest = expected[0]["fields"]["recency"].as_u64().unwrap();
    assert!(newest >= started_ms, "recency {newest} predates the test's start {started_ms}");
    assert!(expected[0]["payload"]["last_message"].as_str().is_some_and(|text| text.contains(": ")));
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
