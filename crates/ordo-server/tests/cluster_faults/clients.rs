//! The subscribers: each holds the same views on one node, checks every frame
//! (`seq` one by one, `write_seq` never going back), and when its node goes
//! away fails over to the next live one and resumes there.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::bench::Shared;
use crate::common::cluster::request;
use crate::common::{self, apply_frame, LocalList};
use crate::{COLLECTION, REQUEST_TIMEOUT};

/// The views the clients hold: one every write changes (the counters), one
/// at the head of all writes, one of one writer's.
fn client_views() -> Vec<(&'static str, Value)> {
    vec![
        ("counters", json!({"filter": {"field": "count", "op": "ge", "value": 0}, "limit": 10})),
        ("latest", json!({"sort": [{"field": "k", "dir": "desc"}], "limit": 10})),
        (
            "writer1",
            json!({"filter": {"all": [{"field": "writer", "op": "eq", "value": 1}, {"field": "count", "is_null": true}]},
                   "sort": [{"field": "k", "dir": "desc"}], "offset": 2, "limit": 5}),
        ),
    ]
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A subscriber that, when its node goes away, moves to the next live node
/// (round robin) and resumes there with `last_seq` and `min_seq` = the highest
/// `write_seq` it applied: as the client libraries do.
pub(crate) struct FailoverClient {
    pub(crate) name: String,
    pub(crate) node: usize,
    pub(crate) socket: Option<Socket>,
    pub(crate) session: String,
    pub(crate) lists: BTreeMap<String, LocalList>,
    pub(crate) write_seqs: BTreeMap<String, u64>,
    /// When the connection was lost because its node was killed: the gap runs
    /// from the kill to the first frame from another node.
    pub(crate) gap_from: Option<Instant>,
    pub(crate) n_failovers: u64,
    pub(crate) n_replayed: u64,
    pub(crate) n_reset: u64,
}

pub(crate) async fn connect(port: u16) -> Option<(Socket, String)> {
    let url = format!("ws://127.0.0.1:{port}/v1/ws");
    let (mut socket, _) =
        tokio::time::timeout(REQUEST_TIMEOUT, tokio_tungstenite::connect_async(url)).await.ok()?.ok()?;
    let welcome = tokio::time::timeout(REQUEST_TIMEOUT, socket.next()).await.ok()??.ok()?;
    let welcome: Value = serde_json::from_str(welcome.to_text().ok()?).ok()?;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    Some((socket, welcome["session"].as_str()?.to_owned()))
}

impl FailoverClient {
    pub(crate) async fn start(name: String, node: usize, port: u16, min_seq: u64) -> FailoverClient {
        let (mut socket, session) = connect(port).await.expect("connecting a client");
        for (sub, view) in client_views() {
            let mut message = view.clone();
            let extra = json!({"op": "subscribe", "sub": sub, "collection": COLLECTION, "min_seq": min_seq});
            message.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            socket.send(Message::text(message.to_string())).await.unwrap();
        }
        let mut client = FailoverClient {
            name,
            node,
            socket: Some(socket),
            session,
            lists: BTreeMap::new(),
            write_seqs: BTreeMap::new(),
            gap_from: None,
            n_failovers: 0,
            n_replayed: 0,
            n_reset: 0,
        };
        let deadline = Instant::now() + REQUEST_TIMEOUT * 3;
        while client.lists.len() < client_views().len() {
            assert!(Instant::now() < deadline, "{}: no first frames", client.name);
            client.read_one(Duration::from_millis(200), None).await;
        }
        client
    }

    /// Reads and applies one frame (waiting at most `wait`); marks the socket
    /// lost when it closes.
    async fn read_one(&mut self, wait: Duration, shared: Option<&Shared>) {
        let Some(socket) = self.socket.as_mut() else { return };
        let message = match tokio::time::timeout(wait, socket.next()).await {
            Err(_) => return,
            Ok(Some(Ok(Message::Text(text)))) => text,
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => {
                self.socket = None;
                if let Some(shared) = shared {
                    if let Some((node, at)) = *shared.killed.lock().unwrap() {
                        if node == self.node {
                            self.gap_from = Some(at);
                        }
                    }
                }
                return;
            }
            Ok(Some(Ok(_))) => return,
        };
        let frame: Value = serde_json::from_str(&message).expect("frames are JSON");
        match frame["type"].as_str().unwrap() {
            "diffs" => {
                let sub = frame["sub"].as_str().unwrap().to_owned();
                let write_seq = frame["write_seq"].as_u64().expect("write_seq");
                let last = self.write_seqs.entry(sub.clone()).or_default();
                assert!(
                    write_seq >= *last,
                    "{} sub {sub}: write_seq {write_seq} after {last}: the list went back in time",
                    self.name
                );
                *last = write_seq;
                // The `seq` check: one more than the last frame applied, across failovers too.
                apply_frame(self.lists.entry(sub).or_default(), &frame);
                if let (Some(from), Some(shared)) = (self.gap_from.take(), shared) {
                    shared.gaps.lock().unwrap().push(from.elapsed());
                }
            }
            other => panic!("{}: unexpected frame {other}: {frame}", self.name),
        }
    }

    /// Connects to the next live node after its own and resumes there.
    async fn fail_over(&mut self, shared: &Shared) -> bool {
        let ports = shared.ports.lock().unwrap().clone();
        let n = ports.len();
        let Some((node, port)) =
            (1..=n).map(|step| (self.node + step) % n).find_map(|node| ports[node].map(|port| (node, port)))
        else {
            return false;
        };
        let Some((mut socket, _)) = connect(port).await else { return false };
        let subs: Vec<Value> = client_views()
            .into_iter()
            .map(|(sub, view)| {
                let mut entry = view;
                entry["sub"] = json!(sub);
                entry["collection"] = json!(COLLECTION);
                entry["last_seq"] = json!(self.lists[sub].seq);
                entry["min_seq"] = json!(self.write_seqs[sub]);
                entry
            })
            .collect();
        let resume = json!({"op": "resume", "session": self.session, "subs": subs});
        if socket.send(Message::text(resume.to_string())).await.is_err() {
            return false;
        }
        let resumed = loop {
            match tokio::time::timeout(REQUEST_TIMEOUT * 3, socket.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => break serde_json::from_str::<Value>(&text).unwrap(),
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) | Err(_) => return false,
                Ok(Some(Ok(_))) => {}
            }
        };
        if resumed["type"] == "error" && matches!(resumed["code"].as_str(), Some("lagging" | "seq_not_reached")) {
            // A node that lags refuses subscribers: try the next one.
            self.node = node;
            return false;
        }
        assert_eq!(resumed["type"], "resumed", "{}: {resumed}", self.name);
        for entry in resumed["subs"].as_array().unwrap() {
            if entry["replayed"].is_u64() {
                self.n_replayed += 1;
            } else if entry["reset"] == true {
                self.n_reset += 1;
            } else {
                // A node that lags (or has not reached min_seq) refuses: try the next one.
                let code = entry["error"]["code"].as_str().unwrap_or("");
                assert!(matches!(code, "lagging" | "seq_not_reached"), "{}: {resumed}", self.name);
                self.node = node;
                return false;
            }
        }
        self.session = resumed["session"].as_str().unwrap().to_owned();
        self.socket = Some(socket);
        self.node = node;
        self.n_failovers += 1;
        true
    }

    /// Runs until the test says stop: reads frames, fails over when the node goes.
    pub(crate) async fn run(mut self, shared: Arc<Shared>) -> FailoverClient {
        while !shared.stop.load(Ordering::Relaxed) {
            if self.socket.is_none() {
                if !self.fail_over(&shared).await {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
            self.read_one(Duration::from_millis(100), Some(&shared)).await;
        }
        self
    }

    /// After the trial: reads until every list equals a one-shot query of its
    /// view on the client's node (which has applied `min_seq`).
    pub(crate) async fn settle(&mut self, port: u16, min_seq: u64, context: &str) {
        let mut expected = BTreeMap::new();
        for (sub, view) in client_views() {
            let mut body = view;
            body["min_seq"] = json!(min_seq);
            let path = format!("/v1/collections/{COLLECTION}/query");
            let (status, answer) = request(port, "POST", &path, Some(&body), Duration::from_secs(10)).unwrap();
            assert_eq!(status, 200, "{context}: {answer}");
            expected.insert(sub.to_owned(), common::query_items(&answer["items"]));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let equal = expected.iter().all(|(sub, items)| &self.lists[sub].items == items);
            if equal {
                return;
            }
            assert!(self.socket.is_some(), "{context}: {} lost its node after the trial", self.name);
            if Instant::now() > deadline {
                for (sub, items) in &expected {
                    assert_eq!(
                        &self.lists[sub].items, items,
                        "{context}: {} sub {sub} on o{}: the list is not the query's",
                        self.name, self.node
                    );
                }
            }
            self.read_one(Duration::from_millis(100), None).await;
        }
    }
}
