//! Budgets per identity for what outlives a request: the views a reader holds
//! (live or parked for resume) and, for sockets that have not authenticated,
//! their share of the connection cap.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{mint, write_secret, Client, Server, StartOptions};
use serde_json::{json, Value};

/// Items of the collection every view is opened on: each view holds most of them.
const N_ITEMS: usize = 20_000;

/// A server with auth on, an admin token for `server.http`, and `rooms` readable by every reader.
fn start(dir: &Path, extra: &[&str], options: StartOptions) -> (Server, PathBuf) {
    let secret_file = write_secret(dir);
    let mut args = vec!["--auth-secret-file", secret_file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut server = Server::start_with(&dir.join("data"), &args, options);
    server.token = Some(mint(&secret_file, "ops", "admin", &[]));
    server.ok("PUT", "/v1/collections/rooms", common::room_schema());
    fill_rooms(&server);
    server.ok("PUT", "/v1/rules", json!({"rules": [{"collection": "rooms", "roles": ["reader"], "read": true}]}));
    (server, secret_file)
}

/// `N_ITEMS` rooms, `recency` 0, 1, 2...
fn fill_rooms(server: &Server) {
    for chunk in (0..N_ITEMS).collect::<Vec<_>>().chunks(10_000) {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|index| json!({"op": "upsert", "id": format!("r{index:05}"), "fields": {"recency": index}}))
            .collect();
        server.ok("POST", "/v1/collections/rooms/batch", json!({ "ops": ops }));
    }
}

/// A view of its own for every `index`: items with `recency >= index`, so
/// nearly the whole collection for small indexes.
fn subscribe(sub: &str, index: usize) -> Value {
    subscribe_sorted(sub, index, "desc")
}

/// Another view for each `index` (a view's sort is part of it), as large as
/// the descending one: one the reader does not hold yet costs it at least as
/// much as any of those it holds.
fn subscribe_sorted(sub: &str, index: usize, dir: &str) -> Value {
    json!({"op": "subscribe", "sub": sub, "collection": "rooms", "limit": 10,
           "filter": {"field": "recency", "op": "ge", "value": index},
           "sort": [{"field": "recency", "dir": dir}]})
}

/// The answer to the subscription `sub`: its first frame (`Ok`) or its error.
async fn answer_of(client: &mut Client, sub: &str) -> Result<(), Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let frame = client.next_json(Duration::from_secs(20)).await.expect("an answer");
        if frame["sub"] != sub {
            continue;
        }
        return match frame["type"].as_str() {
            Some("diffs") => Ok(()),
            Some("error") => Err(frame),
            _ => panic!("unexpected {frame}"),
        };
    }
    panic!("no answer for {sub}");
}

/// Subscribes views `first..` until one is refused; returns how many were accepted
/// and the refusal (`None`: all `n` accepted).
async fn fill(client: &mut Client, first: usize, n: usize) -> (usize, Option<Value>) {
    for index in first..first + n {
        let sub = format!("v{index}");
        client.send(subscribe(&sub, index)).await;
        if let Err(error) = answer_of(client, &sub).await {
            return (index - first, Some(error));
        }
    }
    (n, None)
}

fn assert_budget_refusal(error: &Value) {
    assert_eq!(error["code"], "limit_exceeded", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("views"), "the message says what ran out: {message}");
}

/// One reader opening views of its own over a large collection, on live
/// connections and then in sessions parked for resume, is refused past its
/// budget, while another reader still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_views_stay_within_its_budget_even_parked() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start(dir.path(), &[], StartOptions::default());
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let per_connection = limits["max_subscriptions_per_connection"].as_u64().unwrap() as usize;
    let alice = mint(&secret_file, "alice", "reader", &[]);

    // Connections of as many subscriptions as allowed, each dropped (parked) once full.
    let mut accepted = 0;
    let mut refusal = None;
    for _ in 0..4 {
        let mut client = server.connect_as(Some(&alice)).await;
        let (n, refused) = fill(&mut client, accepted, per_connection).await;
        accepted += n;
        if refused.is_some() {
            refusal = refused;
            // Parked with its views: the next connection must not start afresh.
            drop(client);
            break;
        }
        drop(client);
    }
    let refusal = refusal.expect("a budget refuses some view before 4 connections' worth");
    assert_budget_refusal(&refusal);
    let budget_bytes = limits["max_view_bytes_per_identity"].as_u64().expect("max_view_bytes_per_identity");
    let budget_views = limits["max_views_per_identity"].as_u64().expect("max_views_per_identity");
    assert!(accepted as u64 <= budget_views, "{accepted} views accepted");
    assert!(accepted > per_connection / 2, "only {accepted} views accepted: the budget is too tight");
    let largest = server.metric("ordo_identity_view_bytes_max");
    assert!(largest > 0.0 && largest <= budget_bytes as f64, "largest identity holds {largest} bytes");

    // After its connections dropped, its parked sessions still hold the views
    // (a view of its own again: those it holds cost nothing more).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut client = server.connect_as(Some(&alice)).await;
    client.send(subscribe_sorted("again", 1, "asc")).await;
    assert_budget_refusal(&answer_of(&mut client, "again").await.unwrap_err());
    assert!(server.metric("ordo_identity_view_budget_refusals_total") >= 2.0);

    // Another reader has a budget of its own.
    let bob = mint(&secret_file, "bob", "reader", &[]);
    let mut other = server.connect_as(Some(&bob)).await;
    other.send(subscribe("mine", 1)).await;
    answer_of(&mut other, "mine").await.expect("another identity still gets in");
    server.stop();
}

/// What a reader's views cost is given back when they go: on `unsubscribe`, on
/// a `set_view` (the old view's cost is not kept besides the new one's), and
/// when a parked session expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_view_budget_is_released_with_its_views() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start(dir.path(), &["--session-retention", "1"], StartOptions::default());
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let mut client = server.connect_as(Some(&alice)).await;
    // A small view first (ten items), then large ones until the budget refuses.
    client.send(subscribe("small", N_ITEMS - 10)).await;
    answer_of(&mut client, "small").await.unwrap();
    let (accepted, refused) = fill(&mut client, 0, 128).await;
    assert_budget_refusal(&refused.expect("the budget is reached within one connection"));
    assert!(accepted > 50, "{accepted}");

    // set_view of the small view to a large new one: refused, nothing changes.
    let set_view = |sub: &str, index: usize| {
        json!({"op": "set_view", "sub": sub, "req": "sv",
               "filter": {"field": "recency", "op": "ge", "value": index},
               "sort": [{"field": "recency", "dir": "asc"}]})
    };
    client.send(set_view("small", 3)).await;
    let error = client.expect_error().await;
    assert_eq!(error["sub"], "small", "{error}");
    assert_budget_refusal(&error);

    // set_view of a large view to another large one: the old one's cost is given back.
    client.send(set_view("v0", 5)).await;
    let answer = client.next_json(Duration::from_secs(20)).await.expect("an answer to set_view");
    assert_eq!(answer["req"], "sv", "{answer}");
    assert_ne!(answer["type"], "error", "{answer}");

    // Unsubscribing one gives room for one more (a view of its own: one it
    // holds already would cost nothing more).
    client.send(subscribe_sorted("more", 10, "asc")).await;
    assert_budget_refusal(&answer_of(&mut client, "more").await.unwrap_err());
    client.send(json!({"op": "unsubscribe", "sub": "v1"})).await;
    client.send(subscribe_sorted("more", 10, "asc")).await;
    answer_of(&mut client, "more").await.expect("room after an unsubscribe");

    // Parked: still held; expired: released.
    drop(client);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = server.connect_as(Some(&alice)).await;
    client.send(subscribe_sorted("parked", 11, "asc")).await;
    assert_budget_refusal(&answer_of(&mut client, "parked").await.unwrap_err());
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.metric("ordo_sessions") > 1.0 {
        assert!(Instant::now() < deadline, "the parked session did not expire");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client.send(subscribe_sorted("expired", 12, "asc")).await;
    answer_of(&mut client, "expired").await.expect("room once the parked session expired");
    server.stop();
}

/// Views ended by a collection's drop are given back too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_collections_views_leave_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start(dir.path(), &[], StartOptions::default());
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let mut client = server.connect_as(Some(&alice)).await;
    let (_, refused) = fill(&mut client, 0, 128).await;
    assert_budget_refusal(&refused.expect("the budget is reached within one connection"));

    // The same collection again, under the same name: its views are new ones.
    server.ok("DELETE", "/v1/collections/rooms", json!(null));
    let ended = |client: &Client| client.frames.iter().any(|frame| frame["type"] == "ended");
    assert!(client.read_until(Duration::from_secs(10), ended).await);
    server.ok("PUT", "/v1/collections/rooms", common::room_schema());
    fill_rooms(&server);
    client.send(subscribe("after", 0)).await;
    answer_of(&mut client, "after").await.expect("room once the collection was dropped");
    server.stop();
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The close code the server sent on `socket`, reading past what came before it.
async fn close_code(socket: &mut Socket) -> Option<u16> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => return frame.map(|frame| u16::from(frame.code)),
            Ok(Some(Ok(_))) => continue,
            _ => return None,
        }
    }
}

/// Sockets that never authenticate, opened past the connection cap, cannot
/// keep a reader with a good token out: they have a small share of the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_sockets_cannot_lock_out_authenticated_users() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions { nofile: Some(200), ..StartOptions::default() };
    let (server, secret_file) = start(dir.path(), &["--auth-timeout", "30"], options);
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_connections = limits["max_connections"].as_u64().unwrap() as usize;
    assert!(max_connections <= 100, "{limits}");
    let url = format!("ws://127.0.0.1:{}/v1/ws", server.port);

    // Twice the cap of sockets without a token, held open.
    let mut anonymous = Vec::new();
    for _ in 0..2 * max_connections {
        if let Ok((socket, _)) = tokio_tungstenite::connect_async(url.as_str()).await {
            anonymous.push(socket);
        }
    }

    // They hold a small share of the cap: the oldest were closed (4401) to make room.
    let share = limits["max_unauthenticated_connections"].as_u64().unwrap() as usize;
    assert!(share < max_connections / 4, "{limits}");
    let evicted = server.metric("ordo_unauthenticated_connections_closed_total") as usize;
    assert!(evicted >= anonymous.len() - share, "{evicted} of {} closed", anonymous.len());
    assert_eq!(close_code(&mut anonymous[0]).await, Some(4401));

    // A reader with the token in the upgrade request gets in, every time.
    let bob = mint(&secret_file, "bob", "reader", &[]);
    for attempt in 0..5 {
        let mut request = url.as_str().into_client_request().unwrap();
        request.headers_mut().insert("Authorization", format!("Bearer {bob}").parse().unwrap());
        let connected = tokio_tungstenite::connect_async(request).await;
        assert!(connected.is_ok(), "attempt {attempt}: {:?}", connected.err());
    }
    // And so does one that authenticates with the `auth` message.
    let mut client = server.connect_as(Some(&bob)).await;
    client.send(subscribe("s", N_ITEMS - 1)).await;
    answer_of(&mut client, "s").await.expect("bob subscribes");
    drop(anonymous);
    server.stop();
}

/// The same for plain TCP: sockets that send nothing, or half a request head,
/// hold only a share of the cap, so a client that sends its request at once is
/// answered however many of them are open (before, they filled the cap and
/// everyone got `503` until the header timeout closed them).
#[test]
fn silent_sockets_cannot_lock_out_clients_that_send_requests() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions { nofile: Some(200), ..StartOptions::default() };
    let (server, secret_file) = start(dir.path(), &["--header-timeout", "60"], options);
    let (_, limits) = server.http("GET", "/v1/limits", None);
    let max_connections = limits["max_connections"].as_u64().unwrap() as usize;
    let mut silent = Vec::new();
    for index in 0..2 * max_connections {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", server.port)) else { continue };
        if index % 2 == 0 {
            let _ = stream.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n");
        }
        silent.push(stream);
    }
    // Each new one pushes out the oldest (or, when they came faster than the
    // oldest could be closed, met the cap); wait until the server holds no more
    // than the share of them (and this request). Until then a request of this
    // test may itself meet the full cap, so only answered ones count.
    let deadline = Instant::now() + Duration::from_secs(30);
    let share = limits["max_unauthenticated_connections"].as_u64().unwrap() as usize;
    loop {
        if let Some(open) = metric_if_answered(&server, "ordo_tcp_connections") {
            if open as usize <= share + 1 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "silent sockets still hold more than their share of the cap");
        std::thread::sleep(Duration::from_millis(50));
    }
    let bob = mint(&secret_file, "bob", "reader", &[]);
    for attempt in 0..5 {
        let (status, answer) = server.http_as(Some(&bob), "GET", "/v1/limits", None);
        assert_eq!(status, 200, "attempt {attempt}: {answer}");
    }
    drop(silent);
    server.stop();
}

/// A metric's value, or `None` when `/metrics` was not answered with 200 (a
/// request may meet the full cap, and be closed unanswered while refusals are
/// in flight).
fn metric_if_answered(server: &Server, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = server.token.as_ref().map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    if !answer.starts_with("HTTP/1.1 200") {
        return None;
    }
    answer.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
