//! The cases recorded from the live server: each drives a client through one
//! part of the protocol (live diffs, window changes, key windows, random
//! sessions, errors, request ids, resume, ended subscriptions, reference views).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::case::Case;
use crate::common::{self, Rng, Server};
use crate::recorder::{fresh, Recorder, SETTLE};
use crate::rooms::{random_filter, random_op, random_sort, reset_rooms, room, subscribe, write};

pub(crate) async fn live_diffs(server: &Server) -> Case {
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

pub(crate) async fn window_changes(server: &Server) -> Case {
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
pub(crate) async fn key_windows(server: &Server) -> Case {
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

pub(crate) async fn random_session(server: &Server, name: &'static str, seed: u64) -> Case {
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

pub(crate) async fn errors_and_unsubscribe(server: &Server) -> Case {
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

pub(crate) async fn requests_and_acks(server: &Server) -> Case {
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

pub(crate) async fn resume(server: &Server, replay: bool) -> Case {
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
pub(crate) async fn ended(server: &Server) -> Case {
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
pub(crate) async fn reference_views(server: &Server) -> Case {
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
            let expected = common::query_items(&answer["items"]);
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
