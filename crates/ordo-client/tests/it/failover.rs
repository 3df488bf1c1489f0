//! Failover across node URLs against two real `ordo serve` processes holding the same
//! data (written by the test, in the same order, so both reach the same `seq`): SIGKILL
//! of the node in use, a node behind the list's `write_seq`, and the HTTP helpers'
//! retry of reads (never of writes) on the next node.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ordo_client::{Auth, Backoff, Client, Error, Field, Item, LiveList, Op, VectorDiff, View};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::server::Server;

type Note = Item<Value>;

/// A port nothing listens on: connections are refused.
const DEAD: &str = "http://127.0.0.1:1";

struct Nodes {
    /// `None` once killed.
    a: Option<Server>,
    b: Server,
    a_url: String,
    token: String,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Nodes {
    /// Two single-node servers (same auth secret) with an empty `notes` collection each.
    async fn start() -> Nodes {
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Server::start(dirs.0.path(), 0);
        let b = Server::start(dirs.1.path(), 0);
        let token = a.mint("ops", "admin", 3600);
        let nodes = Nodes { a_url: a.url(), a: Some(a), b, token, _dirs: dirs };
        for url in [nodes.a_url.clone(), nodes.b.url()] {
            nodes.admin(&url).http().create_collection("notes", &[Field::new("rank", "u64")]).await.unwrap();
        }
        nodes
    }

    fn admin(&self, url: &str) -> Client {
        Client::builder(url).auth(Auth::Token(self.token.clone())).build()
    }

    /// The same batch on each of `urls`, in order; the last answer's `seq`.
    async fn write(&self, urls: &[String], ids: std::ops::Range<u64>, rank: impl Fn(u64) -> u64) -> u64 {
        let ops: Vec<Op> = ids.map(|n| Op::upsert(format!("n{n:03}"), json!({"rank": rank(n)})).into()).collect();
        let mut seq = 0;
        for url in urls {
            seq = self.admin(url).http().write("notes", &ops).await.unwrap().seq;
        }
        seq
    }
}

fn view() -> View {
    View::new().sort(json!([{"field": "rank", "dir": "desc"}])).range(0, 5)
}

fn ids(items: impl IntoIterator<Item = Note>) -> Vec<(String, Value)> {
    items.into_iter().map(|item| (item.id, item.fields)).collect()
}

/// Waits until the list equals the one-shot query of its view on `url`.
async fn settles_to(admin: &Client, list: &LiveList<Note>, step: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let expected = ids(admin.http().query::<Note>("notes", &view()).await.unwrap().items);
        let got = ids(list.items());
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{step}: the list never matched the query\n list: {got:?}\nquery: {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn fast() -> Backoff {
    Backoff { min: Duration::from_millis(20), max: Duration::from_millis(200) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_node_in_use_moves_the_list_to_the_other_node() {
    let mut nodes = Nodes::start().await;
    let (a, b) = (nodes.a_url.clone(), nodes.b.url());
    nodes.write(&[a.clone(), b.clone()], 0..8, |n| n * 37 % 101).await;
    let client =
        Client::builder(vec![a.clone(), b.clone()]).auth(Auth::Token(nodes.token.clone())).backoff(fast()).build();
    let list = client.subscribe::<Note>("notes", view()).unwrap();
    settles_to(&nodes.admin(&a), &list, "on A").await;
    assert_eq!(*client.node().borrow(), a);
    let floor = list.status().write_seq.expect("frames carry write_seq");
    let (_, mut stream) = list.entries();

    nodes.a.take().expect("A runs").kill();
    let node = client.node();
    until("the client is served by B", || *node.borrow() == b).await;
    assert_eq!(client.current_url(), b);
    let admin_b = nodes.admin(&b);
    settles_to(&admin_b, &list, "on B after the failover").await;
    // B does not know A's session: the list came back through a Reset, never older.
    let mut saw_reset = false;
    while let Some(Some(batch)) = futures_util::FutureExt::now_or_never(stream.next()) {
        saw_reset |= batch.iter().any(|diff| matches!(diff, VectorDiff::Reset { .. }));
    }
    assert!(saw_reset, "the failover's first frame is a Reset");
    assert!(list.status().write_seq >= Some(floor));

    // Writes on B after the failover reach the list.
    nodes.write(std::slice::from_ref(&b), 8..14, |n| n * 37 % 101).await;
    settles_to(&admin_b, &list, "a write on B").await;
    assert!(list.ended().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_list_is_not_shown_until_it_catches_up() {
    let mut nodes = Nodes::start().await;
    let (a, b) = (nodes.a_url.clone(), nodes.b.url());
    nodes.write(&[a.clone(), b.clone()], 0..5, |n| n).await;
    // A runs two batches ahead of B, with the top ranks (the window shows them).
    let high = |n: u64| 1000 + n;
    nodes.write(std::slice::from_ref(&a), 5..9, high).await;
    let ahead = nodes.write(std::slice::from_ref(&a), 9..13, high).await;
    let client =
        Client::builder(vec![a.clone(), b.clone()]).auth(Auth::Token(nodes.token.clone())).backoff(fast()).build();
    let list = client.subscribe::<Note>("notes", view()).unwrap();
    settles_to(&nodes.admin(&a), &list, "on A").await;
    assert_eq!(list.status().write_seq, Some(ahead));
    let on_a = ids(list.items());

    nodes.a.take().expect("A runs").kill();
    // B holds the resume until it reaches `ahead` (5 s), then refuses it; the client keeps
    // A's list and tries again (A is dead: B again).
    until("seq_not_reached reported on the list", || {
        list.status().last_error.is_some_and(|error| error.starts_with("seq_not_reached"))
    })
    .await;
    assert_eq!(ids(list.items()), on_a, "B's older list was not shown");
    assert_eq!(list.status().write_seq, Some(ahead));
    assert!(list.ended().is_none());

    // B catches up (the same two batches): the list comes back from B.
    nodes.write(std::slice::from_ref(&b), 5..9, high).await;
    nodes.write(std::slice::from_ref(&b), 9..13, high).await;
    let admin_b = nodes.admin(&b);
    settles_to(&admin_b, &list, "on B once it caught up").await;
    assert_eq!(ids(list.items()), on_a);
    // The list is live on B again: B's next write (new top ranks) reaches it.
    nodes.write(std::slice::from_ref(&b), 13..15, high).await;
    settles_to(&admin_b, &list, "a write on B once it caught up").await;
    assert_ne!(ids(list.items()), on_a);
    assert_eq!(*client.node().borrow(), b);
    assert!(list.status().write_seq > Some(ahead));
}

/// A server that answers every request `503 lagging`, as a node that lags does.
async fn lagging_node() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let body = r#"{"error":{"code":"lagging","message":"the node lags"}}"#;
                let answer = format!(
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sends_reads_again_on_the_next_node_but_never_a_write() {
    let nodes = Nodes::start().await;
    let b = nodes.b.url();
    nodes.write(std::slice::from_ref(&b), 0..3, |n| n).await;
    let client = Client::builder(vec![DEAD.to_owned(), b.clone()]).auth(Auth::Token(nodes.token.clone())).build();
    let http = client.http();
    assert_eq!(http.current_url(), DEAD);
    // A read: A refuses the connection, B answers.
    assert_eq!(http.collection("notes").await.unwrap().name, "notes");
    assert_eq!(http.current_url(), b);
    assert_eq!(http.query::<Note>("notes", &view()).await.unwrap().items.len(), 3);

    // A write to a dead node is not sent again: the error comes back, B has nothing.
    let writer = Client::builder(vec![DEAD.to_owned(), b.clone()]).auth(Auth::Token(nodes.token.clone())).build();
    let error = writer.http().write("notes", &[Op::remove("n000")]).await.unwrap_err();
    assert!(matches!(error, Error::Transport(_)), "{error}");
    assert!(writer.http().get_item::<Note>("notes", "n000").await.unwrap().is_some(), "the write was not retried on B");
    // The next request goes to B.
    assert_eq!(writer.http().current_url(), b);
    writer.http().write("notes", &[Op::remove("n000")]).await.unwrap();

    // Every node refused: the last error.
    let none = Client::builder(vec![DEAD.to_owned(), "http://127.0.0.1:2".to_owned()]).build();
    assert!(matches!(none.http().collection("notes").await, Err(Error::Transport(_))));

    // 503 (a lagging node): reads move on, writes do not.
    let lagging = lagging_node().await;
    let reader = Client::builder(vec![lagging.clone(), b.clone()]).auth(Auth::Token(nodes.token.clone())).build();
    assert_eq!(reader.http().query::<Note>("notes", &view()).await.unwrap().items.len(), 2);
    let writer = Client::builder(vec![lagging, b]).auth(Auth::Token(nodes.token.clone())).build();
    let error = writer.http().write("notes", &[Op::remove("n001")]).await.unwrap_err();
    assert_eq!(error.code(), Some("lagging"), "{error}");
}
