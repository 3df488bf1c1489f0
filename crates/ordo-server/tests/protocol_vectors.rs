//! The language-neutral protocol corpus (`protocol/vectors/*.json`, format in
//! `protocol/README.md`): frames recorded from a real server on loopback, each
//! with the lists a client must hold after it, checked here against one-shot
//! queries; plus a few hand-built cases (diff kinds the server does not emit
//! today, broken sequences). Every client library runs the corpus.
//!
//! `ORDO_WRITE_VECTORS=1` writes the files; without it the corpus is
//! regenerated in memory and compared with the files, so it cannot drift from
//! what the server sends.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{apply_frame, Client, LocalList, Rng, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);
/// After the last action of a case: how long no frame may arrive before it ends.
const QUIET: Duration = Duration::from_millis(300);

fn schema() -> Value {
    json!({"fields": [
        {"name": "name", "type": "string"},
        {"name": "recency", "type": "u64"},
        {"name": "unread", "type": "u64"},
        {"name": "dm", "type": "bool"},
    ]})
}

struct Case {
    name: &'static str,
    description: &'static str,
    synthetic: bool,
    subscriptions: BTreeMap<String, LocalList>,
    steps: Vec<Value>,
}

impl Case {
    fn to_json(&self) -> Value {
        let subscriptions: serde_json::Map<String, Value> = self
            .subscriptions
            .iter()
            .map(|(sub, list)| (sub.clone(), json!({"items": list.items, "seq": list.seq})))
            .collect();
        json!({
            "protocol": 1,
            "name": self.name,
            "description": self.description,
            "synthetic": self.synthetic,
            "subscriptions": subscriptions,
            "steps": self.steps,
        })
    }
}

/// `totals`: the last `total` each subscription got in a frame it applied
/// (absent: none yet, written as `null`).
fn expectation(lists: &BTreeMap<String, LocalList>, totals: &BTreeMap<String, u64>, event: Option<Value>) -> Value {
    let items: serde_json::Map<String, Value> =
        lists.iter().map(|(sub, list)| (sub.clone(), Value::Array(list.items.clone()))).collect();
    let seqs: serde_json::Map<String, Value> = lists.iter().map(|(sub, list)| (sub.clone(), json!(list.seq))).collect();
    let totals: serde_json::Map<String, Value> =
        lists.keys().map(|sub| (sub.clone(), totals.get(sub).map_or(Value::Null, |total| json!(total)))).collect();
    let mut expect = json!({"lists": items, "seqs": seqs, "totals": totals});
    if let Some(event) = event {
        expect["event"] = event;
    }
    expect
}

/// A WebSocket client that records every frame it gets, with what it holds after it.
struct Recorder {
    client: Client,
    steps: Vec<Value>,
    /// Session ids are random: the corpus names them `session-1`, `session-2`, ...
    sessions: BTreeMap<String, String>,
    /// Requests sent, for their ids (`req`).
    n_requests: u64,
    /// The last `total` each subscription got (frames without one leave it as it was).
    totals: BTreeMap<String, u64>,
}

impl Recorder {
    /// Connects holding `lists` (what the client had before: nothing, fresh
    /// subscriptions it is about to make, or the lists of a dropped connection).
    async fn connect(
        server: &Server,
        sessions: BTreeMap<String, String>,
        lists: BTreeMap<String, LocalList>,
    ) -> Recorder {
        let mut client = server.connect().await;
        client.lists = lists;
        let mut recorder = Recorder { client, steps: Vec::new(), sessions, n_requests: 0, totals: BTreeMap::new() };
        // `connect` read the welcome already; record it as the first step.
        let welcome = recorder.client.frames.pop().expect("the welcome frame");
        recorder.record(welcome);
        recorder
    }

    fn session_name(&mut self, session: &str) -> String {
        let n = self.sessions.len() + 1;
        self.sessions.entry(session.to_owned()).or_insert_with(|| format!("session-{n}")).clone()
    }

    /// Records a frame the client has already handled (`next_json` applies diffs).
    fn record(&mut self, mut frame: Value) {
        let event = match frame["type"].as_str() {
            Some("welcome") => {
                let name = self.session_name(frame["session"].as_str().unwrap());
                frame["session"] = json!(name);
                Some(json!({"kind": "welcome", "session": name}))
            }
            Some("error") => {
                let mut event = json!({"kind": "error", "code": frame["code"]});
                if let Some(sub) = frame.get("sub") {
                    event["sub"] = sub.clone();
                }
                Some(event)
            }
            Some("unsubscribed") => {
                self.client.lists.remove(frame["sub"].as_str().unwrap());
                self.totals.remove(frame["sub"].as_str().unwrap());
                Some(json!({"kind": "unsubscribed", "sub": frame["sub"]}))
            }
            // The server ended the subscription: gone as after `unsubscribed`, its id free.
            Some("ended") => {
                self.client.lists.remove(frame["sub"].as_str().unwrap());
                self.totals.remove(frame["sub"].as_str().unwrap());
                Some(json!({"kind": "ended", "sub": frame["sub"], "reason": frame["reason"]}))
            }
            Some("resumed") => {
                let name = self.session_name(frame["session"].as_str().unwrap());
                frame["session"] = json!(name);
                let subs = frame["subs"].as_array().unwrap();
                let pick = |key: &str| -> Vec<Value> {
                    subs.iter().filter(|entry| entry.get(key).is_some()).map(|entry| entry["sub"].clone()).collect()
                };
                Some(json!({"kind": "resumed", "replayed": pick("replayed"), "reset": pick("reset")}))
            }
            // Changes no list and reports nothing: the request took effect without a frame.
            Some("ack") => None,
            Some("diffs") => {
                if let Some(total) = frame.get("total") {
                    self.totals.insert(frame["sub"].as_str().unwrap().to_owned(), total.as_u64().unwrap());
                }
                let has_reset = frame["diffs"].as_array().unwrap().iter().any(|diff| diff.get("Reset").is_some());
                has_reset.then(|| json!({"kind": "reset", "sub": frame["sub"]}))
            }
            other => panic!("unexpected frame type {other:?}: {frame}"),
        };
        let expect = expectation(&self.client.lists, &self.totals, event);
        self.steps.push(json!({"frame": frame, "expect": expect}));
    }

    async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let frame = self.client.next_json(timeout).await?;
        if frame["type"] != "diffs" {
            self.client.frames.pop();
        }
        self.record(frame.clone());
        Some(frame)
    }

    /// Sends `message` with the next request id and records frames until the one
    /// that answers it (every request has exactly one answer): so the corpus does
    /// not depend on whether a write's HTTP request overtakes a WebSocket request.
    async fn request(&mut self, mut message: Value) -> Value {
        self.n_requests += 1;
        let req = format!("{}-{}", message["op"].as_str().unwrap_or("message"), self.n_requests);
        message["req"] = json!(req);
        self.client.send(message).await;
        loop {
            let frame = self.next(SETTLE).await.unwrap_or_else(|| panic!("no answer to request {req}"));
            if frame["req"] == req {
                return frame;
            }
        }
    }

    /// Sends `message` as it is (without a request id).
    async fn send(&mut self, message: Value) {
        self.client.send(message).await;
    }

    /// Reads frames until every subscription in `views` equals a one-shot query.
    async fn settle(&mut self, server: &Server, views: &[Value], context: &str) {
        for view in views {
            let sub = view["sub"].as_str().unwrap().to_owned();
            let expected = query(server, view);
            let deadline = tokio::time::Instant::now() + SETTLE;
            while self.client.lists.get(&sub).is_none_or(|list| list.items != expected) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() || self.next(left).await.is_none() {
                    let got = self.client.lists.get(&sub).map(|list| list.items.clone());
                    panic!("{context}: {sub} {view}\n got      {got:?}\n expected {expected:?}");
                }
            }
        }
    }

    /// Reads frames until one of type `kind` arrives.
    async fn until_frame(&mut self, kind: &str) -> Value {
        loop {
            let frame = self.next(SETTLE).await.unwrap_or_else(|| panic!("no `{kind}` frame came"));
            if frame["type"] == kind {
                return frame;
            }
        }
    }

    /// Records what still arrives until the connection has been quiet for `QUIET`.
    async fn drain(&mut self) {
        while self.next(QUIET).await.is_some() {}
    }
}

/// Lists of subscriptions about to be made: empty, nothing applied yet.
fn fresh(subs: &[&str]) -> BTreeMap<String, LocalList> {
    subs.iter().map(|sub| (sub.to_string(), LocalList::default())).collect()
}

fn query(server: &Server, view: &Value) -> Vec<Value> {
    let mut body = json!({"filter": view["filter"], "sort": view["sort"], "limit": view["limit"]});
    if view.get("tail").is_some_and(|tail| tail == true) {
        body["tail"] = json!(true);
    } else {
        body["offset"] = view["offset"].clone();
    }
    if let Some(fields) = view.get("fields") {
        body["fields"] = fields.clone();
    }
    if let Some(payload) = view.get("payload") {
        body["payload"] = payload.clone();
    }
    let answer = server.ok("POST", "/v1/collections/rooms/query", body);
    common::without_versions(&answer["items"])
}

fn write(server: &Server, ops: Value) {
    server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": ops}));
}

fn room(n: u64, name: &str, recency: u64, unread: u64, dm: bool) -> Value {
    json!({"op": "upsert", "id": format!("!r{n:02}:example.org"), "fields": {
        "name": name, "recency": recency, "unread": unread, "dm": dm,
    }, "payload": {"last": format!("message {recency}")}})
}

fn random_op(rng: &mut Rng, n_ids: u64) -> Value {
    let id = format!("!r{:02}:example.org", rng.below(n_ids));
    if rng.chance(12) {
        return json!({"op": "remove", "id": id});
    }
    let mut fields = serde_json::Map::new();
    if rng.chance(70) {
        fields.insert("recency".into(), json!(rng.below(1_000)));
    }
    if rng.chance(40) {
        fields.insert("unread".into(), json!(rng.below(4)));
    }
    if rng.chance(25) {
        fields.insert("dm".into(), json!(rng.chance(50)));
    }
    if rng.chance(30) {
        let names = ["alice", "Bob", "Chloé", "Émile", "émile", "zoë", "Łucja", "東京", "ab", "Abby"];
        fields.insert("name".into(), json!(names[rng.below(names.len() as u64) as usize]));
    }
    let mut op = json!({"op": "upsert", "id": id, "fields": fields});
    if rng.chance(25) {
        op["payload"] = json!({"last": format!("message {}", rng.below(100))});
    }
    op
}

fn random_filter(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => Value::Null,
        1 => json!({"field": "unread", "op": "gt", "value": 0}),
        2 => json!({"field": "dm", "op": "eq", "value": true}),
        3 => json!({"field": "name", "contains": "É"}),
        _ => json!({"any": [{"field": "dm", "op": "eq", "value": true}, {"field": "unread", "op": "ge", "value": 2}]}),
    }
}

fn random_sort(rng: &mut Rng) -> Value {
    match rng.below(3) {
        0 => json!([{"field": "recency", "dir": "desc"}]),
        1 => json!([{"field": "name", "dir": "asc", "case_insensitive": true}]),
        _ => json!([{"field": "unread", "dir": "desc"}, {"field": "recency", "dir": "desc"}]),
    }
}

/// A fresh collection with `n` rooms.
fn reset_rooms(server: &Server, n: u64) {
    let existing = query(server, &json!({"filter": null, "sort": [], "offset": 0, "limit": 1000}));
    let removes: Vec<Value> = existing.iter().map(|item| json!({"op": "remove", "id": item["id"]})).collect();
    if !removes.is_empty() {
        write(server, Value::Array(removes));
    }
    let names = ["alice", "Bob", "Chloé", "Dmitri", "Émile", "zoë", "Łucja", "東京"];
    let ops: Vec<Value> =
        (0..n).map(|i| room(i, names[(i % 8) as usize], 100 + i * 7 % 50, i % 3, i % 4 == 0)).collect();
    if !ops.is_empty() {
        write(server, Value::Array(ops));
    }
}

fn subscribe(sub: &str, filter: Value, sort: Value, offset: u64, limit: u64) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "rooms", "filter": filter, "sort": sort,
           "offset": offset, "limit": limit})
}

async fn live_diffs(server: &Server) -> Case {
    reset_rooms(server, 8);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["top"])).await;
    let view = subscribe("top", Value::Null, json!([{"field": "recency", "dir": "desc"}]), 0, 5);
    let initial = recorder.client.lists.clone();
    recorder.request(view.clone()).await;
    recorder.settle(server, std::slice::from_ref(&view), "subscribed").await;
    // Each write below makes one kind of change to the window.
    let writes = [
        json!([room(20, "Newcomer", 900, 1, false)]), // enters at the top
        json!([{"op": "upsert", "id": "!r03:example.org", "fields": {"recency": 950}}]), // moves up
        json!([{"op": "upsert", "id": "!r20:example.org", "fields": {"unread": 5}}]), // changes in place
        json!([{"op": "remove", "id": "!r03:example.org"}]), // leaves; the next one comes in
        json!([{"op": "upsert", "id": "!r20:example.org", "fields": {"recency": 1}}]), // drops out
        json!([
            room(21, "a", 990, 0, true),
            room(22, "b", 980, 0, true),
            room(23, "c", 970, 0, true),
            room(24, "d", 960, 0, true),
            room(25, "e", 955, 0, true)
        ]), // replaces the whole window
    ];
    for ops in writes {
        write(server, ops);
        recorder.settle(server, std::slice::from_ref(&view), "after a write").await;
    }
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..20 {
        let ops: Vec<Value> = (0..1 + rng.below(3)).map(|_| random_op(&mut rng, 26)).collect();
        write(server, Value::Array(ops));
        recorder.settle(server, std::slice::from_ref(&view), "after a random write").await;
    }
    recorder.drain().await;
    Case {
        name: "live_diffs",
        description: "One subscription, top 5 by recency: its first Reset, then the diffs of single writes \
                      (an item enters, moves, changes in place, leaves, drops out, a batch replaces the window) \
                      and of 20 random batches.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

async fn window_changes(server: &Server) -> Case {
    reset_rooms(server, 12);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["list"])).await;
    let initial = recorder.client.lists.clone();
    let mut view = subscribe("list", Value::Null, json!([{"field": "recency", "dir": "desc"}]), 0, 3);
    recorder.request(view.clone()).await;
    recorder.settle(server, std::slice::from_ref(&view), "subscribed").await;
    let ranges = [(0, 6), (0, 2), (1, 3), (0, 3), (4, 4), (2, 10), (0, 12), (20, 5), (0, 5)];
    for (offset, limit) in ranges {
        view["offset"] = json!(offset);
        view["limit"] = json!(limit);
        recorder.request(json!({"op": "set_range", "sub": "list", "offset": offset, "limit": limit})).await;
        recorder.settle(server, std::slice::from_ref(&view), "after set_range").await;
        write(
            server,
            json!([{"op": "upsert", "id": format!("!r{:02}:example.org", offset + 1), "fields": {"recency": 500 + offset}}]),
        );
        recorder.settle(server, std::slice::from_ref(&view), "after a write").await;
    }
    let views = [
        (json!({"field": "unread", "op": "gt", "value": 0}), json!([{"field": "recency", "dir": "desc"}])),
        (
            json!({"field": "unread", "op": "gt", "value": 0}),
            json!([{"field": "name", "dir": "asc", "case_insensitive": true}]),
        ),
        (json!({"field": "name", "contains": "É"}), json!([{"field": "name", "dir": "asc", "case_insensitive": true}])),
        (Value::Null, json!([{"field": "unread", "dir": "desc"}, {"field": "recency", "dir": "desc"}])),
    ];
    for (filter, sort) in views {
        view["filter"] = filter.clone();
        view["sort"] = sort.clone();
        recorder.request(json!({"op": "set_view", "sub": "list", "filter": filter, "sort": sort})).await;
        recorder.settle(server, std::slice::from_ref(&view), "after set_view").await;
    }
    recorder.drain().await;
    Case {
        name: "window_changes",
        description: "Load more (Append), shrink (Truncate), scroll (PopFront, PushFront), jump past the end, \
                      and view changes (filter and sort) on one subscription, with a write after each range.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

/// Windows placed by key: each request's answer says where the window landed;
/// from then on the window is checked at that offset (a tail one at the end).
async fn key_windows(server: &Server) -> Case {
    reset_rooms(server, 12);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["list", "end"])).await;
    let initial = recorder.client.lists.clone();
    let sort = json!([{"field": "recency", "dir": "desc"}]);
    let mut list = json!({"sub": "list", "filter": null, "sort": sort, "limit": 4});
    let end = json!({"sub": "end", "filter": null, "sort": sort, "limit": 3, "tail": true});
    /// Reads until the frame answering a key-positioned request, and places `view` where it says.
    async fn placed(recorder: &mut Recorder, view: &mut Value) {
        let sub = view["sub"].clone();
        loop {
            let frame = recorder.next(SETTLE).await.expect("an answer");
            if frame["sub"] == sub && frame.get("offset").is_some() {
                view["offset"] = frame["offset"].clone();
                view["limit"] = frame["limit"].clone();
                return;
            }
        }
    }
    let mut message = json!({"op": "subscribe", "sub": "list", "collection": "rooms", "sort": sort, "limit": 4,
                              "around": {"id": "!r05:example.org", "row": 1}});
    recorder.send(message.clone()).await;
    placed(&mut recorder, &mut list).await;
    recorder
        .send(json!({"op": "subscribe", "sub": "end", "collection": "rooms", "sort": sort, "limit": 3, "tail": true}))
        .await;
    let mut end_placed = end.clone();
    placed(&mut recorder, &mut end_placed).await;
    let views = [list.clone(), end.clone()];
    recorder.settle(server, &views, "subscribed").await;
    let moves = [
        json!({"after": "!r02:example.org"}),
        // The same range again (rows joined the end only): an answer with no diffs.
        json!({"after": "!r02:example.org"}),
        json!({"before": "!r02:example.org"}),
        json!({"around": {"id": "!r09:example.org", "row": 3}}),
    ];
    for (n, position) in moves.into_iter().enumerate() {
        message = json!({"op": "set_range", "sub": "list", "limit": 4});
        message.as_object_mut().unwrap().extend(position.as_object().unwrap().clone());
        recorder.send(message).await;
        placed(&mut recorder, &mut list).await;
        let views = [list.clone(), end.clone()];
        recorder.settle(server, &views, "after a move").await;
        // Rows join the end (the tail slides) or leave it.
        let op = if n % 2 == 0 {
            room(30 + n as u64, "late", n as u64, 0, false)
        } else {
            json!({"op": "remove", "id": format!("!r{}:example.org", 30 + n - 1)})
        };
        write(server, json!([op]));
        recorder.settle(server, &views, "after a write").await;
    }
    recorder.drain().await;
    Case {
        name: "key_windows",
        description: "Windows placed by key: subscribe `around` an item and a `tail` window, then set_range \
                      `after`, `before` (fewer rows near the top), the same range again (answered by a frame with \
                      no diffs) and `around`; every answering frame carries `offset` and `limit`, frames carry \
                      `total` when the view's length changed, and the tail window follows rows joining and \
                      leaving the end.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

async fn random_session(server: &Server, name: &'static str, seed: u64) -> Case {
    reset_rooms(server, 10);
    let mut rng = Rng::new(seed);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["a", "b", "c"])).await;
    let initial = recorder.client.lists.clone();
    let mut views: Vec<Value> = ["a", "b", "c"]
        .iter()
        .map(|sub| subscribe(sub, random_filter(&mut rng), random_sort(&mut rng), rng.below(3), 1 + rng.below(8)))
        .collect();
    // A projection: two fields in the client's order and no payload.
    views[2]["fields"] = json!(["unread", "name"]);
    views[2]["payload"] = json!(false);
    for view in &views {
        recorder.request(view.clone()).await;
    }
    recorder.settle(server, &views, "subscribed").await;
    for _ in 0..30 {
        let ops: Vec<Value> = (0..1 + rng.below(4)).map(|_| random_op(&mut rng, 14)).collect();
        write(server, Value::Array(ops));
        if rng.chance(20) {
            let index = rng.below(3) as usize;
            let (offset, limit) = (rng.below(4), 1 + rng.below(10));
            views[index]["offset"] = json!(offset);
            views[index]["limit"] = json!(limit);
            let sub = views[index]["sub"].clone();
            recorder.request(json!({"op": "set_range", "sub": sub, "offset": offset, "limit": limit})).await;
        } else if rng.chance(10) {
            let index = rng.below(3) as usize;
            let (filter, sort) = (random_filter(&mut rng), random_sort(&mut rng));
            views[index]["filter"] = filter.clone();
            views[index]["sort"] = sort.clone();
            let sub = views[index]["sub"].clone();
            recorder.request(json!({"op": "set_view", "sub": sub, "filter": filter, "sort": sort})).await;
        }
        recorder.settle(server, &views, "after a step").await;
    }
    recorder.drain().await;
    Case {
        name,
        description: "Three subscriptions (one with a projection: two fields, no payload) with random filters, \
                      sorts and windows; random batches of upserts (partial, with non-ASCII names) and removes, \
                      random range and view changes. Frames of different subscriptions interleave.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

async fn errors_and_unsubscribe(server: &Server) -> Case {
    reset_rooms(server, 5);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["ok"])).await;
    let initial = recorder.client.lists.clone();
    let view = subscribe("ok", Value::Null, json!([{"field": "recency", "dir": "desc"}]), 0, 3);
    recorder.request(view.clone()).await;
    recorder.settle(server, std::slice::from_ref(&view), "subscribed").await;
    let bad_messages = [
        // The id is taken: the live subscription is untouched.
        subscribe("ok", Value::Null, json!([]), 0, 3),
        // An unknown sort field: nothing is created.
        subscribe("bad", Value::Null, json!([{"field": "recncy"}]), 0, 3),
        json!({"op": "set_range", "sub": "nope", "offset": 0, "limit": 5}),
        json!({"op": "set_range", "sub": "ok", "offset": 0, "limit": 5000}),
        json!({"op": "set_view", "sub": "ok", "filter": {"field": "unread", "op": "gt", "value": "x"}}),
        json!({"op": "frobnicate", "sub": "ok"}),
    ];
    for message in bad_messages {
        let answer = recorder.request(message).await;
        assert_eq!(answer["type"], "error", "{answer}");
    }
    write(server, json!([room(9, "Late", 999, 0, false)]));
    recorder.settle(server, std::slice::from_ref(&view), "after a write").await;
    let answer = recorder.request(json!({"op": "unsubscribe", "sub": "ok"})).await;
    assert_eq!(answer["type"], "unsubscribed", "{answer}");
    write(server, json!([room(10, "Later", 1000, 0, false)]));
    recorder.drain().await;
    Case {
        name: "errors_and_unsubscribe",
        description: "Error frames (subscription_exists, invalid_view, unknown_subscription, limit_exceeded, \
                      bad_request) leave the live subscription as it was; after `unsubscribed` it is gone and \
                      no frame of it follows.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

async fn requests_and_acks(server: &Server) -> Case {
    reset_rooms(server, 6);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["list", "mine"])).await;
    let initial = recorder.client.lists.clone();
    let mut view = subscribe("list", Value::Null, json!([{"field": "recency", "dir": "desc"}]), 0, 3);
    recorder.request(view.clone()).await;
    recorder.settle(server, std::slice::from_ref(&view), "subscribed").await;
    // Growing the window changes it: the frame of its diffs answers.
    view["limit"] = json!(5);
    let answer = recorder.request(json!({"op": "set_range", "sub": "list", "offset": 0, "limit": 5})).await;
    assert_eq!(answer["type"], "diffs", "{answer}");
    // The same range again, and the same view, change nothing: an `ack` answers,
    // with the request's `req` or, when it had none, without one.
    let same_range = json!({"op": "set_range", "sub": "list", "offset": 0, "limit": 5});
    assert_eq!(recorder.request(same_range.clone()).await["type"], "ack");
    recorder.send(same_range).await;
    recorder.until_frame("ack").await;
    let same_view = json!({"op": "set_view", "sub": "list", "filter": null, "sort": view["sort"]});
    assert_eq!(recorder.request(same_view).await["type"], "ack");
    let answer = recorder.request(json!({"op": "set_range", "sub": "ghost", "offset": 0, "limit": 5})).await;
    assert_eq!(answer["code"], "unknown_subscription", "{answer}");
    // A write's frames answer no request; a subscribe asking for that write
    // (`min_seq`, reached already) gets a first frame that reflects it.
    let ack = server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [room(40, "Mine", 2000, 3, true)]}));
    recorder.settle(server, std::slice::from_ref(&view), "after a write").await;
    let mut mine = subscribe("mine", json!({"field": "dm", "op": "eq", "value": true}), view["sort"].clone(), 0, 2);
    mine["min_seq"] = ack["seq"].clone();
    let answer = recorder.request(mine.clone()).await;
    assert!(answer["write_seq"].as_u64() >= ack["seq"].as_u64(), "{answer}");
    recorder.settle(server, &[view.clone(), mine], "subscribed with min_seq").await;
    let answer = recorder.request(json!({"op": "unsubscribe", "sub": "list"})).await;
    assert_eq!(answer["type"], "unsubscribed", "{answer}");
    recorder.drain().await;
    Case {
        name: "requests_and_acks",
        description: "Request ids (`req`) echoed on the frame that answers each request: the first frame of a \
                      subscribe, the diffs frame of a set_range that changes the window, an `ack` for a set_range \
                      or set_view that changes nothing (with `req`, and without when the request had none), an \
                      error, `unsubscribed`. Frames of writes carry no `req`; every diffs frame carries the \
                      `write_seq` it reflects, and a subscribe with `min_seq` starts at or after that write.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

async fn resume(server: &Server, replay: bool) -> Case {
    reset_rooms(server, 10);
    let mut first = Recorder::connect(server, BTreeMap::new(), fresh(&["top"])).await;
    let view = subscribe("top", Value::Null, json!([{"field": "recency", "dir": "desc"}]), 0, 4);
    first.request(view.clone()).await;
    first.settle(server, std::slice::from_ref(&view), "subscribed").await;
    write(server, json!([room(30, "Before", 700, 0, false)]));
    first.settle(server, std::slice::from_ref(&view), "before the drop").await;
    let session = first.client.session.clone();
    let held = first.client.lists.clone();
    let sessions = first.sessions.clone();
    drop(first);
    // Missed while away.
    write(server, json!([room(31, "Away 1", 800, 1, false)]));
    write(server, json!([{"op": "upsert", "id": "!r30:example.org", "fields": {"recency": 850}}]));
    let mut second = Recorder::connect(server, sessions, held.clone()).await;
    let mut entry = view.clone();
    entry.as_object_mut().unwrap().remove("op");
    entry["last_seq"] = json!(held["top"].seq);
    let resumed_session = if replay { session } else { "0000000000000000".to_owned() };
    second.request(json!({"op": "resume", "session": resumed_session, "subs": [entry]})).await;
    second.settle(server, std::slice::from_ref(&view), "resumed").await;
    write(server, json!([room(32, "After", 900, 0, true)]));
    second.settle(server, std::slice::from_ref(&view), "after the resume").await;
    second.drain().await;
    if replay {
        Case {
            name: "resume_replay",
            description: "A client held `top` at its last seq when its connection dropped; two writes happened \
                          meanwhile. It reconnects (welcome), resumes, and the server replays the missed frames \
                          exactly (seq continues), then live frames follow.",
            synthetic: false,
            subscriptions: held,
            steps: second.steps,
        }
    } else {
        Case {
            name: "resume_reset",
            description: "A resume the server cannot replay (an unknown session, as after a restart): the \
                          subscription restarts with a Reset whose seq is last_seq + 1, then live frames follow.",
            synthetic: false,
            subscriptions: held,
            steps: second.steps,
        }
    }
}

/// Schema changes under live subscriptions. Runs last: it changes `rooms`'
/// fields and drops it.
async fn ended(server: &Server) -> Case {
    reset_rooms(server, 6);
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["all", "pins", "names"])).await;
    let initial = recorder.client.lists.clone();
    let sort = json!([{"field": "recency", "dir": "desc"}]);
    let all = subscribe("all", Value::Null, sort.clone(), 0, 3);
    recorder.request(all.clone()).await;
    recorder.settle(server, std::slice::from_ref(&all), "subscribed").await;
    // A new field: `all` (no `fields` list) gets a Reset with it in every item.
    server.ok("POST", "/v1/collections/rooms/fields", json!({"name": "pinned", "type": "bool", "default": false}));
    recorder.settle(server, std::slice::from_ref(&all), "after a field was added").await;
    let pins = subscribe("pins", json!({"field": "pinned", "op": "eq", "value": false}), sort.clone(), 0, 2);
    recorder.request(pins.clone()).await;
    recorder.settle(server, &[all.clone(), pins], "subscribed to the new field").await;
    // Removing it ends `pins` (its filter reads it); `all` gets a Reset without it.
    let (status, answer) = server.http("DELETE", "/v1/collections/rooms/fields/pinned", None);
    assert_eq!(status, 200, "{answer}");
    let frame = recorder.until_frame("ended").await;
    assert_eq!((&frame["sub"], &frame["reason"]), (&json!("pins"), &json!("field_removed")), "{frame}");
    recorder.settle(server, std::slice::from_ref(&all), "after the field was removed").await;
    // A subscription that does not read the field lives on. (That the ended id is
    // free again needs a client action, which the corpus does not hold: the
    // clients' own tests check it.)
    let names = subscribe("names", Value::Null, json!([{"field": "name", "dir": "asc"}]), 0, 2);
    recorder.request(names.clone()).await;
    write(server, json!([room(50, "Aaron", 3000, 9, false)]));
    recorder.settle(server, &[all, names], "after a write").await;
    // Dropping the collection ends both.
    let (status, answer) = server.http("DELETE", "/v1/collections/rooms", None);
    assert_eq!(status, 200, "{answer}");
    while !recorder.client.lists.is_empty() {
        recorder.until_frame("ended").await;
    }
    recorder.drain().await;
    Case {
        name: "ended",
        description: "Schema changes under live subscriptions: a field added (a Reset in the new shape), the \
                      field removed (`ended` with reason `field_removed` for the subscription that filters on \
                      it, a Reset without it for the other), a write, then the collection dropped (`ended`, \
                      `collection_dropped`, for the two left). After `ended` no frame of the \
                      subscription follows and it is gone from the lists.",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

/// Views through a `ref` field: `seats` reference `spaces`.
async fn reference_views(server: &Server) -> Case {
    server.ok(
        "PUT",
        "/v1/collections/spaces",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"},
                          {"name": "topic", "type": "string"}, {"name": "archived", "type": "bool"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/seats",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "space", "type": "ref", "target": "spaces"},
                          {"name": "unread", "type": "u64"}]}),
    );
    let write_to = |collection: &str, ops: Value| {
        server.ok("POST", &format!("/v1/collections/{collection}/batch"), json!({ "ops": ops }));
    };
    let space = |id: &str, name: &str, recency: u64, topic: &str| json!({"op": "upsert", "id": id, "fields": {"name": name, "recency": recency, "topic": topic, "archived": false}});
    let seat = |id: &str, owner: &str, space: &str, unread: u64| json!({"op": "upsert", "id": id, "fields": {"owner": owner, "space": space, "unread": unread}});
    write_to(
        "spaces",
        json!([
            space("s1", "Atrium", 10, "welcome"),
            space("s2", "Annex", 20, "news"),
            space("s3", "Basement", 30, "")
        ]),
    );
    write_to(
        "seats",
        json!([
            seat("u1/s1", "u1", "s1", 0),
            seat("u1/s2", "u1", "s2", 2),
            seat("u1/s3", "u1", "s3", 1),
            seat("u1/s9", "u1", "s9", 0),
            seat("u2/s1", "u2", "s1", 5)
        ]),
    );
    let mut recorder = Recorder::connect(server, BTreeMap::new(), fresh(&["mine", "named"])).await;
    let initial = recorder.client.lists.clone();
    let mine = json!({"op": "subscribe", "sub": "mine", "collection": "seats",
        "filter": {"field": "owner", "op": "eq", "value": "u1"}, "sort": [{"field": "space.recency", "dir": "desc"}],
        "offset": 0, "limit": 4, "fields": ["unread", "space.name", "space.topic"], "payload": false});
    let named = json!({"op": "subscribe", "sub": "named", "collection": "seats",
        "filter": {"field": "space.name", "prefix": "a"}, "sort": [{"field": "space.name", "dir": "asc"}],
        "offset": 0, "limit": 3, "fields": ["space.name"], "payload": false});
    let views = [mine.clone(), named.clone()];
    async fn settle_seats(recorder: &mut Recorder, server: &Server, views: &[Value], context: &str) {
        for view in views {
            let sub = view["sub"].as_str().unwrap().to_owned();
            let mut body = view.clone();
            for key in ["op", "sub", "collection"] {
                body.as_object_mut().unwrap().remove(key);
            }
            let answer = server.ok("POST", "/v1/collections/seats/query", body);
            let expected = common::without_versions(&answer["items"]);
            let deadline = tokio::time::Instant::now() + SETTLE;
            while recorder.client.lists.get(&sub).is_none_or(|list| list.items != expected) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() || recorder.next(left).await.is_none() {
                    let got = recorder.client.lists.get(&sub).map(|list| list.items.clone());
                    panic!("{context}: {sub}\n got      {got:?}\n expected {expected:?}");
                }
            }
        }
    }
    recorder.request(mine).await;
    recorder.request(named).await;
    settle_seats(&mut recorder, server, &views, "subscribed").await;
    let writes = [
        ("spaces", json!([{"op": "upsert", "id": "s1", "fields": {"recency": 40}}])), // moves to the top of `mine`
        ("spaces", json!([{"op": "upsert", "id": "s2", "fields": {"topic": "new topic"}}])), // a Set in `mine` only
        ("spaces", json!([{"op": "upsert", "id": "s2", "fields": {"archived": true}}])), // shown nowhere: no frame
        ("spaces", json!([{"op": "upsert", "id": "s3", "fields": {"name": "Arcade"}}])), // enters `named`
        ("spaces", json!([space("s9", "Alcove", 50, "found")])),                      // a missing target appears
        ("spaces", json!([{"op": "remove", "id": "s1"}])),                            // a target goes: null, last
        ("seats", json!([seat("u1/s1", "u1", "s2", 7)])),                             // a reference changes target
        ("seats", json!([{"op": "remove", "id": "u2/s1"}])),
    ];
    for (collection, ops) in writes {
        write_to(collection, ops);
        settle_seats(&mut recorder, server, &views, "after a write").await;
    }
    recorder.drain().await;
    // Removing a target field ends every subscription reading through the reference.
    let (status, answer) = server.http("DELETE", "/v1/collections/spaces/fields/topic", None);
    assert_eq!(status, 200, "{answer}");
    while !recorder.client.lists.is_empty() {
        recorder.until_frame("ended").await;
    }
    recorder.drain().await;
    Case {
        name: "reference_views",
        description: "Views through a `ref` field (`seats.space` references `spaces`): sorted by `space.recency`, \
                      filtered on `space.name`, showing `space.name` and `space.topic` flat under their dotted \
                      names. A target update moves referencing items (or gives a `Set` when only a shown field \
                      changed, nothing when an unshown one did); a missing target reads null until it appears; a \
                      removed target reads null again; a reference changes target. Removing a target field ends \
                      both subscriptions (`ended`, `field_removed`).",
        synthetic: false,
        subscriptions: initial,
        steps: recorder.steps,
    }
}

fn item(id: &str, name: &str, recency: u64) -> Value {
    json!({"id": id, "fields": {"name": name, "recency": recency}, "payload": null})
}

/// Applies hand-built frames with the same reference code as the recorded ones.
fn synthetic(name: &'static str, description: &'static str, start: LocalList, frames: Vec<Value>) -> Case {
    let mut lists = BTreeMap::from([("list".to_owned(), start.clone())]);
    let mut steps = Vec::new();
    for frame in frames {
        let list = lists.get_mut("list").unwrap();
        let seq = frame["seq"].as_u64().unwrap();
        let event = if seq != list.seq + 1 {
            Some(json!({"kind": "gap", "sub": "list", "expected_seq": list.seq + 1, "got_seq": seq}))
        } else {
            apply_frame(list, &frame);
            let has_reset = frame["diffs"].as_array().unwrap().iter().any(|diff| diff.get("Reset").is_some());
            has_reset.then(|| json!({"kind": "reset", "sub": "list"}))
        };
        steps.push(json!({"frame": frame, "expect": expectation(&lists, &BTreeMap::new(), event)}));
    }
    Case { name, description, synthetic: true, subscriptions: BTreeMap::from([("list".to_owned(), start)]), steps }
}

fn synthetic_cases() -> Vec<Case> {
    let (a, b, c) = (item("a", "Alice", 3), item("b", "Bob", 2), item("c", "Chloé", 1));
    let (d, e, f, g) = (item("d", "Dmitri", 9), item("e", "Émile", 8), item("f", "Fatima", 7), item("g", "Günther", 6));
    let (h, i) = (item("h", "Hana", 5), item("i", "Ivan", 4));
    let start = LocalList { items: vec![a.clone(), b.clone(), c.clone()], seq: 4, n_resets: 0 };
    let frame = |seq: u64, diffs: Value| json!({"type": "diffs", "sub": "list", "seq": seq, "diffs": diffs});
    let every_kind = synthetic(
        "all_diff_kinds",
        "Every eyeball-im VectorDiff kind, several in one frame and one after another, built by hand: a client \
         must apply them all in order, from the first diff of a frame to the last.",
        start.clone(),
        vec![
            frame(
                5,
                json!([{"PushBack": {"value": d}}, {"PushFront": {"value": e}}, {"Insert": {"index": 2, "value": f}},
                            {"Set": {"index": 0, "value": g}}, {"Remove": {"index": 1}}, {"PopFront": {}}, {"PopBack": {}},
                            {"Append": {"values": [h, i]}}, {"Truncate": {"length": 3}}]),
            ),
            frame(6, json!([{"Clear": {}}])),
            frame(7, json!([{"Append": {"values": [a.clone()]}}, {"Insert": {"index": 1, "value": b.clone()}}])),
            frame(8, json!([{"Reset": {"values": [c.clone(), b.clone()]}}])),
            frame(9, json!([{"Truncate": {"length": 0}}, {"PushBack": {"value": a}}])),
        ],
    );
    let gaps = synthetic(
        "seq_gaps",
        "Frames whose seq is not the next one (skipped, repeated): the client must not apply them and must \
         report the gap; it keeps its list and seq until it subscribes again.",
        start,
        vec![
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(7, json!([{"Remove": {"index": 0}}])),
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(6, json!([{"PushFront": {"value": c}}])),
        ],
    );
    vec![every_kind, gaps]
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_corpus_matches_what_the_server_sends() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", schema());
    let mut cases = vec![
        live_diffs(&server).await,
        window_changes(&server).await,
        key_windows(&server).await,
        random_session(&server, "random_session_1", 1).await,
        random_session(&server, "random_session_2", 2).await,
        errors_and_unsubscribe(&server).await,
        requests_and_acks(&server).await,
        resume(&server, true).await,
        resume(&server, false).await,
        // Last: it changes the collection's fields and drops it.
        ended(&server).await,
        reference_views(&server).await,
    ];
    cases.extend(synthetic_cases());

    let dir = vectors_dir();
    if std::env::var_os("ORDO_WRITE_VECTORS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "json") {
                std::fs::remove_file(path).unwrap();
            }
        }
        for case in &cases {
            let text = serde_json::to_string_pretty(&case.to_json()).unwrap() + "\n";
            std::fs::write(dir.join(format!("{}.json", case.name)), text).unwrap();
        }
        eprintln!("wrote {} vectors to {}", cases.len(), dir.display());
        return;
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}; write it with ORDO_WRITE_VECTORS=1", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = cases.iter().map(|case| format!("{}.json", case.name)).collect();
    expected.sort();
    assert_eq!(
        on_disk,
        expected,
        "the files in {} are not the corpus; regenerate with ORDO_WRITE_VECTORS=1",
        dir.display()
    );
    for case in &cases {
        let path = dir.join(format!("{}.json", case.name));
        let stored: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            stored == case.to_json(),
            "{} differs from what the server sends now; regenerate with ORDO_WRITE_VECTORS=1 and review the diff",
            path.display()
        );
    }
}
