//! Request ids against a real server on loopback: a WebSocket message's `req`
//! comes back on the frame that answers it (the first diffs frame of a
//! subscribe, the diffs frame or `ack` of a set_range or set_view, `unsubscribed`,
//! `resumed`, `authed`, and every error, rate-limited ones included), and only
//! there; HTTP echoes a valid `X-Request-Id`. And subscription ids: an id is free
//! again as soon as `unsubscribe` is sent, because no frame of the old
//! subscription can follow its `unsubscribed`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{mint, room_schema, Client, LocalList, Rng, Server, StartOptions};
use ordo_server::limits::{MAX_HTTP_REQUEST_ID_BYTES, MAX_REQUEST_ID_BYTES};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

fn write(server: &Server, ops: Value) -> u64 {
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}))["seq"].as_u64().unwrap()
}

fn rooms(server: &Server, n: u64) {
    let ops: Vec<Value> =
        (0..n).map(|i| json!({"op": "upsert", "id": format!("r{i:02}"), "fields": {"recency": i}})).collect();
    write(server, Value::Array(ops));
}

fn subscribe(sub: &str, limit: u64) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "rooms", "sort": [{"field": "recency", "dir": "desc"}],
           "limit": limit})
}

/// Sends `message` and reads until a frame with `req` (or, for `req` `None`, any
/// non-diffs frame or diffs frame) answers it; returns that frame.
async fn answer(client: &mut Client, message: Value) -> Value {
    let n_frames = client.frames.len();
    let n_diffs = client.diffs_seen.len();
    client.send(message.clone()).await;
    let came =
        client.read_until(SETTLE, |client| client.frames.len() > n_frames || client.diffs_seen.len() > n_diffs).await;
    assert!(came, "no answer to {message}");
    let frame = client.frames[n_frames..].iter().chain(&client.diffs_seen[n_diffs..]).next().unwrap().clone();
    // Exactly one answer: nothing else arrives for a moment.
    let more = client
        .read_until(Duration::from_millis(200), |client| {
            client.frames.len() > n_frames + 1
                || client.diffs_seen.len() > n_diffs + 1
                || (client.frames.len() > n_frames && client.diffs_seen.len() > n_diffs)
        })
        .await;
    assert!(!more, "more than one answer to {message}: {:?} {:?}", client.frames, client.diffs_seen);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_echoes_the_request_id_and_only_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    rooms(&server, 4);
    let mut client = server.connect().await;

    let mut message = subscribe("list", 2);
    message["req"] = json!("q1");
    let frame = answer(&mut client, message).await;
    assert_eq!(
        (&frame["type"], &frame["sub"], &frame["seq"], &frame["req"]),
        (&json!("diffs"), &json!("list"), &json!(1), &json!("q1"))
    );

    // A change: its diffs frame answers it. No change: an `ack`, with or without `req`.
    let grow = json!({"op": "set_range", "sub": "list", "offset": 0, "limit": 3, "req": "q2"});
    let frame = answer(&mut client, grow).await;
    assert_eq!((&frame["type"], &frame["seq"], &frame["req"]), (&json!("diffs"), &json!(2), &json!("q2")), "{frame}");
    let same = json!({"op": "set_range", "sub": "list", "offset": 0, "limit": 3, "req": "q3"});
    assert_eq!(answer(&mut client, same).await, json!({"type": "ack", "req": "q3", "sub": "list"}));
    let same = json!({"op": "set_range", "sub": "list", "offset": 0, "limit": 3});
    assert_eq!(answer(&mut client, same).await, json!({"type": "ack", "sub": "list"}));
    let view = json!({"op": "set_view", "sub": "list", "sort": [{"field": "recency", "dir": "desc"}], "req": "q4"});
    assert_eq!(answer(&mut client, view).await, json!({"type": "ack", "req": "q4", "sub": "list"}));
    let view = json!({"op": "set_view", "sub": "list", "sort": [{"field": "recency"}], "req": "q5"});
    let frame = answer(&mut client, view).await;
    assert_eq!((&frame["type"], &frame["seq"], &frame["req"]), (&json!("diffs"), &json!(3), &json!("q5")), "{frame}");

    // A request placed by key is answered by a frame even when nothing changed
    // (it says where the window is): with no diffs, with `req`, and no `ack`.
    let tail = json!({"op": "set_range", "sub": "list", "tail": true, "limit": 3, "req": "t1"});
    let frame = answer(&mut client, tail).await;
    assert_eq!(
        (&frame["type"], &frame["offset"], &frame["req"]),
        (&json!("diffs"), &json!(1), &json!("t1")),
        "{frame}"
    );
    let tail = json!({"op": "set_range", "sub": "list", "tail": true, "limit": 3, "req": "t2"});
    let frame = answer(&mut client, tail).await;
    assert_eq!((&frame["diffs"], &frame["req"]), (&json!([]), &json!("t2")), "{frame}");

    // A write's frames answer no request.
    write(&server, json!([{"op": "upsert", "id": "r00", "fields": {"recency": 0}}, {"op": "remove", "id": "r01"}]));
    assert!(client.read_until(SETTLE, |client| client.diffs_seen.len() == 6).await);
    assert!(client.diffs_seen[5].get("req").is_none(), "{}", client.diffs_seen[5]);

    // Errors: from the connection, from the writer thread, for a message that does not parse.
    let errors = [
        (subscribe("list", 2), "subscription_exists", Some("list")),
        (
            json!({"op": "subscribe", "sub": "bad", "collection": "rooms", "sort": [{"field": "nope"}], "limit": 1}),
            "invalid_view",
            Some("bad"),
        ),
        (json!({"op": "set_range", "sub": "ghost", "limit": 1}), "unknown_subscription", Some("ghost")),
        (
            json!({"op": "set_view", "sub": "list", "filter": {"field": "recency", "op": "eq", "value": "x"}}),
            "invalid_view",
            Some("list"),
        ),
        (json!({"op": "unsubscribe", "sub": "ghost"}), "unknown_subscription", Some("ghost")),
        (json!({"op": "frobnicate", "sub": "list"}), "bad_request", None),
        (json!({"op": "resume", "session": "x", "subs": []}), "bad_request", None),
        (json!({"op": "auth", "token": "x"}), "bad_request", None),
    ];
    for (index, (mut message, code, sub)) in errors.into_iter().enumerate() {
        let req = format!("e{index}");
        message["req"] = json!(req);
        let frame = answer(&mut client, message.clone()).await;
        assert_eq!(
            (&frame["type"], &frame["code"], &frame["req"]),
            (&json!("error"), &json!(code), &json!(req)),
            "{message}: {frame}"
        );
        assert_eq!(frame.get("sub").and_then(Value::as_str), sub, "{message}: {frame}");
    }

    // `req` at its limit is echoed; past it, or empty, the message is refused and
    // nothing is echoed (it is not an id); the subscription is not made.
    let longest = "r".repeat(MAX_REQUEST_ID_BYTES);
    let mut message = subscribe("long", 1);
    message["req"] = json!(longest);
    assert_eq!(answer(&mut client, message).await["req"], json!(longest));
    for bad in ["r".repeat(MAX_REQUEST_ID_BYTES + 1), String::new()] {
        let mut message = subscribe("refused", 1);
        message["req"] = json!(bad);
        let frame = answer(&mut client, message).await;
        assert_eq!((&frame["type"], &frame["code"]), (&json!("error"), &json!("limit_exceeded")), "{frame}");
        assert!(frame.get("req").is_none() && frame.get("sub").is_none(), "{frame}");
    }
    assert!(!client.lists.contains_key("refused"));

    let frame = answer(&mut client, json!({"op": "unsubscribe", "sub": "list", "req": "bye"})).await;
    assert_eq!(frame, json!({"type": "unsubscribed", "sub": "list", "req": "bye"}));

    // A resume's answer; frames it replays answer nothing (their request was the
    // old connection's) and say the write they reflected when first sent.
    let session = client.session.clone();
    let held = client.lists["long"].clone();
    let long_first = client.diffs_seen.iter().find(|frame| frame["sub"] == "long").unwrap().clone();
    assert_eq!(held.seq, 1);
    drop(client);
    write(&server, json!([{"op": "upsert", "id": "r09", "fields": {"recency": 99}}]));
    let mut again = server.connect().await;
    again.lists.insert("long".into(), LocalList { seq: held.seq - 1, ..Default::default() });
    let mut entry = subscribe("long", 1);
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(held.seq - 1);
    again.send(json!({"op": "resume", "session": session, "subs": [entry], "req": "again"})).await;
    assert!(again.read_until(SETTLE, |client| client.diffs_seen.len() == 2).await, "{:?}", again.frames);
    let resumed = again.frames.iter().find(|frame| frame["type"] == "resumed").unwrap();
    // The frame of the write made while away follows live.
    assert_eq!((&resumed["req"], &resumed["subs"]), (&json!("again"), &json!([{"sub": "long", "replayed": 1}])));
    let mut replayed = long_first.clone();
    replayed.as_object_mut().unwrap().remove("req");
    assert_eq!(again.diffs_seen[0], replayed);
    assert!(again.diffs_seen.iter().all(|frame| frame.get("req").is_none()), "{:?}", again.diffs_seen);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authed_and_rate_limited_refusals_echo_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let secret = common::write_secret(dir.path());
    let server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    let token = mint(&secret, "u1", "reader", &[]);
    let mut client = server.connect_as(None).await;
    let frame = answer(&mut client, json!({"op": "unsubscribe", "sub": "x", "req": "early"})).await;
    assert_eq!((&frame["code"], &frame["req"]), (&json!("unauthorized"), &json!("early")), "{frame}");
    let frame = answer(&mut client, json!({"op": "auth", "token": "not a token", "req": "a0"})).await;
    assert_eq!((&frame["code"], &frame["req"]), (&json!("unauthorized"), &json!("a0")), "{frame}");
    let frame = answer(&mut client, json!({"op": "auth", "token": token, "req": "a1"})).await;
    assert_eq!(
        (&frame["type"], &frame["sub"], &frame["req"]),
        (&json!("authed"), &json!("u1"), &json!("a1")),
        "{frame}"
    );

    // Past the burst, each message is refused with its own `sub` and `req`.
    let admin = mint(&secret, "ops", "admin", &[]);
    let mut client = server.connect_as(Some(&admin)).await;
    for n in 0..300 {
        client.send(json!({"op": "unsubscribe", "sub": format!("s{n}"), "req": format!("m{n}")})).await;
    }
    assert!(client.read_until(SETTLE, |client| client.frames.len() > 300).await);
    let limited: Vec<&Value> = client.frames.iter().filter(|frame| frame["code"] == "rate_limited").collect();
    assert!(limited.len() >= 50, "{} rate-limited", limited.len());
    for frame in limited {
        let n = frame["sub"].as_str().unwrap().strip_prefix('s').unwrap();
        assert_eq!(frame["req"], json!(format!("m{n}")), "{frame}");
    }
    server.stop();
}

/// Sends one HTTP/1.1 request; returns the status and the response head (lowercase).
fn head_of(server: &Server, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let host = if headers.to_ascii_lowercase().contains("host:") { "" } else { "Host: localhost\r\n" };
    write!(stream, "{method} {path} HTTP/1.1\r\n{host}{headers}Content-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let head = response.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), head)
}

#[test]
fn http_echoes_a_valid_x_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions { capture_stderr: true, ..StartOptions::default() };
    let server = Server::start_with(dir.path(), &["--allow-origin", "https://app.example.org"], options);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let echoed = |status: u16, method: &str, path: &str, id: &str, extra: &str| {
        let (got, head) = head_of(&server, method, path, &format!("X-Request-Id: {id}\r\n{extra}"));
        assert_eq!(got, status, "{head}");
        head.lines().find_map(|line| line.strip_prefix("x-request-id: ").map(str::to_owned))
    };
    // Answers and errors alike.
    assert_eq!(echoed(200, "GET", "/v1/limits", "abc-123", "").as_deref(), Some("abc-123"));
    assert_eq!(echoed(404, "GET", "/v1/collections/nope", "n-1", "").as_deref(), Some("n-1"));
    assert_eq!(echoed(405, "PATCH", "/v1/collections/rooms", "m-1", "").as_deref(), Some("m-1"));
    // At the limit; past it, with a space inside, or with a control character: not echoed.
    let longest = "i".repeat(MAX_HTTP_REQUEST_ID_BYTES);
    assert_eq!(echoed(200, "GET", "/v1/limits", &longest, "").as_deref(), Some(longest.to_ascii_lowercase().as_str()));
    assert_eq!(echoed(200, "GET", "/v1/limits", &"i".repeat(MAX_HTTP_REQUEST_ID_BYTES + 1), ""), None);
    assert_eq!(echoed(200, "GET", "/v1/limits", "two words", ""), None);
    assert_eq!(echoed(200, "GET", "/v1/limits", "tab\there", ""), None);
    assert!(!head_of(&server, "GET", "/v1/limits", "").1.lines().any(|line| line.starts_with("x-request-id")));
    // A request refused for its Host is logged with its id.
    assert_eq!(echoed(421, "GET", "/v1/limits", "rebind-7", "Host: evil.example\r\n").as_deref(), Some("rebind-7"));
    server.wait_for_stderr_line(|line| line.contains("host_not_allowed") && line.contains("rebind-7"));
    // Browsers on an allowed origin may send it (preflight) and read it (exposed).
    let (status, head) = head_of(
        &server,
        "OPTIONS",
        "/v1/collections/rooms/query",
        "Origin: https://app.example.org\r\nAccess-Control-Request-Method: POST\r\n\
         Access-Control-Request-Headers: x-request-id\r\n",
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.lines().any(|line| line.starts_with("access-control-allow-headers:") && line.contains("x-request-id")),
        "{head}"
    );
    let (_, head) = head_of(&server, "GET", "/v1/limits", "Origin: https://app.example.org\r\nX-Request-Id: c1\r\n");
    assert!(
        head.lines().any(|line| line.starts_with("access-control-expose-headers:") && line.contains("x-request-id")),
        "{head}"
    );
    server.stop();
}

const N_ROUNDS: u64 = 40;

/// Each round subscribes anew with another window, so a frame of the old one would show.
fn window_limit(round: u64) -> u64 {
    5 + round % 3
}

/// Unsubscribes and subscribes again with the same id in one go, again and
/// again, while writes change the window: every frame before `unsubscribed`
/// continues the old subscription, every frame after it belongs to the new one
/// (a Reset with `seq` 1 first), and the list ends equal to a query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_id_is_free_as_soon_as_unsubscribe_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    rooms(&server, 20);
    let port = server.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = Rng::new(0x5eed_0200);
            let mut recency = 1_000;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                recency += 1;
                let body = json!({"ops": [{"op": "upsert", "id": format!("r{:02}", rng.below(20)), "fields": {"recency": recency}}]}).to_string();
                let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                write!(stream, "POST /v1/collections/rooms/batch HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            }
        })
    };
    let mut client = server.connect().await;
    client.send(subscribe("list", 5)).await;
    let mut n_old_frames = 0;
    let mut n_rounds = 0;
    for round in 0..N_ROUNDS {
        // Let the subscription get frames from the writes.
        assert!(client.read_until(SETTLE, |client| client.lists.get("list").is_some_and(|list| list.seq >= 3)).await);
        client.send(json!({"op": "unsubscribe", "sub": "list", "req": format!("u{round}")})).await;
        client.send(subscribe("list", window_limit(round))).await;
        // Frames of the old subscription until `unsubscribed`: `next_json` applies
        // each to the old list, checking that it is the next of the old sequence
        // (a Reset of the new one, seq 1, would fail there).
        loop {
            let frame = client.next_json(SETTLE).await.expect("a frame");
            match frame["type"].as_str().unwrap() {
                "unsubscribed" => {
                    assert_eq!(frame, json!({"type": "unsubscribed", "sub": "list", "req": format!("u{round}")}));
                    client.lists.remove("list");
                    break;
                }
                "diffs" => n_old_frames += 1,
                other => panic!("unexpected {other}: {frame}"),
            }
        }
        // From here on every frame is the new subscription's: `apply_frame` (in
        // `next_json`) checks that its first one has seq 1, and each next one the next seq.
        assert!(!client.lists.contains_key("list"));
        assert!(client.read_until(SETTLE, |client| client.lists.contains_key("list")).await);
        let first = client.diffs_seen.iter().rev().find(|frame| frame["seq"] == 1).unwrap();
        assert!(first["diffs"][0].get("Reset").is_some(), "{first}");
        n_rounds += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let expected = server.ok(
        "POST",
        "/v1/collections/rooms/query",
        json!({"sort": [{"field": "recency", "dir": "desc"}], "limit": window_limit(N_ROUNDS - 1)}),
    );
    let expected = common::query_items(&expected["items"]);
    assert!(client.read_until(SETTLE, |client| client.lists["list"].items == expected).await);
    assert_eq!(n_rounds, N_ROUNDS);
    // How often the race happened (frames in flight when `unsubscribe` was sent)
    // depends on timing; without this ordering such a frame came after
    // `unsubscribed` and failed the test above (tried by sending `unsubscribed` early).
    eprintln!("{n_old_frames} frames of old subscriptions came before their `unsubscribed`");
    server.stop();
}
