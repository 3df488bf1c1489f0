//! Attacks seen on the server, one test each: idle sockets exhausting
//! descriptors, WebSocket frames RFC 6455 forbids, deep payloads, resume past
//! the subscription limit, and parked sessions holding unbounded memory.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, StartOptions};
use serde_json::{json, Value};

/// A GET that gives up after `timeout` (the common helper waits forever, and a
/// server that never accepts is what some of these tests look for). `None`: no
/// answer (not accepted, closed unanswered, or too slow).
fn get_status(port: u16, path: &str, timeout: Duration) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let head = std::str::from_utf8(response.get(..12)?).ok()?;
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Reads until the server closes the socket; false if it is still open at `deadline`.
fn closed_by(stream: &mut TcpStream, deadline: Instant) -> bool {
    let mut buffer = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            // A reset is a close too.
            Err(_) => return true,
        }
    }
}

/// Regression: ~20 000 sockets that never sent a byte exhausted the server's
/// descriptors (`accept failed: Too many open files` logged hundreds of times a
/// second, `/v1/health` unreachable), and half-sent requests were held forever.
#[test]
fn idle_sockets_past_the_descriptor_limit_leave_the_server_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions { nofile: Some(256), capture_stderr: true, ..StartOptions::default() };
    let server = Server::start_with(dir.path(), &["--header-timeout", "2"], options);
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_connections = limits["max_connections"].as_u64().expect("max_connections in /v1/limits");
    assert!(max_connections < 256, "the cap stays below the descriptor limit: {limits}");

    // More sockets than the server has descriptors: idle ones, and requests cut off mid-head.
    let mut idle: Vec<TcpStream> =
        (0..400).map(|_| TcpStream::connect(("127.0.0.1", server.port)).expect("connect")).collect();
    let mut half_sent: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            stream.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n").unwrap();
            stream
        })
        .collect();

    // While they are held, health answers: 200, or 503 when the cap is reached.
    // (An attempt may be closed unanswered while too many refusals are in flight.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = get_status(server.port, "/v1/health", Duration::from_secs(2)) {
            break status;
        }
        assert!(Instant::now() < deadline, "/v1/health did not answer while idle sockets were open");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status == 200 || status == 503, "health answered {status}");

    // Every idle and half-sent socket is closed: after the 2 s header timeout at
    // the latest (the deadline is generous for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(20);
    for (index, stream) in idle.iter_mut().enumerate() {
        assert!(closed_by(stream, deadline), "idle socket {index} still open after the header timeout");
    }
    for (index, stream) in half_sent.iter_mut().enumerate() {
        assert!(closed_by(stream, deadline), "half-sent request {index} still open after the header timeout");
    }
    drop(idle);
    drop(half_sent);

    // With the idle ones gone, health answers 200 again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_status(server.port, "/v1/health", Duration::from_secs(2)) != Some(200) {
        assert!(Instant::now() < deadline, "/v1/health did not answer 200 once the idle sockets were closed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Past their share of the cap the silent sockets were closed (the oldest
    // first), or refused at the cap if they came faster than they could be closed.
    let turned_away =
        server.metric("ordo_connections_refused_total") + server.metric("ordo_silent_sockets_closed_total");
    assert!(turned_away > 0.0);

    // And the log was not flooded: no failing accept at all, since the cap keeps
    // descriptors free (a handful of lines would still be fine).
    let lines = server.stderr_lines();
    let n_accept_lines = lines.iter().filter(|line| line.contains("accept")).count();
    assert!(n_accept_lines <= 5 && lines.len() <= 20, "the server's log: {lines:#?}");
}

/// A WebSocket client written by hand, to send frames no library would.
struct RawWs {
    stream: TcpStream,
}

impl RawWs {
    /// Connects, upgrades, and reads the `welcome` frame.
    fn connect(port: u16) -> RawWs {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
            .write_all(
                b"GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            )
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).expect("the upgrade answer");
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        let mut ws = RawWs { stream };
        let (opcode, welcome) = ws.read_frame().expect("welcome");
        assert_eq!(opcode, 1);
        let welcome: Value = serde_json::from_slice(&welcome).expect("JSON");
        assert_eq!(welcome["type"], "welcome", "{welcome}");
        ws
    }

    /// The next server frame (opcode, payload); `None` when the stream ends or stalls.
    fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 2];
        self.stream.read_exact(&mut head).ok()?;
        assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
        let length = match head[1] & 0x7F {
            126 => {
                let mut bytes = [0u8; 2];
                self.stream.read_exact(&mut bytes).ok()?;
                u16::from_be_bytes(bytes) as usize
            }
            127 => {
                let mut bytes = [0u8; 8];
                self.stream.read_exact(&mut bytes).ok()?;
                u64::from_be_bytes(bytes) as usize
            }
            length => length as usize,
        };
        let mut payload = vec![0u8; length];
        self.stream.read_exact(&mut payload).ok()?;
        Some((head[0] & 0x0F, payload))
    }

    /// Reads frames until a close frame; returns its code (`None`: the stream
    /// ended without one). Text frames before it are returned too.
    fn read_until_close(&mut self) -> (Option<u16>, Vec<Value>) {
        let mut texts = Vec::new();
        while let Some((opcode, payload)) = self.read_frame() {
            match opcode {
                1 => texts.push(serde_json::from_slice(&payload).expect("JSON")),
                8 => return (payload.get(..2).map(|code| u16::from_be_bytes([code[0], code[1]])), texts),
                _ => {}
            }
        }
        (None, texts)
    }
}

/// A client frame: `first_byte` is FIN, RSV and opcode; masked with `mask` when given.
fn client_frame(first_byte: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![first_byte, payload.len() as u8 | if mask.is_some() { 0x80 } else { 0 }];
    match mask {
        Some(mask) => {
            frame.extend_from_slice(&mask);
            frame.extend(payload.iter().enumerate().map(|(index, byte)| byte ^ mask[index % 4]));
        }
        None => frame.extend_from_slice(payload),
    }
    frame
}

const MASK: Option<[u8; 4]> = Some([0x37, 0xfa, 0x21, 0x3d]);

/// Regression: an unmasked client frame was accepted (RFC 6455 §5.1: the server
/// must close the connection, with 1002).
#[test]
fn an_unmasked_client_frame_closes_with_1002() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let mut ws = RawWs::connect(server.port);
    // A masked message, then an unmasked one in the same write: the first is
    // answered (it is valid), the second closes the connection.
    let mut bytes = client_frame(0x81, br#"{"op":"unsubscribe","sub":"a"}"#, MASK);
    bytes.extend(client_frame(0x81, br#"{"op":"unsubscribe","sub":"b"}"#, None));
    ws.stream.write_all(&bytes).unwrap();
    let (code, texts) = ws.read_until_close();
    assert_eq!(code, Some(1002), "frames before the close: {texts:?}");
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert_eq!(texts[0]["code"], "unknown_subscription");
    assert_eq!(texts[0]["sub"], "a");
}

/// Regression: a frame with a reserved bit set was dropped without a close code.
#[test]
fn reserved_bits_and_stray_continuations_close_with_1002() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    for first_byte in [
        0xC1, /* RSV1 */
        0xA1, /* RSV2 */
        0x91, /* RSV3 */
        0x80, /* a continuation outside a message */
    ] {
        let mut ws = RawWs::connect(server.port);
        ws.stream.write_all(&client_frame(first_byte, br#"{"op":"unsubscribe","sub":"a"}"#, MASK)).unwrap();
        let (code, texts) = ws.read_until_close();
        assert_eq!(code, Some(1002), "first byte {first_byte:#04x}; frames before the close: {texts:?}");
        assert!(texts.is_empty(), "{texts:?}");
    }
}

/// `depth` arrays, one inside the other.
fn nested_arrays(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

/// A batch body with one upsert whose payload is `payload` (raw JSON text).
fn upsert_with_payload(id: &str, payload: &str) -> String {
    format!(r#"{{"op":"upsert","id":"{id}","fields":{{"name":"x"}},"payload":{payload}}}"#)
}

/// Regression: a payload nested 100 000 arrays deep was accepted, stored and
/// sent verbatim to every subscriber (whose JSON parser may overflow its stack).
#[test]
fn deeply_nested_payloads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", common::room_schema());
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_depth = limits["max_payload_depth"].as_u64().expect("max_payload_depth in /v1/limits") as usize;

    // One collection's batch: the deep op is named, and nothing is written.
    for depth in [max_depth + 1, 100_000] {
        let body = format!(
            r#"{{"ops":[{},{}]}}"#,
            upsert_with_payload("ok", "1"),
            upsert_with_payload("deep", &nested_arrays(depth))
        );
        let (status, answer) = server.http_raw("POST", "/v1/collections/rooms/batch", Some(body.as_bytes()));
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(status, 422, "depth {depth}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_batch", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("op 1") && message.contains(&max_depth.to_string()), "{message}");
    }
    let (status, _) = server.http("GET", "/v1/collections/rooms/items/ok", None);
    assert_eq!(status, 404, "a refused batch writes nothing");

    // At the limit (objects count too, and brackets inside strings do not).
    let at_limit = "[".repeat(max_depth - 1) + r#"{"s":"[[[[\"[["}"# + &"]".repeat(max_depth - 1);
    let body = format!(r#"{{"ops":[{}]}}"#, upsert_with_payload("edge", &at_limit));
    let (status, answer) = server.http_raw("POST", "/v1/collections/rooms/batch", Some(body.as_bytes()));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let item = server.ok("GET", "/v1/collections/rooms/items/edge", json!(null));
    assert_eq!(item["payload"], serde_json::from_str::<Value>(&at_limit).unwrap());

    // `POST /v1/batch`: the deep part is refused alone, the other is written.
    let body = format!(
        r#"{{"writes":[{{"collection":"rooms","ops":[{}]}},{{"collection":"rooms","ops":[{}]}}]}}"#,
        upsert_with_payload("part0", &nested_arrays(100_000)),
        upsert_with_payload("part1", &nested_arrays(max_depth)),
    );
    let (status, answer) = server.http_raw("POST", "/v1/batch", Some(body.as_bytes()));
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["results"][0]["error"]["code"], "invalid_batch", "{answer}");
    assert!(answer["results"][0]["error"]["message"].as_str().unwrap().contains("write 0"), "{answer}");
    assert!(answer["results"][1]["seq"].is_u64(), "{answer}");
    let (status, _) = server.http("GET", "/v1/collections/rooms/items/part0", None);
    assert_eq!(status, 404);
    server.ok("GET", "/v1/collections/rooms/items/part1", json!(null));
}

/// Regression: one `resume` listing 1 000 subscriptions was accepted whole,
/// past the per-connection limit that `subscribe` enforces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_obeys_the_subscription_limit_and_refuses_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", common::room_schema());
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "a", "fields": {"recency": 1}}]}),
    );
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_subs = limits["max_subscriptions_per_connection"].as_u64().unwrap() as usize;

    // `s0` twice, then more ids than the limit allows.
    let entry = |sub: String| json!({"sub": sub, "collection": "rooms", "limit": 1, "last_seq": 0});
    let mut entries = vec![entry("s0".to_owned()), entry("s0".to_owned())];
    entries.extend((1..max_subs + 20).map(|index| entry(format!("s{index}"))));
    let n_entries = entries.len();
    let mut client = server.connect().await;
    client.send(json!({"op": "resume", "session": "0000000000000000", "subs": entries})).await;
    let is_resumed = |frame: &Value| frame["type"] == "resumed";
    assert!(client.read_until(Duration::from_secs(10), |client| client.frames.iter().any(is_resumed)).await);
    let resumed = client.frames.iter().find(|frame| is_resumed(frame)).unwrap().clone();
    let outcomes = resumed["subs"].as_array().unwrap();
    assert_eq!(outcomes.len(), n_entries);
    assert_eq!(outcomes[0]["reset"], true, "{}", outcomes[0]);
    assert_eq!(outcomes[1]["sub"], "s0");
    assert_eq!(outcomes[1]["error"]["code"], "subscription_exists", "{}", outcomes[1]);
    let n_accepted = outcomes.iter().filter(|outcome| outcome["reset"] == true).count();
    assert_eq!(n_accepted, max_subs);
    for outcome in &outcomes[max_subs + 1..] {
        assert_eq!(outcome["error"]["code"], "limit_exceeded", "{outcome}");
    }

    // The connection holds exactly the limit: each accepted entry gets its Reset,
    // and one more subscribe is refused.
    assert!(client.read_until(Duration::from_secs(10), |client| client.lists.len() == max_subs).await);
    client.send(json!({"op": "subscribe", "sub": "extra", "collection": "rooms", "limit": 1})).await;
    let error = client.expect_error().await;
    assert_eq!(error["code"], "limit_exceeded", "{error}");
    assert_eq!(server.metric("ordo_subscriptions"), max_subs as f64);
}

/// The server's resident memory, from `/proc`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Regression: 30 cycles of (connect, subscribe 128 windows of 1 000 items,
/// drop the TCP connection) took the server from 7 MB to 450 MB: every parked
/// session kept its retained frames and windows until it expired (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_sessions_stay_within_their_budget() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", common::room_schema());
    let ops: Vec<Value> = (0..2_000)
        .map(|index| json!({"op": "upsert", "id": format!("room-{index:05}"), "fields": {"name": format!("room number {index}"), "recency": index}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({ "ops": ops }));
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_subs = limits["max_subscriptions_per_connection"].as_u64().unwrap() as usize;
    let window = |index: usize| {
        json!({"sub": format!("w{index}"), "collection": "rooms", "sort": [{"field": "recency", "dir": "desc"}],
               "offset": index, "limit": 1_000})
    };
    let rss_before = rss_bytes(server.pid());

    const N_CYCLES: usize = 20;
    let mut first_session = String::new();
    for cycle in 0..N_CYCLES {
        let mut client = server.connect().await;
        if cycle == 0 {
            first_session = client.session.clone();
        }
        for index in 0..max_subs {
            let mut subscribe = window(index);
            subscribe["op"] = json!("subscribe");
            client.send(subscribe).await;
        }
        // Every window's first frame (~100 KB each), read without parsing: the
        // server now retains them for resume. Then the TCP connection is dropped.
        let mut n_frames = 0;
        while n_frames < max_subs {
            let message = tokio::time::timeout(Duration::from_secs(30), client.socket.next()).await;
            match message.expect("frames kept coming").expect("the stream is open").expect("a frame") {
                Message::Text(text) => {
                    assert!(text.starts_with(r#"{"type":"diffs""#), "{text}");
                    n_frames += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        drop(client);
    }

    // The parked sessions settle within the budget: a few of the 20 are kept.
    let deadline = Instant::now() + Duration::from_secs(20);
    let max_sessions_kept = 6.0;
    while server.metric("ordo_sessions") > max_sessions_kept && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 20 sessions of ~13 MB of retained frames each would be 260 MB; the
    // per-owner budget (64 MiB of estimated bytes) keeps a few.
    let rss_after = rss_bytes(server.pid());
    let grown_mib = rss_after.saturating_sub(rss_before) / (1024 * 1024);
    eprintln!("server RSS: {} MiB before, {} MiB after", rss_before / (1024 * 1024), rss_after / (1024 * 1024));
    assert!(grown_mib < 150, "the server grew by {grown_mib} MiB (from {} MiB)", rss_before / (1024 * 1024));
    let n_sessions = server.metric("ordo_sessions");
    assert!(n_sessions <= max_sessions_kept, "{n_sessions} sessions still held");
    let n_subscriptions = server.metric("ordo_subscriptions");
    assert!(n_subscriptions <= max_sessions_kept * max_subs as f64, "{n_subscriptions} subscriptions still held");

    // The first session was pushed out: its resume resets.
    let mut client = server.connect().await;
    client.lists.insert("w0".to_owned(), common::LocalList { seq: 1, ..Default::default() });
    let mut entry = window(0);
    entry["last_seq"] = json!(1);
    client.send(json!({"op": "resume", "session": first_session, "subs": [entry]})).await;
    let is_resumed = |frame: &Value| frame["type"] == "resumed";
    assert!(client.read_until(Duration::from_secs(10), |client| client.frames.iter().any(is_resumed)).await);
    let resumed = client.frames.iter().find(|frame| is_resumed(frame)).unwrap().clone();
    assert_eq!(resumed["subs"][0], json!({"sub": "w0", "reset": true}), "{resumed}");
    assert!(client.read_until(Duration::from_secs(10), |client| client.lists["w0"].seq >= 2).await);
    let list = &client.lists["w0"];
    assert_eq!((list.seq, list.n_resets, list.items.len()), (2, 1, 1_000));
}
