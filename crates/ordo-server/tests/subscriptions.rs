//! Against a real server on loopback: subscribe, write, apply the diff frames,
//! and compare with a one-shot query after every step; resume after a dropped
//! connection and after a restart; a slow consumer gets bounded memory and a Reset.

mod common;

use std::time::Duration;

use common::{room_schema, Client, Rng, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);

fn random_op(rng: &mut Rng, n_ids: u64) -> Value {
    let id = format!("!r{:03}:example.org", rng.below(n_ids));
    if rng.chance(15) {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = serde_json::Map::new();
    if rng.chance(70) {
        fields.insert("recency".into(), json!(rng.below(1_000)));
    }
    if rng.chance(40) {
        fields.insert("unread".into(), json!(rng.below(4)));
    }
    if rng.chance(30) {
        fields.insert("dm".into(), json!(rng.chance(50)));
    }
    if rng.chance(30) {
        let names = ["alice", "Bob", "carol", "Dave", "Émile", "zoë", "ab", "Abby"];
        fields.insert("name".into(), json!(names[rng.below(names.len() as u64) as usize]));
    }
    if rng.chance(10) {
        fields.insert("score".into(), json!(rng.below(100) as f64 / 8.0));
    }
    let mut op = json!({"op": "upsert", "id": id, "fields": fields});
    if rng.chance(30) {
        op["payload"] = json!({"last": format!("message {}", rng.below(100)), "n": rng.below(10)});
    }
    op
}

fn random_filter(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => Value::Null,
        1 => json!({"field": "unread", "op": "gt", "value": 0}),
        2 => json!({"field": "dm", "op": "eq", "value": true}),
        3 => json!({"field": "name", "contains": "b"}),
        4 => json!({"any": [{"field": "dm", "op": "eq", "value": true}, {"field": "unread", "op": "ge", "value": 2}]}),
        _ => json!({"not": {"field": "name", "is_null": true}}),
    }
}

fn random_sort(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => json!([{"field": "recency", "dir": "desc"}]),
        1 => json!([{"field": "name", "dir": "asc", "case_insensitive": true}]),
        2 => json!([{"field": "unread", "dir": "desc"}, {"field": "recency", "dir": "desc"}]),
        _ => json!([]),
    }
}

/// What the client's subscription should show, by a one-shot query of the same window.
fn query(server: &Server, sub: &Value) -> Vec<Value> {
    let body = json!({
        "filter": sub["filter"], "sort": sub["sort"], "offset": sub["offset"], "limit": sub["limit"],
        "fields": sub["fields"], "payload": sub["payload"],
    });
    let answer = server.ok("POST", "/v1/collections/rooms/query", body);
    common::query_items(&answer["items"])
}

async fn settle(client: &mut Client, server: &Server, subs: &[Value], context: &str) {
    for sub in subs {
        let id = sub["sub"].as_str().unwrap().to_owned();
        let expected = query(server, sub);
        let equal =
            client.read_until(SETTLE, |client| client.lists.get(&id).is_some_and(|list| list.items == expected)).await;
        let got = client.lists.get(&id).map(|list| list.items.clone());
        assert!(equal, "{context}: subscription {id} {sub}\n got      {got:?}\n expected {expected:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_writes_and_window_changes_keep_every_subscription_equal_to_a_query() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    for seed in [1u64, 2, 3] {
        let mut rng = Rng::new(seed);
        let mut client = server.connect().await;
        let mut subs: Vec<Value> = Vec::new();
        for n in 0..3 {
            let mut sub = json!({
                "op": "subscribe", "sub": format!("s{seed}-{n}"), "collection": "rooms",
                "filter": random_filter(&mut rng), "sort": random_sort(&mut rng),
                "offset": rng.below(3), "limit": 1 + rng.below(12),
                "fields": Value::Null, "payload": true,
            });
            if n == 2 {
                // A projection: two fields in the client's order, no payload.
                sub["fields"] = json!(["unread", "name"]);
                sub["payload"] = json!(false);
            }
            client.send(sub.clone()).await;
            subs.push(sub);
        }
        // A twin of the first subscription on a second connection shares its window.
        let mut twin_client = server.connect().await;
        let mut twin = subs[0].clone();
        twin["sub"] = json!("twin");
        twin_client.send(twin.clone()).await;
        settle(&mut client, &server, &subs, "after subscribing").await;
        for step in 0..60 {
            let ops: Vec<Value> = (0..1 + rng.below(6)).map(|_| random_op(&mut rng, 40)).collect();
            server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
            if rng.chance(15) {
                let index = rng.below(subs.len() as u64) as usize;
                let (offset, limit) = (rng.below(5), 1 + rng.below(15));
                subs[index]["offset"] = json!(offset);
                subs[index]["limit"] = json!(limit);
                client
                    .send(json!({"op": "set_range", "sub": subs[index]["sub"], "offset": offset, "limit": limit}))
                    .await;
            }
            if rng.chance(10) {
                let index = rng.below(subs.len() as u64) as usize;
                subs[index]["filter"] = random_filter(&mut rng);
                subs[index]["sort"] = random_sort(&mut rng);
                let message = json!({"op": "set_view", "sub": subs[index]["sub"], "filter": subs[index]["filter"], "sort": subs[index]["sort"]});
                client.send(message).await;
            }
            settle(&mut client, &server, &subs, &format!("seed {seed} step {step}")).await;
            settle(&mut twin_client, &server, std::slice::from_ref(&twin), &format!("twin, seed {seed} step {step}"))
                .await;
        }
        assert!(client.frames.iter().all(|frame| frame["type"] != "error"), "{:?}", client.frames);
        // Unsubscribing confirms, and nothing of that subscription follows.
        client.send(json!({"op": "unsubscribe", "sub": subs[0]["sub"]})).await;
        let confirmed =
            client.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "unsubscribed")).await;
        assert!(confirmed);
        let seq_after = client.lists[subs[0]["sub"].as_str().unwrap()].seq;
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [random_op(&mut rng, 40)]}));
        settle(&mut client, &server, &subs[1..], "after unsubscribe").await;
        assert_eq!(client.lists[subs[0]["sub"].as_str().unwrap()].seq, seq_after);
    }
    assert!(server.metric("ordo_frames_sent_total") > 0.0);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_replays_missed_frames_exactly_and_a_restart_resets_without_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let mut rng = Rng::new(7);
    let ops: Vec<Value> = (0..30).map(|n| json!({"op": "upsert", "id": format!("!r{n:03}:example.org"), "fields": {"recency": n, "name": format!("room {n}")}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sub = json!({"op": "subscribe", "sub": "top", "collection": "rooms", "filter": null,
        "sort": [{"field": "recency", "dir": "desc"}], "offset": 0, "limit": 10, "fields": null, "payload": true});
    let mut client = server.connect().await;
    client.send(sub.clone()).await;
    settle(&mut client, &server, std::slice::from_ref(&sub), "subscribed").await;
    for _ in 0..5 {
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [random_op(&mut rng, 30)]}));
    }
    settle(&mut client, &server, std::slice::from_ref(&sub), "live").await;
    let applied = client.lists["top"].clone();
    let session = client.session.clone();
    // The connection drops; writes go on meanwhile.
    drop(client);
    for n in 0..4 {
        let op = json!({"op": "upsert", "id": format!("!r{n:03}:example.org"), "fields": {"recency": 1_000 + n}});
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [op]}));
    }
    let mut client = server.connect().await;
    client.lists.insert("top".into(), applied.clone());
    let mut entry = sub.clone();
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(applied.seq);
    client.send(json!({"op": "resume", "session": session, "subs": [entry.clone()]})).await;
    settle(&mut client, &server, std::slice::from_ref(&sub), "resumed by replay").await;
    let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").expect("a resumed frame").clone();
    assert_eq!(resumed["subs"][0]["sub"], "top", "{resumed}");
    assert!(resumed["subs"][0]["replayed"].is_u64(), "expected a replay: {resumed}");
    // No reset was needed: the list was kept up by the missed diffs alone.
    assert_eq!(client.lists["top"].n_resets, applied.n_resets);
    assert!(client.lists["top"].seq > applied.seq + 3, "the four missed updates came as frames");

    // A restart loses sessions: the same resume now resets, continuing the sequence.
    let applied = client.lists["top"].clone();
    let session = client.session.clone();
    drop(client);
    server.stop();
    let server = Server::start(dir.path(), &[]);
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [{"op": "remove", "id": "!r001:example.org"}]}));
    let mut client = server.connect().await;
    client.lists.insert("top".into(), applied.clone());
    entry["last_seq"] = json!(applied.seq);
    client.send(json!({"op": "resume", "session": session, "subs": [entry]})).await;
    settle(&mut client, &server, std::slice::from_ref(&sub), "resumed after a restart").await;
    let resumed = client.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["subs"][0]["reset"], true, "{resumed}");
    assert_eq!(client.lists["top"].seq, applied.seq + 1);
    assert_eq!(client.lists["top"].n_resets, applied.n_resets + 1);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_gets_bounded_memory_then_one_reset() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 64 * 1024;
    let server = Server::start(dir.path(), &["--outbound-buffer", &budget.to_string()]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let filler = "x".repeat(2_000);
    let ops: Vec<Value> = (0..500)
        .map(|n| json!({"op": "upsert", "id": format!("!r{n:03}:example.org"), "fields": {"recency": n}, "payload": {"text": filler}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sub = json!({"op": "subscribe", "sub": "all", "collection": "rooms", "filter": null,
        "sort": [{"field": "recency", "dir": "desc"}], "offset": 0, "limit": 500, "fields": null, "payload": true});
    let mut slow = server.connect().await;
    slow.send(sub.clone()).await;
    settle(&mut slow, &server, std::slice::from_ref(&sub), "subscribed").await;
    // A healthy subscriber on another connection must not notice.
    let mut healthy = server.connect().await;
    let mut healthy_sub = sub.clone();
    healthy_sub["sub"] = json!("healthy");
    healthy_sub["limit"] = json!(5);
    healthy.send(healthy_sub.clone()).await;

    // `slow` stops reading. Every batch moves 50 rooms, each carrying 2 kB, into its window.
    let mut max_queued = 0.0f64;
    let mut recency = 1_000;
    for _ in 0..120 {
        let ops: Vec<Value> = (0..50)
            .map(|n| {
                recency += 1;
                json!({"op": "upsert", "id": format!("!r{:03}:example.org", (recency * 7 + n) % 500), "fields": {"recency": recency}})
            })
            .collect();
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
        max_queued = max_queued.max(server.metric("ordo_outbound_queued_bytes"));
    }
    settle(&mut healthy, &server, std::slice::from_ref(&healthy_sub), "healthy subscriber").await;
    // Memory stays within the budget plus one frame (a frame larger than the whole
    // budget still goes out when the queue is empty).
    let largest_frame = 500.0 * 2_200.0;
    assert!(max_queued <= budget as f64 + largest_frame, "queued {max_queued} bytes");

    // It reads again: old frames, then one Reset, then it is exact.
    settle(&mut slow, &server, std::slice::from_ref(&sub), "slow subscriber after draining").await;
    assert!(slow.lists["all"].n_resets >= 2, "the first Reset and at least one for falling behind");
    assert!(server.metric("ordo_resets_slow_total") >= 1.0);
    // (Whether a reset already went out before it read again depends on the
    // kernel's socket buffers: a burst can overflow the budget while the socket
    // still takes bytes, and then the queue drains at once. So no assertion on it.)
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_as_slow_and_others_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--outbound-buffer", "16384", "--slow-close-after", "1"]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let filler = "y".repeat(4_000);
    let ops: Vec<Value> = (0..300)
        .map(|n| json!({"op": "upsert", "id": format!("!r{n:03}:example.org"), "fields": {"recency": n}, "payload": {"text": filler}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let mut stuck = server.connect().await;
    for n in 0..8 {
        let sub = json!({"op": "subscribe", "sub": format!("s{n}"), "collection": "rooms",
            "sort": [{"field": "recency", "dir": if n % 2 == 0 { "desc" } else { "asc" }}], "offset": n, "limit": 300});
        stuck.send(sub).await;
    }
    let mut recency = 10_000;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.metric("ordo_closed_slow_total") < 1.0 {
        assert!(std::time::Instant::now() < deadline, "the stuck client was never closed");
        let ops: Vec<Value> = (0..100)
            .map(|n| {
                recency += 1;
                json!({"op": "upsert", "id": format!("!r{:03}:example.org", (recency + n * 3) % 300), "fields": {"recency": recency}})
            })
            .collect();
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    }
    // Another connection works as before.
    let mut other = server.connect().await;
    let sub = json!({"op": "subscribe", "sub": "top", "collection": "rooms", "filter": null,
        "sort": [{"field": "recency", "dir": "desc"}], "offset": 0, "limit": 3, "fields": null, "payload": false});
    other.send(sub.clone()).await;
    settle(&mut other, &server, std::slice::from_ref(&sub), "another connection").await;
    drop(stuck);
    server.stop();
}

/// A stop closes every WebSocket with 1001 (going away), so that clients know to
/// reconnect and resume: none is left to the runtime's end, which would close
/// its socket without a close frame (1006 to the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_closes_every_websocket_with_going_away() {
    const N_CONNECTIONS: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> = (0..20)
        .map(|n| json!({"op": "upsert", "id": format!("!r{n:03}:example.org"), "fields": {"recency": n}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let mut clients = Vec::new();
    for n in 0..N_CONNECTIONS {
        let mut client = server.connect().await;
        let sub = json!({"op": "subscribe", "sub": format!("s{n}"), "collection": "rooms",
            "sort": [{"field": "recency", "dir": "desc"}], "limit": 5});
        client.send(sub).await;
        assert!(client.read_until(SETTLE, |client| !client.lists.is_empty()).await, "no snapshot on {n}");
        clients.push(client);
    }
    // SAFETY: `kill` with the pid of a child we own and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) };
    let mut codes = Vec::new();
    for client in &mut clients {
        client.read_until(SETTLE, |client| client.frames.iter().any(|frame| frame["type"] == "close")).await;
        let close = client.frames.iter().find(|frame| frame["type"] == "close");
        codes.push(close.map(|close| close["code"].clone()).unwrap_or(Value::Null));
    }
    assert!(codes.iter().all(|code| *code == json!(1001)), "close codes (null: none): {codes:?}");
    assert!(server.wait().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_session_is_dropped_after_its_retention_and_frees_its_windows() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that the checks of the held state below, made as soon as the idle
    // session is gone, come well inside it even on a slow machine.
    let retention = Duration::from_secs(5);
    let server = Server::start(dir.path(), &["--session-retention", &retention.as_secs().to_string()]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": 1}}]}),
    );
    // A connection without subscriptions leaves nothing behind when it closes.
    let idle = server.connect().await;
    let mut client = server.connect().await;
    for n in 0..3 {
        client
            .send(json!({"op": "subscribe", "sub": format!("s{n}"), "collection": "rooms", "offset": n, "limit": 5}))
            .await;
    }
    assert!(client.read_until(SETTLE, |c| c.lists.len() == 3).await);
    assert_eq!(server.metric("ordo_subscriptions"), 3.0);
    assert_eq!(server.metric("ordo_windows"), 3.0);
    drop(idle);
    drop(client);
    let dropped = std::time::Instant::now();
    // The idle connection's session is gone at once (as soon as the server sees the close)...
    let deadline = dropped + Duration::from_secs(10);
    while server.metric("ordo_sessions") > 1.0 {
        assert!(std::time::Instant::now() < deadline, "the idle connection's session was never dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...while the other is held for resume.
    let (sessions, subscriptions) = (server.metric("ordo_sessions"), server.metric("ordo_subscriptions"));
    assert!(dropped.elapsed() < retention, "the checks of the held session came after its retention");
    assert_eq!(subscriptions, 3.0, "held for resume");
    assert_eq!(sessions, 1.0, "the idle connection's session is gone at once");
    // ...then dropped with its windows (and their views) once the retention has passed.
    let deadline = std::time::Instant::now() + retention + Duration::from_secs(30);
    while server.metric("ordo_sessions") > 0.0 {
        assert!(std::time::Instant::now() < deadline, "the session was never dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dropped.elapsed() >= retention, "dropped before its retention: {:?}", dropped.elapsed());
    assert_eq!(server.metric("ordo_subscriptions"), 0.0);
    assert_eq!(server.metric("ordo_windows"), 0.0);
    assert_eq!(server.metric("ordo_views"), 0.0);
    server.stop();
}

/// The window digest is on every frame of a window up to 256 rows, on no frame of
/// a larger one, and on every frame of a larger one whose subscription asked for it,
/// even when it shares its engine window with one that did not. (The test client
/// checks every digest it gets against its own list.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_carry_the_window_digest_up_to_256_rows_or_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> =
        (0..300).map(|n| json!({"op": "upsert", "id": format!("!r{n:03}"), "fields": {"recency": n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let mut client = server.connect().await;
    let by_recency = json!([{"field": "recency", "dir": "desc"}]);
    let subscriptions = [
        json!({"sub": "small", "limit": 256}),
        json!({"sub": "large", "limit": 257}),
        json!({"sub": "asked", "limit": 257, "digest": true}),
    ];
    for subscription in &subscriptions {
        let mut message = json!({"op": "subscribe", "collection": "rooms", "sort": by_recency});
        message.as_object_mut().unwrap().extend(subscription.as_object().unwrap().clone());
        client.send(message).await;
    }
    let first_frames = |client: &Client| ["small", "large", "asked"].iter().all(|sub| client.lists.contains_key(*sub));
    assert!(client.read_until(SETTLE, first_frames).await, "the first frames came");
    for n in 0..5 {
        let op = json!({"op": "upsert", "id": format!("!r{:03}", 290 - n), "fields": {"recency": 1_000 + n}});
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [op]}));
    }
    let caught_up = |client: &Client| ["small", "large", "asked"].iter().all(|sub| client.lists[*sub].seq == 6);
    assert!(client.read_until(SETTLE, caught_up).await, "five frames each after the Reset");
    for (sub, carries_digest) in [("small", true), ("large", false), ("asked", true)] {
        let frames: Vec<&Value> = client.diffs_seen.iter().filter(|frame| frame["sub"] == sub).collect();
        assert_eq!(frames.len(), 6, "{sub}");
        for frame in frames {
            assert_eq!(frame.get("digest").is_some(), carries_digest, "{sub}: {frame}");
        }
        assert_eq!(client.lists[sub].n_digests_checked, if carries_digest { 6 } else { 0 }, "{sub}");
    }
    // Every item in a frame carries its version: what the digest hashes.
    assert!(client.lists["small"].items.iter().all(|item| item["version"].is_u64()));
}
