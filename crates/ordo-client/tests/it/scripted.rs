//! The client against a scripted WebSocket server whose frames each test writes:
//! token refresh (before `exp`, on `auth_expired`, after a 4401 close), resume with the
//! session of the last `resumed`, and re-subscribing after a gap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use ordo_client::{Auth, Backoff, Client, View};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

struct Script {
    listener: TcpListener,
}

struct Conn {
    ws: WebSocketStream<TcpStream>,
}

impl Script {
    async fn new() -> Script {
        Script { listener: TcpListener::bind("127.0.0.1:0").await.unwrap() }
    }

    fn url(&self) -> String {
        format!("http://{}", self.listener.local_addr().unwrap())
    }

    /// The client's next connection, welcomed with `session` and `auth`.
    async fn accept(&self, session: &str, auth: &str) -> Conn {
        let (stream, _) =
            timeout(Duration::from_secs(10), self.listener.accept()).await.expect("the client connects").unwrap();
        let ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let mut conn = Conn { ws };
        conn.send(json!({"type": "welcome", "protocol": 1, "session": session, "auth": auth, "limits": {}})).await;
        conn
    }
}

impl Conn {
    async fn send(&mut self, frame: Value) {
        self.ws.send(Message::text(frame.to_string())).await.unwrap();
    }

    async fn recv(&mut self) -> Value {
        loop {
            let message = timeout(Duration::from_secs(10), self.ws.next()).await.expect("a client message in time");
            match message.expect("open").unwrap() {
                Message::Text(text) => return serde_json::from_str(text.as_str()).unwrap(),
                Message::Close(_) => panic!("the client closed"),
                _ => continue,
            }
        }
    }

    /// Reads an `auth`, answers `authed` with `expires_at`, returns the token.
    async fn authed(&mut self, expires_at: u64) -> String {
        let auth = self.recv().await;
        assert_eq!(auth["op"], "auth", "{auth}");
        self.send(json!({"type": "authed", "sub": "u1", "role": "reader", "expires_at": expires_at})).await;
        auth["token"].as_str().unwrap().to_owned()
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A client whose provider hands out `t1`, `t2`, ... and reconnects fast.
fn client(script: &Script) -> (Client, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let client = Client::builder(script.url())
        .backoff(Backoff { min: Duration::from_millis(10), max: Duration::from_millis(50) })
        .auth(Auth::provider(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move { Ok(format!("t{n}")) }
        }))
        .build();
    (client, calls)
}

#[tokio::test]
async fn tokens_are_refreshed_on_auth_expired_before_exp_and_after_4401() {
    let script = Script::new().await;
    let (_client, _) = client(&script);
    let mut conn = script.accept("s1", "required").await;
    assert_eq!(conn.authed(now() + 3600).await, "t1");

    // `auth_expired`: a fresh token on the same connection.
    conn.send(json!({"type": "auth_expired", "grace_secs": 30})).await;
    assert_eq!(conn.authed(now() + 2).await, "t2");
    // That token expires in 2 s: refreshed before (at exp - lifetime / 2 here). On
    // paused time, the client's refresh timer is the next to fire, so the clock jumps
    // to it and the elapsed time is the client's schedule, not the machine's speed.
    // (Only here: the handshakes below must not race auto-advanced timeouts.)
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    assert_eq!(conn.authed(now() + 3600).await, "t3");
    let refreshed_after = started.elapsed();
    tokio::time::resume();
    assert!(refreshed_after < Duration::from_secs(2), "refreshed before exp: {refreshed_after:?}");

    // Closed with 4401: a new connection, with a fresh token.
    conn.ws
        .send(Message::Close(Some(CloseFrame { code: CloseCode::from(4401), reason: "expired".into() })))
        .await
        .unwrap();
    let mut conn = script.accept("s2", "required").await;
    assert_eq!(conn.authed(now() + 3600).await, "t4");
}

#[tokio::test]
async fn every_resume_presents_the_session_of_the_last_resumed() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let list = client.subscribe::<Value>("rooms", View::new().range(0, 10)).unwrap();

    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    let subscribe = conn.recv().await;
    assert_eq!(subscribe["op"], "subscribe", "{subscribe}");
    let sub = subscribe["sub"].as_str().unwrap().to_owned();
    conn.send(
        json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [{"id": "a", "fields": {}}]}}]}),
    )
    .await;
    drop(conn);

    let mut conn = script.accept("s2", "required").await;
    conn.authed(now() + 3600).await;
    let resume = conn.recv().await;
    assert_eq!(resume["op"], "resume", "{resume}");
    assert_eq!(resume["session"], "s1", "the previous connection's session, not this welcome's");
    assert_eq!(resume["subs"][0]["last_seq"], 1);
    assert_eq!(resume["subs"][0]["collection"], "rooms");
    conn.send(json!({"type": "resumed", "session": "s3", "subs": [{"sub": sub, "replayed": 0}]})).await;
    conn.send(
        json!({"type": "diffs", "sub": sub, "seq": 2, "diffs": [{"PushBack": {"value": {"id": "b", "fields": {}}}}]}),
    )
    .await;
    drop(conn);

    let mut conn = script.accept("s4", "required").await;
    conn.authed(now() + 3600).await;
    let resume = conn.recv().await;
    assert_eq!(resume["session"], "s3", "the session of the last `resumed`");
    assert_eq!(resume["subs"][0]["last_seq"], 2);
    assert_eq!(list.items().len(), 2);
}

#[tokio::test]
async fn a_gap_or_a_frame_that_does_not_apply_resubscribes_and_the_list_waits_for_the_reset() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let list = client.subscribe::<Value>("rooms", View::new().range(0, 10)).unwrap();
    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    let sub = conn.recv().await["sub"].as_str().unwrap().to_owned();
    let item = |id: &str| json!({"id": id, "fields": {}});
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [item("a")]}}]})).await;

    // seq 3 after 1: not applied; unsubscribe + subscribe under the same id.
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 3, "diffs": [{"Clear": {}}]})).await;
    assert_eq!(conn.recv().await, json!({"op": "unsubscribe", "sub": sub}));
    assert_eq!(conn.recv().await["op"], "subscribe");
    assert_eq!(list.items().len(), 1, "the list keeps its items until the new Reset");
    conn.send(json!({"type": "unsubscribed", "sub": sub})).await;
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [item("b"), item("c")]}}]}))
        .await;

    // A Remove past the end: not applied either.
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 2, "diffs": [{"Remove": {"index": 5}}]})).await;
    assert_eq!(conn.recv().await, json!({"op": "unsubscribe", "sub": sub}));
    assert_eq!(conn.recv().await["op"], "subscribe");
    assert_eq!(list.items().iter().map(|item| item["id"].clone()).collect::<Vec<_>>(), [json!("b"), json!("c")]);
    assert!(list.status().last_error.is_some());
    conn.send(json!({"type": "unsubscribed", "sub": sub})).await;
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [item("b"), item("c")]}}]}))
        .await;

    // Diffs that apply, but a digest that is not the list's after them (the rows'
    // digest swapped): not applied either, counted, and subscribed again.
    let swapped = ordo_client::digest::digest_hex(ordo_client::digest::window_digest(&[
        ordo_client::digest::RowKey { id: "c".into(), version: 0 },
        ordo_client::digest::RowKey { id: "b".into(), version: 0 },
    ]));
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 2, "digest": swapped, "diffs": []})).await;
    assert_eq!(conn.recv().await, json!({"op": "unsubscribe", "sub": sub}));
    assert_eq!(conn.recv().await["op"], "subscribe");
    assert_eq!(list.status().n_digest_mismatches, 1);
    assert!(list.status().last_error.is_some_and(|error| error.starts_with("digest_mismatch")), "{:?}", list.status());
    assert_eq!(list.status().seq, 1, "the frame was not applied");
}

/// Subscribes one list on a fresh scripted connection; returns the connection and the sub id.
async fn live_list(script: &Script, client: &Client) -> (Conn, ordo_client::LiveList<Value>, String) {
    let list = client.subscribe::<Value>("rooms", View::new().range(0, 1000)).unwrap();
    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    let sub = conn.recv().await["sub"].as_str().unwrap().to_owned();
    (conn, list, sub)
}

async fn wait_for_seq(list: &ordo_client::LiveList<Value>, seq: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while list.status().seq != seq {
        assert!(std::time::Instant::now() < deadline, "seq {} never reached {seq}", list.status().seq);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_stream_that_falls_max_pending_batches_behind_gets_one_reset() {
    use futures_util::FutureExt;
    let script = Script::new().await;
    let (client, _) = client(&script);
    let (mut conn, list, sub) = live_list(&script, &client).await;
    let item = |n: u64| json!({"id": format!("i{n}"), "fields": {}});
    let (_, mut at_the_limit) = list.entries();
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": []}}]})).await;
    for seq in 2..=ordo_client::MAX_PENDING_BATCHES as u64 {
        conn.send(json!({"type": "diffs", "sub": sub, "seq": seq, "diffs": [{"PushBack": {"value": item(seq)}}]}))
            .await;
    }
    wait_for_seq(&list, ordo_client::MAX_PENDING_BATCHES as u64).await;
    // Exactly at the limit: every batch is still there, one per frame.
    let (start, mut past_the_limit) = list.entries();
    for _ in 0..ordo_client::MAX_PENDING_BATCHES {
        let batch = at_the_limit.next().now_or_never().expect("a batch is ready").expect("open");
        assert_eq!(batch.len(), 1);
    }
    assert!(at_the_limit.next().now_or_never().is_none());

    // One past it: the unread batches collapse into one Reset of the items.
    let last = 2 * ordo_client::MAX_PENDING_BATCHES as u64 + 1;
    for seq in ordo_client::MAX_PENDING_BATCHES as u64 + 1..=last {
        conn.send(json!({"type": "diffs", "sub": sub, "seq": seq, "diffs": [{"PushBack": {"value": item(seq)}}]}))
            .await;
    }
    wait_for_seq(&list, last).await;
    assert_eq!(start.len(), ordo_client::MAX_PENDING_BATCHES - 1);
    let batch = past_the_limit.next().now_or_never().expect("a batch is ready").expect("open");
    assert_eq!(batch, vec![ordo_client::VectorDiff::Reset { values: list.items() }]);
    assert!(past_the_limit.next().now_or_never().is_none(), "nothing after the Reset");
}

#[tokio::test]
async fn an_ended_subscription_ends_its_streams_and_says_why() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let (mut conn, list, sub) = live_list(&script, &client).await;
    let (_, mut stream) = list.entries();
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "total": 3, "diffs": [{"Reset": {"values": [{"id": "a", "fields": {}}]}}]})).await;
    assert_eq!(stream.next().await.unwrap().len(), 1);
    assert_eq!(list.total(), Some(3));
    conn.send(json!({"type": "ended", "sub": sub, "reason": "collection_dropped", "message": "rooms was dropped"}))
        .await;
    assert_eq!(timeout(Duration::from_secs(10), stream.next()).await.unwrap(), None, "the stream ends");
    assert_eq!(list.ended().unwrap().reason, "collection_dropped");
    assert_eq!(list.items().len(), 1, "the last items stay readable");
}

#[tokio::test]
async fn lists_that_do_not_fit_in_one_resume_frame_subscribe_afresh() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    // Two views of 40 KB each: one resume frame (at most 64 KiB) holds only one.
    let big = |tag: &str| json!({"field": "name", "op": "ne", "value": tag.repeat(40_000)});
    let first = client.subscribe::<Value>("rooms", View::new().filter(big("a")).range(0, 10)).unwrap();
    let second = client.subscribe::<Value>("rooms", View::new().filter(big("b")).range(0, 10)).unwrap();
    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    for _ in 0..2 {
        let sub = conn.recv().await["sub"].as_str().unwrap().to_owned();
        conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [{"id": sub, "fields": {}}]}}]})).await;
    }
    wait_for_seq(&first, 1).await;
    wait_for_seq(&second, 1).await;
    drop(conn);

    let mut conn = script.accept("s2", "required").await;
    conn.authed(now() + 3600).await;
    let resume = conn.recv().await;
    assert!(resume.to_string().len() <= 64 * 1024, "the resume fits in a client frame");
    assert_eq!(resume["op"], "resume");
    let listed: Vec<&str> =
        resume["subs"].as_array().unwrap().iter().map(|entry| entry["sub"].as_str().unwrap()).collect();
    assert_eq!(listed, [first.id()]);
    let subscribe = conn.recv().await;
    assert_eq!((subscribe["op"].as_str(), subscribe["sub"].as_str()), (Some("subscribe"), Some(second.id())));
    // The fresh subscription starts again at seq 1; its list waits for that Reset.
    assert_eq!(second.items().len(), 1);
    conn.send(json!({"type": "resumed", "session": "s3", "subs": [{"sub": first.id(), "replayed": 0}]})).await;
    conn.send(json!({"type": "diffs", "sub": second.id(), "seq": 1, "diffs": [{"Reset": {"values": []}}]})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !second.items().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the fresh Reset was never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_refused_set_range_is_not_what_the_next_resume_asks_for() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let (mut conn, list, sub) = live_list(&script, &client).await;
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": []}}]})).await;
    wait_for_seq(&list, 1).await;
    list.set_range(0, 5000).unwrap();
    assert_eq!(conn.recv().await, json!({"op": "set_range", "sub": sub, "offset": 0, "limit": 5000}));
    conn.send(json!({"type": "error", "sub": sub, "code": "limit_exceeded", "message": "limit 5000 is past 1000"}))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while list.status().last_error.is_none() {
        assert!(std::time::Instant::now() < deadline, "the refusal was never noted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(list.ended().is_none(), "a refused request leaves the subscription as it was");
    drop(conn);

    let mut conn = script.accept("s2", "required").await;
    conn.authed(now() + 3600).await;
    let resume = conn.recv().await;
    assert_eq!(resume["subs"][0]["limit"], 1000, "the window the server kept: {resume}");
}

#[tokio::test]
async fn a_connection_lost_before_its_resume_does_not_spend_the_session_to_resume() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let (mut conn, list, sub) = live_list(&script, &client).await;
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": []}}]})).await;
    wait_for_seq(&list, 1).await;
    drop(conn);
    // Welcomed, then dropped before `authed`: no resume was sent on it.
    let mut conn = script.accept("s2", "required").await;
    assert_eq!(conn.recv().await["op"], "auth");
    drop(conn);
    let mut conn = script.accept("s3", "required").await;
    conn.authed(now() + 3600).await;
    let resume = conn.recv().await;
    assert_eq!(resume["session"], "s1", "{resume}");
}

#[tokio::test]
async fn a_server_that_requires_a_token_the_client_lacks_is_reported() {
    let script = Script::new().await;
    let client = Client::builder(script.url())
        .backoff(Backoff { min: Duration::from_millis(10), max: Duration::from_millis(50) })
        .build();
    let mut connection = client.connection();
    let _conn = script.accept("s1", "required").await;
    let state = timeout(
        Duration::from_secs(10),
        connection
            .wait_for(|state| matches!(state, ordo_client::ConnectionState::Connecting { last_error: Some(_), .. })),
    )
    .await
    .expect("reported in time")
    .unwrap()
    .clone();
    let ordo_client::ConnectionState::Connecting { last_error: Some(error), .. } = state else { unreachable!() };
    assert!(error.contains("requires a token"), "{error}");
}

#[tokio::test]
async fn items_that_never_decode_end_the_list_after_three_fresh_subscriptions() {
    #[derive(Debug, Clone, serde::Deserialize)]
    struct Counted {
        #[allow(dead_code)]
        n: u64,
    }
    let script = Script::new().await;
    let (client, _) = client(&script);
    let list = client.subscribe::<ordo_client::Item<Counted>>("rooms", View::new().range(0, 10)).unwrap();
    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    let sub = conn.recv().await["sub"].as_str().unwrap().to_owned();
    // `n` is a string: it never decodes into `Counted`.
    let bad = json!({"type": "diffs", "sub": sub, "seq": 1, "diffs": [{"Reset": {"values": [{"id": "a", "fields": {"n": "x"}}]}}]});
    conn.send(bad.clone()).await;
    for _ in 0..3 {
        assert_eq!(conn.recv().await, json!({"op": "unsubscribe", "sub": sub}));
        assert_eq!(conn.recv().await["op"], "subscribe");
        conn.send(json!({"type": "unsubscribed", "sub": sub})).await;
        conn.send(bad.clone()).await;
    }
    assert_eq!(conn.recv().await, json!({"op": "unsubscribe", "sub": sub}), "it gives up");
    let ended = list.ended().expect("the list ended");
    assert_eq!(ended.reason, "invalid_diffs");
    assert!(ended.message.contains("gave up"), "{}", ended.message);
    assert!(list.items().is_empty(), "nothing undecodable was applied");
}

// On paused time: once nothing but the listener is left to wait for, the clock
// jumps to the client's timeout, so the elapsed time is the timeout's, whatever
// the machine's load.
#[tokio::test(start_paused = true)]
async fn an_http_request_without_an_answer_times_out() {
    // A listener that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let client = Client::builder(url).http_timeout(Duration::from_millis(200)).build();
    let started = tokio::time::Instant::now();
    // The outer bound only turns a client without a timeout into a failure, not a hang.
    let request = client.http().get_item::<Value>("rooms", "!a");
    let error = timeout(Duration::from_secs(60), request).await.expect("the client gave up by itself").unwrap_err();
    assert!(matches!(&error, ordo_client::Error::Transport(message) if message.contains("no answer")), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_set_range_by_offset_drops_the_position_key_the_list_was_placed_by() {
    let script = Script::new().await;
    let (client, _) = client(&script);
    let mut view = View::new();
    view.limit = Some(10);
    view.extra.insert("tail".to_owned(), json!(true));
    let list = client.subscribe::<Value>("rooms", view).unwrap();
    let mut conn = script.accept("s1", "required").await;
    conn.authed(now() + 3600).await;
    let subscribe = conn.recv().await;
    assert_eq!(subscribe["tail"], true);
    let sub = subscribe["sub"].as_str().unwrap().to_owned();
    let (_, mut stream) = list.entries();
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 1, "offset": 90, "limit": 10, "total": 100, "diffs": [{"Reset": {"values": []}}]})).await;
    // A frame with no diffs (a key-placed set_range that changed nothing) applies, and
    // gives the streams nothing.
    conn.send(json!({"type": "diffs", "sub": sub, "seq": 2, "diffs": []})).await;
    wait_for_seq(&list, 2).await;
    assert_eq!(stream.next().await.unwrap().len(), 1);
    assert!(futures_util::FutureExt::now_or_never(stream.next()).is_none());

    list.set_range(0, 20).unwrap();
    assert_eq!(conn.recv().await["op"], "set_range");
    drop(conn);
    let mut conn = script.accept("s2", "required").await;
    conn.authed(now() + 3600).await;
    let entry = conn.recv().await["subs"][0].clone();
    assert_eq!((entry.get("tail"), &entry["offset"], &entry["limit"]), (None, &json!(0), &json!(20)), "{entry}");
}
