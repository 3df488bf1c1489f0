//! Windows placed by key (`around`, `after`, `before`, `tail`) and the `total`
//! count, against a real server on loopback: every frame is applied as a client
//! library would, and compared with one-shot queries after every step.

mod common;

use std::time::Duration;

use common::{mint, room_schema, write_secret, Client, Rng, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);
const N_IDS: u64 = 30;

fn room_id(n: u64) -> String {
    format!("!r{n:03}")
}

fn random_op(rng: &mut Rng) -> Value {
    let id = room_id(rng.below(N_IDS));
    if rng.chance(20) {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = serde_json::Map::new();
    fields.insert("recency".into(), json!(rng.below(50)));
    if rng.chance(50) {
        fields.insert("unread".into(), json!(rng.below(3)));
    }
    json!({"op": "upsert", "id": id, "fields": fields})
}

const FILTERS: [&str; 2] = ["null", r#"{"field":"unread","op":"gt","value":0}"#];
const SORT: &str = r#"[{"field":"recency","dir":"desc"}]"#;

/// The whole view, by a one-shot query: (ids, total).
fn full_view(server: &Server, filter: &Value) -> (Vec<String>, u64) {
    let body = json!({"filter": filter, "sort": serde_json::from_str::<Value>(SORT).unwrap(), "limit": 1000});
    let answer = server.ok("POST", "/v1/collections/rooms/query", body);
    let ids = answer["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect();
    (ids, answer["total"].as_u64().unwrap())
}

/// A subscription as the test tracks it: where its window is, by the answers.
struct Sub {
    id: String,
    filter: Value,
    offset: usize,
    limit: usize,
    is_tail: bool,
}

/// The position keys of a random anchor on the current view, and the range the
/// anchor must give (`None`: the id does not exist, `not_found` is due).
fn random_anchor(rng: &mut Rng, view: &[String], limit: usize) -> (Value, Option<(usize, usize, bool)>) {
    let len = view.len();
    if rng.chance(10) {
        return (json!({"after": "!no-such-room"}), None);
    }
    if view.is_empty() || rng.chance(25) {
        return (json!({"tail": true}), Some((len.saturating_sub(limit), limit, true)));
    }
    let rank = rng.below(len as u64) as usize;
    let id = &view[rank];
    match rng.below(3) {
        0 => {
            let row = rng.below(limit.max(1) as u64) as usize;
            let offset = rank.saturating_sub(row).min(len.saturating_sub(limit));
            (json!({"around": {"id": id, "row": row}}), Some((offset, limit, false)))
        }
        1 => (json!({"after": id}), Some((rank + 1, limit, false))),
        _ => {
            let offset = rank.saturating_sub(limit);
            (json!({"before": id}), Some((offset, rank - offset, false)))
        }
    }
}

fn last_diffs_frame<'a>(client: &'a Client, sub: &str, from: usize) -> Option<&'a Value> {
    client.diffs_seen[from..].iter().rev().find(|frame| frame["sub"] == sub)
}

/// The `total` the client last received for `sub`.
fn last_total(client: &Client, sub: &str) -> Option<u64> {
    client.diffs_seen.iter().rev().filter(|frame| frame["sub"] == sub).find_map(|frame| frame["total"].as_u64())
}

/// Sends a positioned request and reads its answer: the range it got, checked
/// against `expected`, or the `not_found` error naming the subscription.
async fn send_positioned(client: &mut Client, sub: &mut Sub, message: Value, expected: Option<(usize, usize, bool)>) {
    let (n_frames, n_diffs) = (client.frames.len(), client.diffs_seen.len());
    client.send(message.clone()).await;
    let id = sub.id.clone();
    let answered = client
        .read_until(SETTLE, |client| {
            client.frames[n_frames..].iter().any(|frame| frame["type"] == "error" && frame["sub"] == id.as_str())
                || client.diffs_seen[n_diffs..]
                    .iter()
                    .any(|frame| frame["sub"] == id.as_str() && frame.get("offset").is_some())
        })
        .await;
    assert!(answered, "no answer to {message}");
    match expected {
        None => {
            let error = client.frames[n_frames..].iter().find(|frame| frame["type"] == "error").expect("an error");
            assert_eq!(error["code"], "not_found", "{message}: {error}");
            assert_eq!(error["sub"], sub.id.as_str());
        }
        Some((offset, limit, is_tail)) => {
            let frame = client.diffs_seen[n_diffs..]
                .iter()
                .find(|frame| frame["sub"] == id.as_str() && frame.get("offset").is_some())
                .unwrap();
            assert_eq!(
                (frame["offset"].as_u64().unwrap() as usize, frame["limit"].as_u64().unwrap() as usize),
                (offset, limit),
                "{message}: the answer's range"
            );
            (sub.offset, sub.limit, sub.is_tail) = (offset, limit, is_tail);
        }
    }
}

/// Waits until every frame the server sent this client before now has arrived:
/// a throwaway subscription's first frame comes after them (one writer, one queue).
async fn barrier(client: &mut Client, name: &str) {
    client.send(json!({"op": "subscribe", "sub": name, "collection": "rooms", "limit": 0})).await;
    let arrived = client.read_until(SETTLE, |client| client.lists.contains_key(name)).await;
    assert!(arrived, "barrier {name}");
    client.send(json!({"op": "unsubscribe", "sub": name})).await;
    let gone = client
        .read_until(SETTLE, |client| {
            client.frames.iter().any(|frame| frame["type"] == "unsubscribed" && frame["sub"] == name)
        })
        .await;
    assert!(gone, "barrier {name} unsubscribed");
    client.lists.remove(name);
}

/// Checks every subscription against queries. `since` indexes `diffs_seen` at the
/// start of the step: the frames after it all reflect the data as it is now (one
/// write per step, then the barrier), so a subscription that got one must know
/// the current total.
async fn settle(client: &mut Client, server: &Server, subs: &[Sub], since: usize, context: &str) {
    barrier(client, &format!("barrier-{context}")).await;
    for sub in subs {
        let (view, total) = full_view(server, &sub.filter);
        let offset = if sub.is_tail { view.len().saturating_sub(sub.limit) } else { sub.offset };
        let expected: Vec<String> = view.iter().skip(offset).take(sub.limit).cloned().collect();
        let id = sub.id.clone();
        let got: Vec<String> = client
            .lists
            .get(&id)
            .map_or(Vec::new(), |list| list.items.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect());
        assert_eq!(got, expected, "{context}: {} (offset {offset}, limit {}, tail {})", sub.id, sub.limit, sub.is_tail);
        if client.diffs_seen[since..].iter().any(|frame| frame["sub"] == id.as_str()) {
            assert_eq!(last_total(client, &id), Some(total), "{context}: {}'s total", sub.id);
        }
        // A tail window's query agrees.
        if sub.is_tail {
            let body = json!({"filter": sub.filter, "sort": serde_json::from_str::<Value>(SORT).unwrap(), "tail": true, "limit": sub.limit});
            let answer = server.ok("POST", "/v1/collections/rooms/query", body);
            let queried: Vec<&str> =
                answer["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap()).collect();
            assert_eq!(queried, expected, "{context}: tail query");
            assert_eq!(answer["offset"].as_u64().unwrap() as usize, offset, "{context}: tail query offset");
            assert_eq!(answer["total"].as_u64().unwrap(), total);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anchored_and_tail_windows_follow_random_writes_and_totals_match_queries() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let mut rng = Rng::new(15);
    let ops: Vec<Value> = (0..40).map(|_| random_op(&mut rng)).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let mut client = server.connect().await;
    let mut subs: Vec<Sub> = Vec::new();
    for n in 0..6 {
        let filter: Value = serde_json::from_str(FILTERS[n % 2]).unwrap();
        let limit = 1 + rng.below(6) as usize;
        let (view, _) = full_view(&server, &filter);
        let (position, expected) = random_anchor(&mut rng, &view, limit);
        let mut message = json!({"op": "subscribe", "sub": format!("s{n}"), "collection": "rooms",
            "filter": filter, "sort": serde_json::from_str::<Value>(SORT).unwrap(), "limit": limit});
        message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        let mut sub = Sub { id: format!("s{n}"), filter, offset: 0, limit, is_tail: false };
        send_positioned(&mut client, &mut sub, message, expected).await;
        if expected.is_some() {
            subs.push(sub);
        }
    }
    // At least one tail window, always.
    let mut tail = Sub { id: "tail".into(), filter: Value::Null, offset: 0, limit: 4, is_tail: false };
    let (view, _) = full_view(&server, &Value::Null);
    let message = json!({"op": "subscribe", "sub": "tail", "collection": "rooms", "sort": serde_json::from_str::<Value>(SORT).unwrap(), "tail": true, "limit": 4});
    send_positioned(&mut client, &mut tail, message, Some((view.len().saturating_sub(4), 4, true))).await;
    subs.push(tail);
    settle(&mut client, &server, &subs, 0, "after subscribing").await;
    let mut n_moves = 0;
    let mut n_total_checks = 0;
    for step in 0..80 {
        let since = client.diffs_seen.len();
        let ops: Vec<Value> = (0..1 + rng.below(3)).map(|_| random_op(&mut rng)).collect();
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
        if rng.chance(25) {
            let index = rng.below(subs.len() as u64) as usize;
            let limit = if rng.chance(50) { subs[index].limit } else { 1 + rng.below(6) as usize };
            // The window must be up to date before the anchor is computed from a query.
            settle(&mut client, &server, &subs, since, &format!("step {step}, before a move")).await;
            let (view, _) = full_view(&server, &subs[index].filter);
            let (position, expected) = random_anchor(&mut rng, &view, limit);
            let mut message = json!({"op": "set_range", "sub": subs[index].id, "limit": limit});
            message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
            send_positioned(&mut client, &mut subs[index], message, expected).await;
            n_moves += 1;
        }
        settle(&mut client, &server, &subs, since, &format!("step {step}")).await;
        n_total_checks += subs
            .iter()
            .filter(|sub| client.diffs_seen[since..].iter().any(|frame| frame["sub"] == sub.id.as_str()))
            .count();
    }
    assert!(n_moves > 10 && n_total_checks > 40, "{n_moves} moves, {n_total_checks} totals checked");
    // Every frame that starts with a Reset carries the total.
    for frame in &client.diffs_seen {
        let first = frame["diffs"].as_array().unwrap().first().cloned();
        if first.as_ref().and_then(|diff| diff.get("Reset")).is_some() {
            assert!(frame.get("total").is_some(), "a Reset frame without total: {frame}");
        }
    }
    assert!(
        client.frames.iter().all(|frame| frame["type"] != "error" || frame["code"] == "not_found"),
        "{:?}",
        client.frames
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_comes_on_resets_and_when_the_length_changed_per_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> =
        (0..5).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": n * 10}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sort: Value = serde_json::from_str(SORT).unwrap();
    let subscribe = |sub: &str| json!({"op": "subscribe", "sub": sub, "collection": "rooms", "sort": sort, "limit": 3});
    let mut first = server.connect().await;
    first.send(subscribe("a")).await;
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 1).await);
    assert_eq!(first.diffs_seen[0]["total"], 5, "{}", first.diffs_seen[0]);
    // A move inside the window: the length did not change, no total.
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": room_id(3), "fields": {"recency": 45}}]}),
    );
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 2).await);
    assert!(first.diffs_seen[1].get("total").is_none(), "{}", first.diffs_seen[1]);
    // A second subscriber of the same (shared) window gets its own total on its Reset.
    let mut second = server.connect().await;
    second.send(subscribe("b")).await;
    assert!(second.read_until(SETTLE, |client| client.diffs_seen.len() == 1).await);
    assert_eq!(second.diffs_seen[0]["total"], 5);
    // A new row at the top: the length changed, both are told.
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": room_id(9), "fields": {"recency": 99}}]}),
    );
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 3).await);
    assert!(second.read_until(SETTLE, |client| client.diffs_seen.len() == 2).await);
    assert_eq!(first.diffs_seen[2]["total"], 6);
    assert_eq!(second.diffs_seen[1]["total"], 6);
    // Rows removed below the window change nothing the window shows: no frame; the
    // next frame then carries the length as it is by then.
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [{"op": "remove", "id": room_id(0)}]}));
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": room_id(2), "fields": {"recency": 98}}]}),
    );
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 4).await);
    assert_eq!(first.diffs_seen[3]["total"], 5, "{}", first.diffs_seen[3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_paging_with_after_does_not_shift_when_rows_arrive_above() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> =
        (0..20).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": 100 + n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sort: Value = serde_json::from_str(SORT).unwrap();
    let page = |position: Value| {
        let mut body = json!({"sort": sort, "limit": 5});
        body.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        let answer = server.ok("POST", "/v1/collections/rooms/query", body);
        let ids: Vec<String> =
            answer["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect();
        (ids, answer["offset"].as_u64().unwrap())
    };
    let (first, _) = page(json!({"offset": 0}));
    assert_eq!(first, (15..20).rev().map(room_id).collect::<Vec<_>>());
    // Three rooms arrive above the first page.
    let ops: Vec<Value> =
        (20..23).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": 500 + n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let (second, offset) = page(json!({"after": first.last().unwrap()}));
    assert_eq!(second, (10..15).rev().map(room_id).collect::<Vec<_>>(), "the next page, not shifted");
    assert_eq!(offset, 8, "three new rows above, five of the first page");
    // An offset page would have repeated three rooms of the first page.
    let (by_offset, _) = page(json!({"offset": 5}));
    assert_eq!(&by_offset[..3], &first[2..]);
    // And back: `before` the second page's first row is the first page again.
    let (back, offset) = page(json!({"before": second[0]}));
    assert_eq!((back, offset), (first.clone(), 3));
    // Near the top, `before` gives only the rows there are.
    let (top, offset) = page(json!({"before": room_id(21)}));
    assert_eq!((top, offset), (vec![room_id(22)], 0));
    // After the last row: an empty page, not the last rows again.
    let (end, _) = page(json!({"after": room_id(0)}));
    assert!(end.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_positions_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "!a", "fields": {"recency": 1}}]}),
    );
    let mut client = server.connect().await;
    let cases = [
        (json!({"offset": 1, "tail": true}), "bad_request"),
        (json!({"after": "!a", "before": "!a"}), "bad_request"),
        (json!({"around": {"id": "!a", "row": 3}}), "bad_request"),
        (json!({"around": {"id": "!a", "row": 2, "extra": 1}}), "bad_request"),
        (json!({"after": "x".repeat(ordo_core::limits::MAX_ID_BYTES + 1)}), "limit_exceeded"),
        (json!({"after": "!missing"}), "not_found"),
    ];
    for (n, (position, code)) in cases.iter().enumerate() {
        let mut message = json!({"op": "subscribe", "sub": format!("s{n}"), "collection": "rooms", "limit": 3});
        message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        client.send(message).await;
        let error = client.expect_error().await;
        assert_eq!(error["code"], *code, "{position}: {error}");
        if !error["message"].as_str().unwrap().contains("unknown field") {
            assert_eq!(error["sub"], format!("s{n}"), "{error}");
        }
        let (status, body) = server.http(
            "POST",
            "/v1/collections/rooms/query",
            Some(&{
                let mut body = json!({"limit": 3});
                body.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
                body
            }),
        );
        assert_eq!(body["error"]["code"], *code, "query {position}: {status} {body}");
    }
    // At the edge: an id of the longest length is looked for (and not found).
    let mut message = json!({"op": "subscribe", "sub": "edge", "collection": "rooms", "limit": 3});
    message["before"] = json!("x".repeat(ordo_core::limits::MAX_ID_BYTES));
    client.send(message).await;
    assert_eq!(client.expect_error().await["code"], "not_found");
    // `tail: false` is no position at all: offset 0.
    client
        .send(json!({"op": "subscribe", "sub": "t", "collection": "rooms", "limit": 3, "tail": false, "offset": 0}))
        .await;
    assert!(client.read_until(SETTLE, |client| client.lists.get("t").is_some_and(|list| list.items.len() == 1)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_outside_the_callers_rule_reads_exactly_as_a_missing_id() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    let rules = json!({"rules": [
        {"collection": "docs", "roles": ["reader"], "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}},
    ]});
    server.ok("PUT", "/v1/rules", rules);
    server.ok(
        "PUT",
        "/v1/collections/docs",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "score", "type": "i64"}]}),
    );
    let ops = json!({"ops": [
        {"op": "upsert", "id": "mine", "fields": {"owner": "alice", "score": 1}},
        {"op": "upsert", "id": "theirs", "fields": {"owner": "bob", "score": 2}},
    ]});
    server.ok("POST", "/v1/collections/docs/batch", ops);
    let alice = mint(&secret, "alice", "reader", &[]);
    let mut client = server.connect_as(Some(&alice)).await;
    let anchors = |id: &str| vec![json!({"after": id}), json!({"before": id}), json!({"around": {"id": id, "row": 0}})];
    // What each request answers for bob's item, which exists but is outside alice's rule...
    let mut hidden = Vec::new();
    let mut hidden_http = Vec::new();
    for (n, position) in anchors("theirs").into_iter().enumerate() {
        let mut message = json!({"op": "subscribe", "sub": format!("h{n}"), "collection": "docs", "limit": 2});
        message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        client.send(message).await;
        let mut error = client.expect_error().await;
        error["sub"] = Value::Null;
        hidden.push(error);
        let mut body = json!({"limit": 2});
        body.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        hidden_http.push(server.http_as(Some(&alice), "POST", "/v1/collections/docs/query", Some(&body)));
    }
    // ...and a set_range onto it, from a window alice may have.
    client.send(json!({"op": "subscribe", "sub": "w", "collection": "docs", "limit": 2})).await;
    assert!(client.read_until(SETTLE, |client| client.lists.contains_key("w")).await);
    client.send(json!({"op": "set_range", "sub": "w", "after": "theirs", "limit": 2})).await;
    let hidden_set_range = client.expect_error().await;
    // Then the same with the item gone: the answers must not differ in any byte.
    server.ok("POST", "/v1/collections/docs/batch", json!({"ops": [{"op": "remove", "id": "theirs"}]}));
    for (n, position) in anchors("theirs").into_iter().enumerate() {
        let mut message = json!({"op": "subscribe", "sub": format!("m{n}"), "collection": "docs", "limit": 2});
        message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        client.send(message).await;
        let mut error = client.expect_error().await;
        error["sub"] = Value::Null;
        assert_eq!(error, hidden[n], "subscribe {position}");
        assert_eq!(error["code"], "not_found");
        let mut body = json!({"limit": 2});
        body.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        let missing = server.http_as(Some(&alice), "POST", "/v1/collections/docs/query", Some(&body));
        assert_eq!(missing, hidden_http[n], "query {position}");
    }
    client.send(json!({"op": "set_range", "sub": "w", "after": "theirs", "limit": 2})).await;
    assert_eq!(client.expect_error().await, hidden_set_range);
    // Alice's own item anchors fine.
    client.send(json!({"op": "set_range", "sub": "w", "after": "mine", "limit": 2})).await;
    let n_diffs = client.diffs_seen.len();
    assert!(client.read_until(SETTLE, |client| last_diffs_frame(client, "w", n_diffs).is_some()).await);
    assert_eq!(last_diffs_frame(&client, "w", n_diffs).unwrap()["offset"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_subscription_resumes_as_a_tail_and_replays_its_totals() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> =
        (0..10).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": 100 + n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sort: Value = serde_json::from_str(SORT).unwrap();
    let sub = json!({"sub": "end", "collection": "rooms", "sort": sort, "tail": true, "limit": 3});
    let mut client = server.connect().await;
    let mut subscribe = sub.clone();
    subscribe["op"] = json!("subscribe");
    client.send(subscribe).await;
    assert!(client.read_until(SETTLE, |client| client.lists.contains_key("end")).await);
    assert_eq!((client.diffs_seen[0]["offset"].as_u64(), client.diffs_seen[0]["total"].as_u64()), (Some(7), Some(10)));
    let applied = client.lists["end"].clone();
    let session = client.session.clone();
    drop(client);
    // Rows join the end (the oldest sort last) and one leaves: the tail slides.
    for n in 10..13 {
        let op = json!({"op": "upsert", "id": room_id(n), "fields": {"recency": n}});
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [op]}));
    }
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [{"op": "remove", "id": room_id(11)}]}));
    let mut client = server.connect().await;
    client.lists.insert("end".into(), applied.clone());
    let mut entry = sub.clone();
    entry["last_seq"] = json!(applied.seq);
    client.send(json!({"op": "resume", "session": session, "subs": [entry]})).await;
    let resumed = client.read_until(SETTLE, |client| client.lists["end"].seq == applied.seq + 4).await;
    assert!(resumed, "four frames replayed: {:?} {:?}", client.frames, client.diffs_seen);
    let outcome = client.frames.iter().find(|frame| frame["type"] == "resumed").unwrap();
    assert!(outcome["subs"][0]["replayed"].is_u64(), "{outcome}");
    let ids: Vec<&str> = client.lists["end"].items.iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [room_id(0), room_id(12), room_id(10)], "recency 100, 12, 10");
    // Each replayed frame carries the total as it was sent: 11, 12, 13, 12.
    let totals: Vec<Option<u64>> = client.diffs_seen.iter().map(|frame| frame["total"].as_u64()).collect();
    assert_eq!(totals, [Some(11), Some(12), Some(13), Some(12)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_tail_window_tells_each_subscriber_where_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let ops: Vec<Value> =
        (0..6).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": 100 + n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sort: Value = serde_json::from_str(SORT).unwrap();
    let subscribe = |sub: &str| json!({"op": "subscribe", "sub": sub, "collection": "rooms", "sort": sort, "tail": true, "limit": 2});
    let mut first = server.connect().await;
    first.send(subscribe("a")).await;
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 1).await);
    assert_eq!(first.diffs_seen[0]["offset"], 4);
    // Rows join the end: the shared window slides to offset 7.
    let ops: Vec<Value> = (6..9).map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": n}})).collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    assert!(first.read_until(SETTLE, |client| client.diffs_seen.len() == 2).await);
    let mut second = server.connect().await;
    second.send(subscribe("b")).await;
    assert!(second.read_until(SETTLE, |client| client.diffs_seen.len() == 1).await);
    assert_eq!((second.diffs_seen[0]["offset"].as_u64(), second.diffs_seen[0]["total"].as_u64()), (Some(7), Some(9)));
    // One of them moves by key: the other keeps following the end.
    second.send(json!({"op": "set_range", "sub": "b", "after": room_id(5), "limit": 2})).await;
    assert!(second.read_until(SETTLE, |client| client.diffs_seen.len() == 2).await);
    assert_eq!(second.diffs_seen[1]["offset"], 1);
    let ids = |client: &Client, sub: &str| -> Vec<String> {
        client.lists[sub].items.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&second, "b"), [room_id(4), room_id(3)]);
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": room_id(9), "fields": {"recency": 1}}]}),
    );
    assert!(
        first.read_until(SETTLE, |client| ids(client, "a") == [room_id(6), room_id(9)]).await,
        "{:?}",
        ids(&first, "a")
    );
    assert_eq!(ids(&second, "b"), [room_id(4), room_id(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_held_up_by_a_slow_connection_still_says_where_the_window_landed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--outbound-buffer", "65536"]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let filler = "x".repeat(2_000);
    let ops: Vec<Value> = (0..300)
        .map(|n| json!({"op": "upsert", "id": room_id(n), "fields": {"recency": n}, "payload": {"text": filler}}))
        .collect();
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    let sort: Value = serde_json::from_str(SORT).unwrap();
    let mut slow = server.connect().await;
    slow.send(json!({"op": "subscribe", "sub": "all", "collection": "rooms", "sort": sort, "limit": 300})).await;
    slow.send(json!({"op": "subscribe", "sub": "b", "collection": "rooms", "sort": sort, "limit": 5})).await;
    assert!(slow.read_until(SETTLE, |client| client.lists.contains_key("b")).await);
    // It stops reading while whole-window changes pile up past its budget...
    let mut recency = 1_000;
    for _ in 0..60 {
        let ops: Vec<Value> = (0..50)
            .map(|n| {
                recency += 1;
                json!({"op": "upsert", "id": room_id((recency * 7 + n) % 300), "fields": {"recency": recency}})
            })
            .collect();
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
    }
    // ...and asks to move `b` by key meanwhile.
    let (view, _) = full_view(&server, &Value::Null);
    let rank = view.iter().position(|id| *id == room_id(100)).unwrap();
    slow.send(json!({"op": "set_range", "sub": "b", "after": room_id(100), "limit": 5})).await;
    let n_diffs = slow.diffs_seen.len();
    let answered = slow
        .read_until(SETTLE, |client| {
            client.diffs_seen[n_diffs..].iter().any(|frame| frame["sub"] == "b" && frame.get("offset").is_some())
        })
        .await;
    assert!(answered, "no frame of `b` said where it landed");
    let answer = slow.diffs_seen[n_diffs..].iter().find(|frame| frame["sub"] == "b" && frame.get("offset").is_some());
    assert_eq!(answer.unwrap()["offset"].as_u64(), Some(rank as u64 + 1));
    let expected: Vec<String> = view[rank + 1..rank + 6].to_vec();
    let ids = |client: &Client| -> Vec<String> {
        client.lists["b"].items.iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect()
    };
    assert!(slow.read_until(SETTLE, |client| ids(client) == expected).await, "{:?}", ids(&slow));
    eprintln!("slow resets: {}", server.metric("ordo_resets_slow_total"));
}
