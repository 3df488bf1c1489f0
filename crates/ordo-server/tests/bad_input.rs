//! Every limit and every kind of malformed input gets its documented error (or
//! close code), changes nothing, and leaves other connections and the data alone.

mod common;

use std::time::Duration;

use common::{room_schema, Server};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error: {answer}"))
}

/// Sends only the head of a POST declaring `length` bytes of body, and answers
/// the status and head of the response (within 5 s: the body never comes).
fn declared_length_post(port: u16, path: &str, length: usize) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&buffer[..n]),
        }
    }
    let head = String::from_utf8_lossy(&response).into_owned();
    let status = head.split(' ').nth(1).and_then(|status| status.parse().ok()).unwrap_or(0);
    (status, head)
}

/// POSTs `mebibytes` MiB of spaces with `Transfer-Encoding: chunked`, a MiB a
/// chunk, and answers the status and body (de-chunked) the server sent.
fn chunked_post(port: u16, path: &str, mebibytes: usize) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 1024 * 1024];
    for _ in 0..mebibytes {
        // The server may answer before it has read everything: stop sending then.
        let sent = stream.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).and_then(|()| {
            stream.write_all(&chunk)?;
            stream.write_all(b"\r\n")
        });
        if sent.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = response[head_end + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let size_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&body[..size_end]).unwrap(), 16).unwrap();
        body = body[size_end + 2..size_end + 2 + size].to_vec();
    }
    (status, body)
}

#[test]
fn http_refuses_bad_input_with_its_documented_code_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ok = server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": 1}}]}),
    );
    assert_eq!(ok["seq"], 1);

    let cases: Vec<(&str, &str, Option<Value>, u16, &str)> = vec![
        (
            "PUT",
            "/v1/collections/ROOMS",
            Some(json!({"fields": [{"name": "x", "type": "u64"}]})),
            409,
            "collection_exists",
        ),
        (
            "PUT",
            "/v1/collections/other",
            Some(json!({"fields": [{"name": "x", "type": "u32"}]})),
            400,
            "invalid_schema",
        ),
        (
            "PUT",
            "/v1/collections/other",
            Some(json!({"fields": [{"name": "x", "type": "u64"}, {"name": "x", "type": "u64"}]})),
            400,
            "invalid_schema",
        ),
        ("PUT", "/v1/collections/other", Some(json!({"fieldz": []})), 400, "bad_request"),
        ("POST", "/v1/collections/nope/batch", Some(json!({"ops": []})), 404, "unknown_collection"),
        ("POST", "/v1/collections/rooms/batch", Some(json!({"ops": [{"op": "frob", "id": "!a"}]})), 400, "bad_request"),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": "soon"}}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": -1}}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"nope": 1}}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": [1]}}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": 1.5}}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!a", "fields": 5}]})),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "x".repeat(256)}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": ""}]})),
            422,
            "invalid_batch",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "remove", "id": "!a", "fields": {}}]})),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/collections/rooms/batch",
            Some(json!({"ops": [{"op": "upsert", "id": "!b"}], "extra": 1})),
            400,
            "bad_request",
        ),
        ("POST", "/v1/collections/rooms/query", Some(json!({"limit": 1001})), 400, "limit_exceeded"),
        (
            "POST",
            "/v1/collections/rooms/query",
            Some(json!({"limit": 5, "sort": [{"field": "nope"}]})),
            400,
            "invalid_view",
        ),
        (
            "POST",
            "/v1/collections/rooms/query",
            Some(json!({"limit": 5, "filter": {"field": "recency", "op": "eq", "value": "x"}})),
            400,
            "invalid_view",
        ),
        (
            "POST",
            "/v1/collections/rooms/query",
            Some(json!({"limit": 5, "filter": {"field": "name", "contains": "n".repeat(257)}})),
            400,
            "limit_exceeded",
        ),
        (
            "POST",
            "/v1/collections/rooms/query",
            Some(json!({"limit": 5, "filter": {"field": "name", "op": "between", "value": 1}})),
            400,
            "invalid_view",
        ),
        ("POST", "/v1/collections/rooms/query", Some(json!({"limit": 5, "fields": ["nope"]})), 400, "invalid_view"),
        ("GET", "/v1/collections/rooms/items/%21zzz", None, 404, "not_found"),
        ("GET", "/v1/nothing-here", None, 404, "not_found"),
        ("PATCH", "/v1/collections/rooms", None, 405, "bad_request"),
    ];
    for (method, path, body, status, expected) in cases {
        let (got_status, answer) = server.http(method, path, body.as_ref());
        assert_eq!((got_status, code(&answer)), (status, expected), "{method} {path} {body:?}: {answer}");
        assert!(!answer["error"]["message"].as_str().unwrap().is_empty());
    }
    // A filter nested past the limit.
    let mut deep = json!({"field": "dm", "op": "eq", "value": true});
    for _ in 0..20 {
        deep = json!({"not": deep});
    }
    let (status, answer) =
        server.http("POST", "/v1/collections/rooms/query", Some(&json!({"limit": 5, "filter": deep})));
    assert_eq!((status, code(&answer)), (400, "limit_exceeded"), "{answer}");
    // Not JSON at all, and a body past 16 MiB.
    let (status, body) = server.http_raw("POST", "/v1/collections/rooms/batch", Some(b"{\"ops\": [tru"));
    assert_eq!(status, 400);
    assert_eq!(code(&serde_json::from_slice(&body).unwrap()), "bad_json");
    let huge = vec![b' '; 16 * 1024 * 1024 + 1];
    let (status, body) = server.http_raw("POST", "/v1/collections/rooms/batch", Some(&huge));
    assert_eq!(status, 413);
    assert_eq!(code(&serde_json::from_slice(&body).unwrap()), "limit_exceeded");
    // A body that says it is past 16 MiB is refused before it is sent: the answer
    // comes though not a byte of it was, and the connection is then closed.
    let (status, head) = declared_length_post(server.port, "/v1/collections/rooms/batch", 17 * 1024 * 1024);
    assert_eq!(status, 413, "{head}");
    assert!(head.to_ascii_lowercase().contains("connection: close"), "{head}");
    // The same past 16 MiB sent in chunks (no Content-Length to refuse up front).
    let (status, body) = chunked_post(server.port, "/v1/collections/rooms/batch", 17);
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert_eq!(code(&serde_json::from_slice(&body).unwrap()), "limit_exceeded");
    // Too many ops in one request.
    let ops: Vec<Value> = (0..10_001).map(|n| json!({"op": "remove", "id": format!("!{n}")})).collect();
    let (status, answer) = server.http("POST", "/v1/collections/rooms/batch", Some(&json!({"ops": ops})));
    assert_eq!((status, code(&answer)), (400, "limit_exceeded"));
    // A multi-collection write with one bad part: the good part is written.
    let (status, answer) = server.http(
        "POST",
        "/v1/batch",
        Some(&json!({"writes": [
            {"collection": "rooms", "ops": [{"op": "upsert", "id": "!c", "fields": {"recency": 3}}]},
            {"collection": "rooms", "ops": [{"op": "upsert", "id": "!d", "fields": {"score": "high"}}]},
        ]})),
    );
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["results"][0]["seq"], 2, "{answer}");
    assert_eq!(answer["results"][1]["error"]["code"], "invalid_batch", "{answer}");

    // Nothing refused left a trace: only the two good batches were written.
    let health = server.ok("GET", "/v1/health", Value::Null);
    assert_eq!((health["last_seq"].as_u64(), health["items"].as_u64()), (Some(2), Some(2)), "{health}");
    let all = server.ok("POST", "/v1/collections/rooms/query", json!({"limit": 10}));
    let ids: Vec<&str> = all["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["!a", "!c"]);
    assert!(server.metric("ordo_errors_total{code=\"invalid_batch\"}") >= 6.0);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_refuses_bad_messages_with_error_frames_and_keeps_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--ws-messages-per-second", "1000"]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": 1}}]}),
    );
    let mut bystander = server.connect().await;
    let watched = json!({"op": "subscribe", "sub": "w", "collection": "rooms", "limit": 5});
    bystander.send(watched).await;

    let mut client = server.connect().await;
    let good = |sub: &str| json!({"op": "subscribe", "sub": sub, "collection": "rooms", "limit": 5});
    let cases: Vec<(Message, &str)> = vec![
        (Message::text("{\"op\": \"subscribe\", "), "bad_json"),
        (Message::text("[1, 2]"), "bad_request"),
        (Message::text(json!({"op": "frobnicate"}).to_string()), "bad_request"),
        // One meaning per message: a key given twice (in a filter, at any depth), or an
        // integer wider than 64 bits, is refused whichever copy a reader would keep.
        (
            Message::text(
                r#"{"op":"subscribe","sub":"a","collection":"rooms","limit":5,"filter":{"not":{"field":"recency","op":"eq","value":1,"value":2}}}"#,
            ),
            "bad_json",
        ),
        (Message::text(r#"{"op":"subscribe","sub":"a","sub":"b","collection":"rooms","limit":5}"#), "bad_json"),
        (
            Message::text(
                r#"{"op":"subscribe","sub":"a","collection":"rooms","limit":5,"filter":{"field":"recency","op":"eq","value":18446744073709551616}}"#,
            ),
            "bad_json",
        ),
        (
            Message::text(json!({"op": "subscribe", "sub": "a", "collection": "rooms", "limit": "ten"}).to_string()),
            "bad_request",
        ),
        (
            Message::text(
                json!({"op": "subscribe", "sub": "a", "collection": "rooms", "limit": 5, "colour": 1}).to_string(),
            ),
            "bad_request",
        ),
        (
            Message::text(json!({"op": "subscribe", "sub": "a", "collection": "nope", "limit": 5}).to_string()),
            "unknown_collection",
        ),
        (
            Message::text(json!({"op": "subscribe", "sub": "a", "collection": "rooms", "limit": 1001}).to_string()),
            "limit_exceeded",
        ),
        (
            Message::text(
                json!({"op": "subscribe", "sub": "s".repeat(65), "collection": "rooms", "limit": 5}).to_string(),
            ),
            "limit_exceeded",
        ),
        (
            Message::text(
                json!({"op": "subscribe", "sub": "a", "collection": "rooms", "limit": 5, "sort": [{"field": "nope"}]})
                    .to_string(),
            ),
            "invalid_view",
        ),
        (Message::text(json!({"op": "set_range", "sub": "ghost", "limit": 5}).to_string()), "unknown_subscription"),
        (Message::text(json!({"op": "unsubscribe", "sub": "ghost"}).to_string()), "unknown_subscription"),
        (Message::text(json!({"op": "resume", "session": "x", "subs": []}).to_string()), "bad_request"),
        (Message::binary(vec![1u8, 2, 3]), "bad_request"),
    ];
    for (message, expected) in cases {
        let shown = format!("{message:?}");
        client.send_raw(message).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], expected, "{shown}: {error}");
        assert!(!error["message"].as_str().unwrap().is_empty());
    }
    // The connection still works, and ids are unique per connection.
    client.send(good("a")).await;
    assert!(client.read_until(Duration::from_secs(5), |c| c.lists.contains_key("a")).await);
    client.send(good("a")).await;
    assert_eq!(client.expect_error().await["code"], "subscription_exists");
    for n in 1..128 {
        client.send(good(&format!("more{n}"))).await;
    }
    assert!(client.read_until(Duration::from_secs(10), |c| c.lists.len() == 128).await, "128 subscriptions");
    client.send(good("one-too-many")).await;
    assert_eq!(client.expect_error().await["code"], "limit_exceeded");
    let window = json!({"op": "set_range", "sub": "a", "offset": 0, "limit": 5000});
    client.send(window).await;
    assert_eq!(client.expect_error().await["code"], "limit_exceeded");

    // The bystander saw none of it and still gets its updates.
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "!b", "fields": {"recency": 2}}]}),
    );
    assert!(
        bystander.read_until(Duration::from_secs(5), |c| c.lists.get("w").is_some_and(|l| l.items.len() == 2)).await
    );
    assert!(bystander.frames.iter().all(|frame| frame["type"] == "welcome"), "{:?}", bystander.frames);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_limits_rate_and_closes_on_a_huge_frame() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    // 300 messages at once: the burst of 200 passes, the rest are refused.
    let mut client = server.connect().await;
    for _ in 0..300 {
        client.send(json!({"op": "unsubscribe", "sub": "ghost"})).await;
    }
    let done = client.read_until(Duration::from_secs(10), |c| c.frames.len() >= 300).await;
    assert!(done, "every message gets an answer");
    let n_limited = client.frames.iter().filter(|frame| frame["code"] == "rate_limited").count();
    assert!((50..=110).contains(&n_limited), "{n_limited} rate-limited");
    // A refused message's error names its subscription, so a client can tell which request failed.
    assert!(
        client.frames.iter().filter(|frame| frame["code"] == "rate_limited").all(|frame| frame["sub"] == "ghost"),
        "{:?}",
        client.frames.iter().find(|frame| frame["code"] == "rate_limited")
    );
    // `"sort": null` is no sort, as `"filter": null` is no filter.
    let answer = server.ok("POST", "/v1/collections/rooms/query", json!({"filter": null, "sort": null, "limit": 1}));
    assert_eq!(answer["total"], 0, "{answer}");

    // A frame over 64 KiB closes the connection with 1009; others are untouched.
    let mut other = server.connect().await;
    let mut big = server.connect().await;
    big.send_raw(Message::text("x".repeat(64 * 1024 + 1))).await;
    let close = big.next_json(Duration::from_secs(5)).await.expect("a close frame");
    assert_eq!(close, json!({"type": "close", "code": 1009}));
    // Exactly 64 KiB is allowed (and, not being JSON, refused as such).
    let mut edge = server.connect().await;
    edge.send_raw(Message::text(format!("\"{}\"", "x".repeat(64 * 1024 - 2)))).await;
    assert_eq!(edge.expect_error().await["code"], "bad_request");
    other.send(json!({"op": "subscribe", "sub": "a", "collection": "rooms", "limit": 5})).await;
    assert!(other.read_until(Duration::from_secs(5), |c| c.lists.contains_key("a")).await);
    server.stop();
}

/// The number of the server's threads named `ordo-network`, from `/proc`, once
/// it is `expected` or after 5 s (a new thread takes its name when it first runs).
fn n_network_threads(pid: u32, expected: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter(|task| {
                let comm = std::fs::read_to_string(task.as_ref().unwrap().path().join("comm")).unwrap_or_default();
                comm.trim_end() == "ordo-network"
            })
            .count();
        if n == expected || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn network_threads_follow_the_flag_within_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--network-threads", "3"]);
    assert_eq!(n_network_threads(server.pid(), 3), 3);
    server.stop();
    let server = Server::start(dir.path(), &[]);
    let default = ordo_server::server::default_network_threads();
    assert_eq!(n_network_threads(server.pid(), default), default);
    server.stop();
    for refused in ["0", "65"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(["serve", "--listen", "127.0.0.1:0", "--network-threads", refused])
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--network-threads is 1..=64"), "{stderr}");
    }
}

/// Numbers convert to a field's type only when that is exact, in writes and in
/// filter literals alike (docs/PROTOCOL.md, "Field types").
#[test]
fn numbers_convert_only_when_exact_in_writes_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok(
        "PUT",
        "/v1/collections/n",
        json!({"fields": [
            {"name": "i", "type": "i64"}, {"name": "u", "type": "u64"}, {"name": "f", "type": "f64"},
        ]}),
    );
    // Raw bodies: the numbers are written exactly as a client would send them.
    let write = |fields: &str| {
        let body = format!(r#"{{"ops":[{{"op":"upsert","id":"x","fields":{fields}}}]}}"#);
        let (status, answer) = server.http_raw("POST", "/v1/collections/n/batch", Some(body.as_bytes()));
        (status, String::from_utf8(answer).unwrap())
    };
    for fields in [
        r#"{"f":9007199254740992}"#,
        r#"{"f":-9007199254740992}"#,
        r#"{"f":9223372036854775808}"#,
        r#"{"f":-9223372036854775808}"#,
        r#"{"i":1.0}"#,
        r#"{"u":1.0}"#,
        r#"{"i":-0.0}"#,
        r#"{"u":-0.0}"#,
        r#"{"i":-9223372036854775808}"#,
        r#"{"i":-9.223372036854775808e18}"#,
        r#"{"u":1.8446744073709550e19}"#,
        r#"{"f":1e308}"#,
        r#"{"i":1e3}"#,
    ] {
        let (status, answer) = write(fields);
        assert_eq!(status, 200, "{fields}: {answer}");
    }
    for (fields, found) in [
        (r#"{"f":9007199254740993}"#, "the number 9007199254740993"),
        (r#"{"f":-9007199254740993}"#, "the number -9007199254740993"),
        (r#"{"f":18446744073709551615}"#, "the number 18446744073709551615"),
        (r#"{"f":9223372036854775807}"#, "the number 9223372036854775807"),
        (r#"{"i":1.5}"#, "the number 1.5"),
        (r#"{"u":-1.0}"#, "the number -1.0"),
        (r#"{"i":9.223372036854775808e18}"#, "the number 9.223372036854776e+18"),
        (r#"{"u":1.8446744073709552e19}"#, "the number 1.8446744073709552e+19"),
        (r#"{"i":1e308}"#, "the number 1e+308"),
    ] {
        let (status, answer) = write(fields);
        assert_eq!(status, 422, "{fields}: {answer}");
        assert!(answer.contains("invalid_batch") && answer.contains(found), "{fields}: {answer}");
    }
    // Past f64's range the JSON itself is refused, with the reason.
    let (status, answer) = write(r#"{"f":1e400}"#);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("bad_json") && answer.contains("op 0: `fields`: number out of range"), "{answer}");

    // An integer wider than 64 bits cannot be read exactly: refused as such, never
    // rounded to the f64 next to it (which `i`, `u` or `f` might then accept).
    let wide = |(status, answer): (u16, String)| {
        status == 400 && answer.contains("bad_json") && answer.contains("outside -2^63..2^64-1")
    };
    for fields in [
        r#"{"i":-9223372036854775809}"#,
        r#"{"f":18446744073709551617}"#,
        r#"{"f":18446744073709551616}"#,
        r#"{"u":18446744073709551616}"#,
        r#"{"f":-100000000000000000000000000000}"#,
    ] {
        let answer = write(fields);
        assert!(wide(answer.clone()), "{fields}: {answer:?}");
    }
    let op = |rest: &str| {
        let body = format!(r#"{{"ops":[{{"op":"upsert","id":"x",{rest}}}]}}"#);
        let (status, answer) = server.http_raw("POST", "/v1/collections/n/batch", Some(body.as_bytes()));
        (status, String::from_utf8(answer).unwrap())
    };
    for rest in [
        r#""increment":{"i":-9223372036854775809}"#,
        r#""decrement":{"u":18446744073709551616}"#,
        r#""set_max":{"f":18446744073709551617}"#,
        r#""set_min":{"i":-9223372036854775809}"#,
        r#""if":{"version":18446744073709551616}"#,
    ] {
        let answer = op(rest);
        assert!(wide(answer.clone()), "{rest}: {answer:?}");
    }
    // Wide integers in a payload are kept as written: the server never reads them.
    let (status, answer) = op(r#""payload":{"big":18446744073709551617}"#);
    assert_eq!(status, 200, "{answer}");

    // The stored values are the exact numbers.
    write(r#"{"i":7.0,"u":8.0,"f":9007199254740992}"#);
    let answer = server.ok("POST", "/v1/collections/n/query", json!({"limit": 10}));
    let fields = &answer["items"][0]["fields"];
    assert!(fields["i"].is_i64() && fields["i"] == 7, "{answer}");
    assert!(fields["u"].is_u64() && fields["u"] == 8, "{answer}");
    assert_eq!(fields["f"].as_f64(), Some(9_007_199_254_740_992.0), "{answer}");

    // Filter literals follow the same rule.
    let query = |filter: &str| {
        let body = format!(r#"{{"filter":{filter},"limit":10}}"#);
        let (status, answer) = server.http_raw("POST", "/v1/collections/n/query", Some(body.as_bytes()));
        (status, String::from_utf8(answer).unwrap())
    };
    for filter in [
        r#"{"field":"i","op":"eq","value":7.0}"#,
        r#"{"field":"u","op":"eq","value":8.0}"#,
        r#"{"field":"f","op":"eq","value":9007199254740992}"#,
        r#"{"field":"u","in":[8.0, 9]}"#,
    ] {
        let (status, answer) = query(filter);
        assert_eq!(status, 200, "{filter}: {answer}");
        assert!(answer.contains(r#""id":"x""#), "{filter} finds the item: {answer}");
    }
    let (status, answer) = query(r#"{"field":"f","op":"eq","value":-1e400}"#);
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("bad_json") && answer.contains("number out of range") && answer.contains("f64"),
        "{answer}"
    );
    for body in [
        r#"{"filter":{"field":"i","op":"eq","value":-9223372036854775809},"limit":10}"#,
        r#"{"filter":{"field":"f","in":[1,18446744073709551617]},"limit":10}"#,
        r#"{"filter":{"not":{"any":[{"field":"u","op":"gt","value":18446744073709551616}]}},"limit":10}"#,
        r#"{"offset":18446744073709551616,"limit":10}"#,
        r#"{"limit":18446744073709551617}"#,
        r#"{"min_seq":18446744073709551616,"limit":10}"#,
    ] {
        let (status, answer) = server.http_raw("POST", "/v1/collections/n/query", Some(body.as_bytes()));
        let answer = String::from_utf8(answer).unwrap();
        assert!(wide((status, answer.clone())), "{body}: {answer}");
    }
    let rules = r#"{"rules":[{"collection":"n","roles":["reader"],
        "read":{"filter":{"field":"u","op":"eq","value":18446744073709551616}}}]}"#;
    let (status, answer) = server.http_raw("PUT", "/v1/rules", Some(rules.as_bytes()));
    let answer = String::from_utf8(answer).unwrap();
    assert!(wide((status, answer.clone())), "{answer}");
    for filter in [
        r#"{"field":"f","op":"eq","value":9007199254740993}"#,
        r#"{"field":"i","op":"eq","value":7.5}"#,
        r#"{"field":"u","op":"lt","value":-1.0}"#,
        r#"{"field":"i","op":"eq","value":9.3e18}"#,
    ] {
        let (status, answer) = query(filter);
        assert_eq!(status, 400, "{filter}: {answer}");
        assert!(answer.contains("invalid_view"), "{filter}: {answer}");
    }
    server.stop();
}
