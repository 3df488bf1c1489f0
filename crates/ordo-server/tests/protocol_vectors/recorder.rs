//! The WebSocket client that records a case from the live server: every frame
//! it gets, with the lists (and `total`s) it holds after it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::case::expectation;
use crate::common::{Client, LocalList, Server};
use crate::rooms::query;

pub(crate) const SETTLE: Duration = Duration::from_secs(5);
/// After the last action of a case: how long no frame may arrive before it ends.
const QUIET: Duration = Duration::from_millis(300);

/// A WebSocket client that records every frame it gets, with what it holds after it.
pub(crate) struct Recorder {
    pub(crate) client: Client,
    pub(crate) steps: Vec<Value>,
    /// Session ids are random: the corpus names them `session-1`, `session-2`, ...
    pub(crate) sessions: BTreeMap<String, String>,
    /// Requests sent, for their ids (`req`).
    n_requests: u64,
    /// The last `total` each subscription got (frames without one leave it as it was).
    totals: BTreeMap<String, u64>,
}

impl Recorder {
    /// Connects holding `lists` (what the client had before: nothing, fresh
    /// subscriptions it is about to make, or the lists of a dropped connection).
    pub(crate) async fn connect(
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

    pub(crate) async fn next(&mut self, timeout: Duration) -> Option<Value> {
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
    pub(crate) async fn request(&mut self, mut message: Value) -> Value {
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
    pub(crate) async fn send(&mut self, message: Value) {
        self.client.send(message).await;
    }

    /// Reads frames until every subscription in `views` equals a one-shot query.
    pub(crate) async fn settle(&mut self, server: &Server, views: &[Value], context: &str) {
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
    pub(crate) async fn until_frame(&mut self, kind: &str) -> Value {
        loop {
            let frame = self.next(SETTLE).await.unwrap_or_else(|| panic!("no `{kind}` frame came"));
            if frame["type"] == kind {
                return frame;
            }
        }
    }

    /// Records what still arrives until the connection has been quiet for `QUIET`.
    pub(crate) async fn drain(&mut self) {
        while self.next(QUIET).await.is_some() {}
    }
}

/// Lists of subscriptions about to be made: empty, nothing applied yet.
pub(crate) fn fresh(subs: &[&str]) -> BTreeMap<String, LocalList> {
    subs.iter().map(|sub| (sub.to_string(), LocalList::default())).collect()
}
