//! Read-your-writes against a real server on loopback: every query answer and
//! every diffs frame says the `seq` of the last write it reflects (`write_seq`),
//! checked exactly against a model of the writes under concurrent writers (so
//! under group commit); `min_seq` makes a query, a subscribe or a resume entry
//! wait for a write, without holding up other frames, and is refused with
//! `seq_not_reached` when the write does not come in time (or cannot).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{apply_frame, room_schema, Client, LocalList, Rng, Server};
use ordo_server::limits::{MAX_MIN_SEQ_AHEAD, MIN_SEQ_WAIT_MS};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);
const WINDOW: usize = 5;

/// One blocking HTTP request on its own connection (for writer threads).
fn request(port: u16, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8(response).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn write(server: &Server, ops: Value) -> u64 {
    let answer = server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    answer["seq"].as_u64().unwrap()
}

fn last_seq(server: &Server) -> u64 {
    server.ok("GET", "/v1/health", Value::Null)["last_seq"].as_u64().unwrap()
}

fn top(sub: &str) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "rooms", "sort": [{"field": "recency", "dir": "desc"}],
           "limit": WINDOW, "fields": ["recency"], "payload": false})
}

/// The room list as the model holds it: id → recency.
type Rooms = BTreeMap<String, u64>;

/// The window `top` shows of `rooms`: by recency, descending, then by id.
fn model_window(rooms: &Rooms) -> Vec<(String, u64)> {
    let mut rows: Vec<(String, u64)> = rooms.iter().map(|(id, recency)| (id.clone(), *recency)).collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows.truncate(WINDOW);
    rows
}

fn list_rows(list: &LocalList) -> Vec<(String, u64)> {
    list.items
        .iter()
        .map(|item| (item["id"].as_str().unwrap().to_owned(), item["fields"]["recency"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_frame_and_query_reflects_exactly_the_writes_up_to_its_write_seq() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let n_ids = 12;
    let initial: Vec<Value> =
        (0..n_ids).map(|n| json!({"op": "upsert", "id": format!("r{n:02}"), "fields": {"recency": n}})).collect();
    let initial_seq = write(&server, Value::Array(initial));
    // A query says which write it reflects: here, the last one.
    let answer = server.ok("POST", "/v1/collections/rooms/query", json!({"limit": 1}));
    assert_eq!(answer["write_seq"], initial_seq, "{answer}");

    let mut client = server.connect().await;
    client.send(top("top")).await;
    assert!(client.read_until(SETTLE, |client| client.lists.contains_key("top")).await);

    // Concurrent writers, so that group commits hold several batches: each
    // upsert takes the top row (recency from one counter), some are removes.
    let n_writers = 4;
    let n_writes = 40;
    let recency = Arc::new(AtomicU64::new(1_000));
    let writers: Vec<_> = (0..n_writers)
        .map(|writer| {
            let (port, recency) = (server.port, recency.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x5eed_0100 + writer);
                let mut done = Vec::new();
                for _ in 0..n_writes {
                    let id = format!("r{:02}", rng.below(n_ids));
                    let op = if rng.chance(15) {
                        json!({"op": "remove", "id": id})
                    } else {
                        json!({"op": "upsert", "id": id, "fields": {"recency": recency.fetch_add(1, Ordering::SeqCst)}})
                    };
                    let (status, answer) =
                        request(port, "POST", "/v1/collections/rooms/batch", &json!({"ops": [op.clone()]}));
                    assert_eq!(status, 200, "{answer}");
                    done.push((answer["seq"].as_u64().unwrap(), op));
                }
                done
            })
        })
        .collect();
    let mut writes: Vec<(u64, Value)> = writers.into_iter().flat_map(|writer| writer.join().unwrap()).collect();
    writes.sort_by_key(|(seq, _)| *seq);

    // The model: the rooms after each write, by seq.
    let mut rooms: Rooms = (0..n_ids).map(|n| (format!("r{n:02}"), n)).collect();
    let mut windows: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::from([(initial_seq, model_window(&rooms))]);
    let mut changed_at = Vec::new();
    for (seq, op) in &writes {
        let id = op["id"].as_str().unwrap().to_owned();
        match op["op"].as_str().unwrap() {
            "remove" => rooms.remove(&id),
            _ => rooms.insert(id, op["fields"]["recency"].as_u64().unwrap()),
        };
        let window = model_window(&rooms);
        if windows.last_key_value().map(|(_, last)| last) != Some(&window) {
            changed_at.push(*seq);
        }
        windows.insert(*seq, window);
    }
    let last = *windows.last_key_value().unwrap().0;
    let expected = windows[&last].clone();
    let settled = client.read_until(SETTLE, |client| list_rows(&client.lists["top"]) == expected).await;
    assert!(settled, "the list never showed the last write: {:?} against {expected:?}", client.lists["top"]);
    // A query after the writes reflects the last of them.
    let answer = server.ok("POST", "/v1/collections/rooms/query", json!({"limit": 1, "min_seq": last}));
    assert_eq!(answer["write_seq"], last, "{answer}");

    // Each frame, applied in order, leaves the list equal to the model's window
    // right after the write its `write_seq` names: not before it, not after.
    let mut list = LocalList::default();
    let mut frame_seqs = Vec::new();
    for frame in &client.diffs_seen {
        apply_frame(&mut list, frame);
        let write_seq = frame["write_seq"].as_u64().unwrap_or_else(|| panic!("no write_seq in {frame}"));
        let at = windows.get(&write_seq).unwrap_or_else(|| panic!("write_seq {write_seq} is no write's: {frame}"));
        assert_eq!(&list_rows(&list), at, "after the frame {frame}");
        frame_seqs.push(write_seq);
    }
    // The first frame is the subscription's Reset, taken after the initial write;
    // every later one is the frame of exactly one write that changed the window.
    assert_eq!(frame_seqs.first(), Some(&initial_seq));
    assert_eq!(frame_seqs[1..], changed_at[..], "one frame per write that changed the window, in order");
    assert!(changed_at.len() > n_writes as usize, "the writes changed the window often: {}", changed_at.len());
    server.stop();
}

/// Reads until `until` holds; panics with the frames read otherwise.
async fn wait_for(client: &mut Client, what: &str, until: impl FnMut(&Client) -> bool) {
    let held = client.read_until(SETTLE, until).await;
    assert!(held, "{what}: frames {:?}, diffs {:?}", client.frames, client.diffs_seen);
}

/// The next error frame (`Client::expect_error` gives up after 5 s: the bound itself).
async fn next_error(client: &mut Client) -> Value {
    let n_before = client.frames.len();
    wait_for(client, "an error frame", |client| client.frames[n_before..].iter().any(|frame| frame["type"] == "error"))
        .await;
    client.frames[n_before..].iter().find(|frame| frame["type"] == "error").unwrap().clone()
}

/// HTTP requests the server has received so far (`ordo_http_requests_total` counts
/// a request as it starts handling it; this read counts itself too).
fn http_requests_received(server: &Server) -> u64 {
    server.metric("ordo_http_requests_total") as u64
}

/// Waits until `n` requests besides these `/metrics` reads have reached the server
/// since `before` was read: the event that a request sent from another thread is
/// in the server's hands, where a sleep could only hope so.
fn wait_for_requests_since(server: &Server, before: u64, n: u64) {
    let deadline = Instant::now() + SETTLE;
    for own_reads in 1.. {
        let others = http_requests_received(server).saturating_sub(before + own_reads);
        if others >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{others} of {n} requests reached the server");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn frames_of<'a>(client: &'a Client, sub: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    client.diffs_seen.iter().filter(move |frame| frame["sub"] == sub)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_seq_waits_for_its_write_while_other_frames_keep_flowing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let start = write(&server, json!([{"op": "upsert", "id": "a", "fields": {"recency": 1}}]));
    let mut client = server.connect().await;
    client.send(top("live")).await;
    wait_for(&mut client, "live's first frame", |client| client.lists.contains_key("live")).await;

    // A subscribe for the write after the next waits; the message behind it waits with it.
    let mut later = top("later");
    later["min_seq"] = json!(start + 2);
    later["req"] = json!("s1");
    client.send(later).await;
    client.send(json!({"op": "set_range", "sub": "live", "offset": 0, "limit": 6, "req": "behind"})).await;
    let answered_behind =
        |client: &Client| client.frames.iter().chain(&client.diffs_seen).any(|f| f["req"] == "behind");
    // A query for the next write waits for it: once the server has it, it does not answer.
    let port = server.port;
    let requests_before = http_requests_received(&server);
    let query_sent = Instant::now();
    let query = std::thread::spawn(move || {
        let body = json!({"limit": 10, "min_seq": start + 1, "fields": ["recency"], "payload": false});
        let answer = request(port, "POST", "/v1/collections/rooms/query", &body);
        (answer, query_sent.elapsed())
    });
    wait_for_requests_since(&server, requests_before, 1);
    assert!(!query.is_finished(), "the query waits for its write");
    let held_before_the_write = query_sent.elapsed();

    let first = write(&server, json!([{"op": "upsert", "id": "b", "fields": {"recency": 2}}]));
    assert_eq!(first, start + 1);
    // Frames of live subscriptions are not held up by the parked subscribe.
    wait_for(&mut client, "live's frame of the first write", |client| {
        frames_of(client, "live").any(|frame| frame["write_seq"] == first)
    })
    .await;
    // That frame was caused by a write made after `later` and `behind` were sent,
    // so an answer to either that was not held back would have come before it.
    assert!(client.frames.iter().all(|frame| frame["type"] == "welcome"), "{:?}", client.frames);
    assert!(!answered_behind(&client), "the message behind the parked subscribe waits: {:?}", client.diffs_seen);
    let ((status, answer), waited) = query.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer["write_seq"].as_u64().unwrap() >= first, "{answer}");
    assert!(answer["items"].as_array().unwrap().iter().any(|item| item["id"] == "b"), "{answer}");
    assert!(waited >= held_before_the_write && waited < Duration::from_millis(MIN_SEQ_WAIT_MS), "{waited:?}");
    assert!(frames_of(&client, "later").next().is_none(), "`later` waits for the second write");

    let second = write(&server, json!([{"op": "upsert", "id": "c", "fields": {"recency": 3}}]));
    wait_for(&mut client, "later's first frame", |client| frames_of(client, "later").next().is_some()).await;
    let later_first = frames_of(&client, "later").next().unwrap().clone();
    assert_eq!(later_first["req"], "s1", "{later_first}");
    assert!(later_first["write_seq"].as_u64().unwrap() >= second, "{later_first}");
    assert!(client.lists["later"].items.iter().any(|item| item["id"] == "c"), "{later_first}");
    // The message sent behind the parked one is answered after it (`read_until`
    // stopped at `later`'s first frame, so nothing after it has been read yet).
    assert!(!answered_behind(&client), "{:?}", client.frames);
    wait_for(&mut client, "the set_range's answer", answered_behind).await;

    // A resume entry's min_seq holds the whole resume until the write is there.
    let held = client.lists.clone();
    let session = client.session.clone();
    drop(client);
    let mut again = server.connect().await;
    let mut entry = top("live");
    entry.as_object_mut().unwrap().remove("op");
    entry["limit"] = json!(6);
    entry["last_seq"] = json!(held["live"].seq);
    entry["min_seq"] = json!(second + 1);
    again.lists.insert("live".into(), held["live"].clone());
    let parked = parked_so_far(&server);
    again.send(json!({"op": "resume", "session": session, "subs": [entry], "req": "r1"})).await;
    wait_for_parked(&server, parked + 1).await;
    let third = write(&server, json!([{"op": "upsert", "id": "d", "fields": {"recency": 4}}]));
    wait_for(&mut again, "resumed", |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
    let resumed = again.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["req"], "r1", "{resumed}");
    assert_eq!(resumed["subs"][0]["sub"], "live", "{resumed}");
    assert!(resumed["subs"][0].get("error").is_none(), "{resumed}");
    wait_for(&mut again, "the third write in the resumed list", |client| {
        client.lists["live"].items.iter().any(|item| item["id"] == "d")
    })
    .await;
    assert!(frames_of(&again, "live").any(|frame| frame["write_seq"] == third));
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_seq_not_reached_in_time_is_refused_and_one_far_ahead_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    write(&server, json!([{"op": "upsert", "id": "a", "fields": {"recency": 1}}]));
    let last = last_seq(&server);
    let bound = Duration::from_millis(MIN_SEQ_WAIT_MS);
    // Each in parallel, so the test waits for the bound once: the next write,
    // the farthest `min_seq` still waited for, and one past it.
    let queries: Vec<_> = [last + 1, last + MAX_MIN_SEQ_AHEAD, last + MAX_MIN_SEQ_AHEAD + 1]
        .into_iter()
        .map(|min_seq| {
            let port = server.port;
            std::thread::spawn(move || {
                let started = Instant::now();
                let body = json!({"limit": 1, "min_seq": min_seq});
                let answer = request(port, "POST", "/v1/collections/rooms/query", &body);
                (answer, started.elapsed())
            })
        })
        .collect();

    let mut client = server.connect().await;
    client.send(top("live")).await;
    let mut waits = top("waits");
    waits["min_seq"] = json!(last + 1);
    waits["req"] = json!("w");
    let started = Instant::now();
    client.send(waits).await;
    client.send(json!({"op": "set_range", "sub": "live", "offset": 0, "limit": 1, "req": "next"})).await;
    let error = next_error(&mut client).await;
    let waited = started.elapsed();
    assert_eq!(
        (&error["code"], &error["sub"], &error["req"]),
        (&json!("seq_not_reached"), &json!("waits"), &json!("w")),
        "{error}"
    );
    assert!(waited >= bound && waited < bound + Duration::from_secs(2), "{waited:?}");
    assert!(!client.lists.contains_key("waits"), "a refused subscribe creates nothing");
    // The message behind it is handled after it (an ack: the window holds one room already).
    wait_for(&mut client, "the set_range's answer", |client| client.frames.iter().any(|frame| frame["req"] == "next"))
        .await;
    let position = |req: &str| client.frames.iter().position(|frame| frame["req"] == req).unwrap();
    assert!(position("w") < position("next"));

    for (index, query) in queries.into_iter().enumerate() {
        let ((status, answer), waited) = query.join().unwrap();
        assert_eq!((status, &answer["error"]["code"]), (503, &json!("seq_not_reached")), "{answer}");
        if index < 2 {
            assert!(waited >= bound && waited < bound + Duration::from_secs(2), "query {index}: {waited:?}");
        } else {
            assert!(waited < Duration::from_secs(1), "past max_min_seq_ahead: refused at once, not {waited:?}");
        }
    }

    // Over the WebSocket too: far ahead is refused at once, and a resume runs
    // after the bound with only the entry that waited refused.
    let mut far = top("far");
    far["min_seq"] = json!(last + MAX_MIN_SEQ_AHEAD + 1);
    let started = Instant::now();
    client.send(far).await;
    let error = next_error(&mut client).await;
    assert_eq!((&error["code"], &error["sub"]), (&json!("seq_not_reached"), &json!("far")), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));

    let mut resumer = server.connect().await;
    let mut waiting = top("waiting");
    waiting.as_object_mut().unwrap().remove("op");
    waiting["last_seq"] = json!(0);
    waiting["min_seq"] = json!(last + 1);
    let mut plain = waiting.clone();
    plain["sub"] = json!("plain");
    plain.as_object_mut().unwrap().remove("min_seq");
    let started = Instant::now();
    resumer.send(json!({"op": "resume", "session": "00", "subs": [waiting, plain]})).await;
    wait_for(&mut resumer, "resumed", |client| client.frames.iter().any(|frame| frame["type"] == "resumed")).await;
    let waited = started.elapsed();
    let resumed = resumer.frames.iter().find(|frame| frame["type"] == "resumed").unwrap().clone();
    assert!(waited >= bound && waited < bound + Duration::from_secs(2), "{waited:?}");
    assert_eq!(resumed["subs"][0]["sub"], "waiting", "{resumed}");
    assert_eq!(resumed["subs"][0]["error"]["code"], "seq_not_reached", "{resumed}");
    assert_eq!(resumed["subs"][1], json!({"sub": "plain", "reset": true}), "{resumed}");
    server.stop();
}

/// A query naming a collection that the entry at its `min_seq` creates waits
/// for that entry instead of answering `unknown_collection` at once: in a
/// cluster, a client learns the creation's `seq` from one node and reads from
/// another that has not applied it yet. Here the query is sent first; the
/// collection is created while it waits, then a write reaches its `min_seq`
/// (a single node gives a creation no `seq` of its own).
#[test]
fn a_query_waits_for_min_seq_before_it_looks_up_its_collection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let next = last_seq(&server) + 1;
    let port = server.port;
    let requests_before = http_requests_received(&server);
    let query = std::thread::spawn(move || {
        request(port, "POST", "/v1/collections/later/query", &json!({"limit": 10, "min_seq": next}))
    });
    // The query is in the server's hands before the collection exists.
    wait_for_requests_since(&server, requests_before, 1);
    server.ok("PUT", "/v1/collections/later", json!({"fields": [{"name": "n", "type": "u64"}]}));
    assert_eq!(write(&server, json!([{"op": "upsert", "id": "r1", "fields": {}}])), next);
    let (status, answer) = query.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["items"], json!([]), "{answer}");
    // Without a `min_seq` to wait for, an unknown collection is refused at once.
    let (status, answer) = request(port, "POST", "/v1/collections/never/query", &json!({"limit": 10}));
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("unknown_collection")), "{answer}");
}

/// The same for a `subscribe`: one naming a collection this node does not know
/// yet, with a `min_seq` not reached, waits for it and is checked after; the
/// subscription then starts on the new collection. Without a `min_seq` (or with
/// one already reached) it is refused with `unknown_collection` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_waits_for_min_seq_before_it_looks_up_its_collection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let next = last_seq(&server) + 1;
    let mut client = server.connect().await;
    let later = |sub: &str, min_seq: Option<u64>| {
        let mut message =
            json!({"op": "subscribe", "sub": sub, "collection": "later", "limit": 10, "req": format!("q-{sub}")});
        if let Some(min_seq) = min_seq {
            message["min_seq"] = json!(min_seq);
        }
        message
    };
    let parked = parked_so_far(&server);
    client.send(later("waits", Some(next))).await;
    wait_for_parked(&server, parked + 1).await;
    server.ok("PUT", "/v1/collections/later", json!({"fields": [{"name": "n", "type": "u64"}]}));
    let second = server.ok(
        "POST",
        "/v1/collections/later/batch",
        json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"n": 1}}]}),
    );
    assert_eq!(second["seq"].as_u64(), Some(next), "{second}");
    wait_for(&mut client, "the parked subscribe's answer", |client| {
        client.frames.iter().chain(&client.diffs_seen).any(|frame| frame["req"] == "q-waits")
    })
    .await;
    let answer = client.frames.iter().chain(&client.diffs_seen).find(|frame| frame["req"] == "q-waits").unwrap();
    assert_ne!(answer["type"], "error", "{answer}");
    wait_for(&mut client, "the item in the new list", |client| {
        client.lists.get("waits").is_some_and(|list| list.items.iter().any(|item| item["id"] == "r1"))
    })
    .await;

    // Nothing to wait for: refused at once, whether or not `min_seq` is given.
    for (sub, min_seq) in [("none", None), ("reached", Some(next))] {
        let mut message = later(sub, min_seq);
        message["collection"] = json!("never");
        client.send(message).await;
        let req = format!("q-{sub}");
        wait_for(&mut client, "the refusal", |client| client.frames.iter().any(|frame| frame["req"] == req)).await;
        let refusal = client.frames.iter().find(|frame| frame["req"] == req).unwrap();
        assert_eq!((&refusal["type"], &refusal["code"]), (&json!("error"), &json!("unknown_collection")), "{refusal}");
    }
    server.stop();
}

/// How many WebSocket requests the server has held for their `min_seq` so far.
fn parked_so_far(server: &Server) -> u64 {
    server.metric("ordo_parked_for_min_seq_total") as u64
}

/// Waits until the server has held `n` WebSocket requests for their `min_seq`
/// in all: the last one sent is then parked, so what comes next happens after it.
async fn wait_for_parked(server: &Server, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while parked_so_far(server) < n {
        assert!(std::time::Instant::now() < deadline, "no request was held for its min_seq");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
