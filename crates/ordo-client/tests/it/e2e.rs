//! End to end against a real `ordo serve` with auth on: HTTP helpers, a live list
//! through writes, "load more", a change of view and a server restart mid-stream
//! (SIGKILL, then a new process on the same port: the client reconnects and resumes,
//! which resets). After every step the list equals a one-shot query of its window,
//! and the diff stream applied to the first snapshot equals the list.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ordo_client::{
    Auth, Client, ConnectionState, DiffStream, Error, Field, Item, LiveList, NewField, Op, PageController,
    Precondition, Vector, View,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::server::{mint, Server};

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Room {
    name: String,
    recency: u64,
    unread: u64,
}

type RoomItem = Item<Room>;

fn room(n: u64, recency: u64, unread: u64) -> Op {
    Op::upsert(format!("!r{n:03}"), json!({"name": format!("Room {n}"), "recency": recency, "unread": unread})).into()
}

/// The list and a mirror kept only from the diff stream.
struct Watched {
    list: LiveList<RoomItem>,
    mirror: Vector<RoomItem>,
    stream: DiffStream<RoomItem>,
    pages: PageController,
}

impl Watched {
    /// Watched as a room-list UI would: `entries_with_dynamic_adapters` (the window is
    /// `0..page_size`, grown by `pages.add_one_page()`).
    fn new(list: LiveList<RoomItem>, page_size: u64) -> Watched {
        let (mirror, stream, pages) = list.entries_with_dynamic_adapters(page_size).unwrap();
        Watched { list, mirror, stream, pages }
    }

    /// Waits until the list equals the query of `view` (ids and fields, in order), then
    /// checks that the stream's batches rebuild it exactly.
    async fn settles_to(&mut self, admin: &Client, view: &View, step: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = admin.http().query::<RoomItem>("rooms", view).await.unwrap();
            let expected: Vec<(String, Room)> = answer.items.into_iter().map(|item| (item.id, item.fields)).collect();
            let got: Vec<(String, Room)> = self.list.items().into_iter().map(|item| (item.id, item.fields)).collect();
            // `total`, when the server sends it, is the view's length.
            let total_agrees = self.list.total().is_none_or(|total| total == answer.total);
            if got == expected && total_agrees {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{step}: the list never matched the query\n list: {got:?}\nquery: {expected:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Everything the list applied is in the stream already (published under one lock).
        while let Some(Some(batch)) = futures_util::FutureExt::now_or_never(self.stream.next()) {
            for diff in batch {
                diff.apply(&mut self.mirror);
            }
        }
        assert_eq!(self.mirror, self.list.items(), "{step}: the diff stream does not rebuild the list");
        assert!(self.list.ended().is_none(), "{step}: the list ended");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_list_follows_writes_load_more_and_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 0);
    let admin = Client::builder(server.url()).auth(Auth::Token(server.mint("ops", "admin", 3600))).build();

    // Schema, rules (readers read `rooms`), and 30 rooms.
    let fields = [Field::new("name", "string"), Field::new("recency", "u64"), Field::new("unread", "u64")];
    let collection = admin.http().create_collection("rooms", &fields).await.unwrap();
    assert_eq!(collection.fields, fields);
    let rules = json!({"rules": [{"collection": "rooms", "roles": ["reader"], "read": true}]});
    let _: Value = admin.http().call(ordo_client::Method::PUT, "/v1/rules", Some(rules)).await.unwrap();
    let ops: Vec<Op> = (0..30).map(|n| room(n, 1000 + n, n % 3)).collect();
    let written = admin.http().write("rooms", &ops).await.unwrap();
    assert_eq!(written.upserted, 30);

    // The reader's client gets its tokens from a provider (counted).
    let secret = server.secret.clone();
    let provided = Arc::new(AtomicUsize::new(0));
    let counter = provided.clone();
    let reader = Client::builder(server.url())
        .auth(Auth::provider(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let secret = secret.clone();
            async move { Ok(mint(&secret, "u1", "reader", 3600)) }
        }))
        .build();
    let mut view = View::new().sort(json!([{"field": "recency", "dir": "desc"}])).range(0, 10);
    let mut watched = Watched::new(reader.subscribe::<RoomItem>("rooms", view.clone()).unwrap(), 10);
    watched.settles_to(&admin, &view, "first snapshot").await;
    assert!(provided.load(Ordering::SeqCst) >= 1, "the provider gave the WebSocket its token");

    // Writes: a room moves to the top, one leaves, one arrives.
    admin.http().write("rooms", &[room(3, 5000, 9), Op::remove("!r029"), room(40, 4000, 1)]).await.unwrap();
    watched.settles_to(&admin, &view, "after writes").await;

    // Load more: the window grows by a page, twice.
    for limit in [20, 30] {
        view = view.range(0, limit);
        watched.pages.add_one_page().unwrap();
        watched.settles_to(&admin, &view, &format!("load more to {limit}")).await;
        assert_eq!(watched.list.items().len() as u64, limit);
    }

    // Random writes, each compared with the query (a seeded sequence).
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for step in 0..15 {
        let mut ops = Vec::new();
        for _ in 0..1 + step % 4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = state % 45;
            ops.push(if state.is_multiple_of(5) {
                Op::remove(format!("!r{n:03}"))
            } else {
                room(n, 2000 + state % 3000, state % 4)
            });
        }
        admin.http().write("rooms", &ops).await.unwrap();
        watched.settles_to(&admin, &view, &format!("random step {step}")).await;
    }

    // A change of view: unread rooms only.
    view.filter = Some(json!({"field": "unread", "op": "gt", "value": 0}));
    watched.list.set_view(view.filter.clone(), view.sort.clone()).unwrap();
    watched.settles_to(&admin, &view, "set_view").await;

    // The server dies mid-stream (SIGKILL, then a graceful SIGINT); each time a new one
    // starts on the same port with the same data.
    let mut server = server;
    for (round, graceful) in [(0u64, false), (1, true)] {
        let seq_before = watched.list.status().seq;
        let connection = reader.connection();
        let session_before = match &*connection.borrow() {
            ConnectionState::Connected { session } => session.clone(),
            other => panic!("not connected before the restart: {other:?}"),
        };
        let port = server.port;
        if graceful {
            server.interrupt();
        } else {
            server.kill();
        }
        server = Server::start(dir.path(), port);
        admin
            .http()
            .write("rooms", &[room(41 + round, 6000 + round, 2), room(5 + round, 6500 + round, 1)])
            .await
            .unwrap();
        watched.settles_to(&admin, &view, &format!("after restart {round}")).await;
        assert!(watched.list.status().seq > seq_before, "the resume's Reset continues the sequence");
        assert!(
            matches!(&*connection.borrow(), ConnectionState::Connected { session } if *session != session_before),
            "a new connection with a new session"
        );
        // And it stays live after the resume.
        admin.http().write("rooms", &[room(7, 7000 + round, 4)]).await.unwrap();
        watched.settles_to(&admin, &view, &format!("after resume {round}")).await;
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_helpers_write_query_get_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 0);
    let admin = Client::builder(server.url()).auth(Auth::Token(server.mint("ops", "admin", 3600))).build();
    let fields = [Field::new("name", "string"), Field::new("recency", "u64"), Field::new("unread", "u64")];
    admin.http().create_collection("rooms", &fields).await.unwrap();
    // The same schema again is fine; another one is `collection_exists`.
    admin.http().create_collection("rooms", &fields).await.unwrap();
    let error = admin.http().create_collection("rooms", &fields[..1]).await.unwrap_err();
    assert_eq!(error.code(), Some("collection_exists"), "{error}");

    let written = admin.http().write("rooms", &[room(1, 10, 0), room(2, 20, 0)]).await.unwrap();
    let item: RoomItem = admin.http().get_item("rooms", "!r001").await.unwrap().expect("written");
    assert_eq!(item.fields, Room { name: "Room 1".into(), recency: 10, unread: 0 });
    if let Some(version) = item.version {
        assert_eq!(version, written.seq, "an item's version is the seq of the batch that wrote it");
    }
    assert_eq!(admin.http().get_item::<RoomItem>("rooms", "!nope").await.unwrap(), None);
    let missing = admin.http().get_item::<RoomItem>("nowhere", "!r001").await.unwrap_err();
    assert_eq!(missing.code(), Some("unknown_collection"), "{missing}");

    let page = admin
        .http()
        .query::<RoomItem>("rooms", &View::new().sort(json!([{"field": "recency", "dir": "desc"}])).range(0, 1))
        .await
        .unwrap();
    assert_eq!(page.total, 2);
    assert_eq!(page.items.iter().map(|item| item.id.as_str()).collect::<Vec<_>>(), ["!r002"]);

    let deleted = admin.http().delete_item("rooms", "!r002").await.unwrap();
    assert!(deleted.removed && deleted.seq > written.seq);
    assert!(!admin.http().delete_item("rooms", "!r002").await.unwrap().removed);

    // A bad batch is refused whole with its code.
    let error =
        admin.http().write("rooms", &[Op::upsert("!x", json!({"recency": "not a number"})).into()]).await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 422, code, .. } if code == "invalid_batch"), "{error}");

    // A reader may not write: 403, with no retry loop.
    let reader = Client::builder(server.url()).auth(Auth::Token(server.mint("u1", "reader", 3600))).build();
    let error = reader.http().write("rooms", &[room(3, 30, 0)]).await.unwrap_err();
    assert_eq!(error.code(), Some("forbidden"), "{error}");

    // Preconditions and atomic ops serialise as the protocol names them.
    let op: Op = Op::upsert("!a", json!({"name": "A"}))
        .increment("unread", 1)
        .set_max("recency", 17)
        .when(Precondition::Version(41))
        .into();
    assert_eq!(
        serde_json::to_value(&op).unwrap(),
        json!({"op": "upsert", "id": "!a", "fields": {"name": "A"}, "increment": {"unread": 1}, "set_max": {"recency": 17}, "if": {"version": 41}})
    );
    let remove = Op::Remove { id: "!b".into(), condition: Some(Precondition::Exists(true)) };
    assert_eq!(serde_json::to_value(&remove).unwrap(), json!({"op": "remove", "id": "!b", "if": {"exists": true}}));
}

/// A write sent again with its idempotency key (its first answer lost, say) is
/// answered as the first time and applied once; the key with other ops is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_helpers_send_an_idempotency_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 0);
    let admin = Client::builder(server.url()).auth(Auth::Token(server.mint("ops", "admin", 3600))).build();
    let http = admin.http();
    http.create_collection("rooms", &[Field::new("unread", "u64")]).await.unwrap();
    let bump: [Op; 1] = [Op::upsert("!r1", json!({})).increment("unread", 1).into()];
    let first = http.write_once("rooms", &bump, Some("bump-1")).await.unwrap();
    let again = http.write_once("rooms", &bump, Some("bump-1")).await.unwrap();
    assert_eq!((again.seq, again.upserted), (first.seq, first.upserted));
    let item: Item<Value> = http.get_item("rooms", "!r1").await.unwrap().expect("written");
    assert_eq!(item.fields["unread"], 1);
    let error = http.write_once("rooms", &[Op::remove("!r1")], Some("bump-1")).await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 422, code, .. } if code == "idempotency_key_reused"), "{error}");
    let removed = http.delete_item_once("rooms", "!r1", Some("del-1")).await.unwrap();
    let again = http.delete_item_once("rooms", "!r1", Some("del-1")).await.unwrap();
    assert!(removed.removed && again.removed && again.seq == removed.seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_helpers_add_and_remove_a_field_and_drop_a_collection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 0);
    let admin = Client::builder(server.url()).auth(Auth::Token(server.mint("ops", "admin", 3600))).build();
    let fields = [Field::new("name", "string"), Field::new("recency", "u64"), Field::new("unread", "u64")];
    admin.http().create_collection("schema", &fields).await.unwrap();
    let written = admin.http().write("schema", &[room(1, 10, 0)]).await.unwrap();

    let added = admin.http().add_field("schema", &NewField::new("pinned", "bool").with_default(true)).await.unwrap();
    assert_eq!(added.collection.name, "schema");
    let names = |fields: &[Field]| fields.iter().map(|field| field.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&added.collection.fields), ["name", "recency", "unread", "pinned"]);
    assert!(added.seq > written.seq, "{added:?}");
    let item: Value = admin.http().get_item("schema", "!r001").await.unwrap().expect("written");
    assert_eq!(item["fields"]["pinned"], true, "existing items get the default: {item}");
    // Serialised without `default` when there is none: the field is null in existing items.
    assert_eq!(
        serde_json::to_value(NewField::new("note", "string")).unwrap(),
        json!({"name": "note", "type": "string"})
    );
    let error = admin.http().add_field("schema", &NewField::new("pinned", "bool")).await.unwrap_err();
    assert_eq!(error.code(), Some("invalid_schema"), "{error}");

    // Admin only.
    let writer = Client::builder(server.url()).auth(Auth::Token(server.mint("u1", "writer", 3600))).build();
    let error = writer.http().add_field("schema", &NewField::new("x", "u64")).await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 403, .. }), "{error}");
    let error = writer.http().remove_field("schema", "pinned").await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 403, .. }), "{error}");
    let error = writer.http().drop_collection("schema").await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 403, .. }), "{error}");

    let removed = admin.http().remove_field("schema", "pinned").await.unwrap();
    assert_eq!(names(&removed.collection.fields), ["name", "recency", "unread"]);
    assert!(removed.seq > added.seq, "{removed:?}");
    let error = admin.http().remove_field("schema", "pinned").await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 404, code, .. } if code == "not_found"), "{error}");

    let dropped = admin.http().drop_collection("schema").await.unwrap();
    assert_eq!(dropped.dropped, "schema");
    assert!(dropped.seq > removed.seq, "{dropped:?}");
    let error = admin.http().collection("schema").await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 404, .. }), "{error}");
}
