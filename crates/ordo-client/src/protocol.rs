//! The socket-free core: subscriptions (their lists, last `seq`, phase) and what each
//! server frame does to them. The live client drives one per connection and tells it
//! what it sends; the protocol vectors (`protocol/vectors/*.json`) drive one directly.
//!
//! Its one rule: a list is never silently wrong. A frame whose `seq` is not the next
//! one, whose diffs do not apply, or whose window digest is not the list's once they
//! are applied, changes nothing and is reported (`Gap`, `InvalidDiffs`,
//! `DigestMismatch`) so that the caller subscribes again. Each list's ids and
//! versions are kept beside it (`Record::rows`), whatever type its items decode to,
//! so the digest is computed before the list itself changes.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::digest::{digest_hex, window_digest, RowKey};
use crate::wire::{decode_diffs, Ended};

/// Where a list's items live. `apply` is all or nothing: on `Err` the list is unchanged.
pub trait ListSink: Send {
    /// Applies a frame's `diffs` (the JSON array). `Ok(true)` when they held a `Reset`.
    fn apply(&mut self, diffs: &Value) -> Result<bool, String>;
    /// The number of items held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `seq` of the frame just applied.
    fn set_seq(&mut self, _seq: u64) {}
    /// The frame's `total` (the view's length), when it carried one.
    fn set_total(&mut self, _total: u64) {}
    /// The frame's `write_seq`, when it carried one.
    fn set_write_seq(&mut self, _write_seq: u64) {}
    /// The server ended the subscription (`ended`), or refused it (`error`).
    fn end(&mut self, _ended: Ended) {}
    /// A refused request or lost frames, for the list's status.
    fn note_error(&mut self, _error: String) {}
    /// A frame's window digest was not the list's (the frame was not applied).
    fn note_digest_mismatch(&mut self) {}
}

impl ListSink for Box<dyn ListSink> {
    fn apply(&mut self, diffs: &Value) -> Result<bool, String> {
        (**self).apply(diffs)
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn set_seq(&mut self, seq: u64) {
        (**self).set_seq(seq)
    }
    fn set_total(&mut self, total: u64) {
        (**self).set_total(total)
    }
    fn set_write_seq(&mut self, write_seq: u64) {
        (**self).set_write_seq(write_seq)
    }
    fn end(&mut self, ended: Ended) {
        (**self).end(ended)
    }
    fn note_error(&mut self, error: String) {
        (**self).note_error(error)
    }
    fn note_digest_mismatch(&mut self) {
        (**self).note_digest_mismatch()
    }
}

/// A list of raw JSON items: what the protocol vectors compare.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonList {
    pub items: imbl::Vector<Value>,
    pub total: Option<u64>,
    pub ended: Option<Ended>,
}

impl JsonList {
    pub fn new(items: Vec<Value>) -> JsonList {
        JsonList { items: items.into(), ..JsonList::default() }
    }
}

impl ListSink for JsonList {
    fn apply(&mut self, diffs: &Value) -> Result<bool, String> {
        let decoded = crate::wire::decode_diffs::<Value>(diffs, self.items.len())?;
        let reset = decoded.iter().any(|diff| diff.is_reset());
        for diff in decoded {
            eyeball_im::VectorDiff::from(diff).apply(&mut self.items);
        }
        Ok(reset)
    }
    fn len(&self) -> usize {
        self.items.len()
    }
    fn set_total(&mut self, total: u64) {
        self.total = Some(total);
    }
    fn end(&mut self, ended: Ended) {
        self.ended = Some(ended);
    }
}

/// Where a subscription stands, as far as frames go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A `subscribe` (or a resetting `resume`) is on its way: the next frame must have `seq` + 1;
    /// an error naming it means the subscribe was refused.
    Subscribing,
    /// Frames apply in `seq` order; an error naming it is a refused request.
    Live,
    /// The client sent `unsubscribe` then `subscribe` again (after a gap): frames are ignored
    /// until `unsubscribed`, then it is `Subscribing` from `seq` 0. The list stays as it was.
    Restarting,
    /// The client sent `unsubscribe`: frames are ignored until `unsubscribed` removes it.
    Closing,
}

/// `welcome.auth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WelcomeAuth {
    /// The server runs without auth.
    None,
    /// Send an `auth` message first.
    Required,
    /// The upgrade request already carried a valid token.
    Authed(Identity),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub sub: String,
    pub role: String,
    pub expires_at: u64,
}

/// Which subscription the server refused something for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The subscription was refused and is gone.
    Subscribe,
    /// A request (`set_range`, `set_view`) on a live subscription; it is as it was.
    Request,
}

/// What a frame means. `Change` is the only one that changes a list.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Welcome {
        session: String,
        auth: WelcomeAuth,
    },
    Authed(Identity),
    AuthExpired {
        grace_secs: u64,
    },
    Error {
        code: String,
        message: String,
        sub: Option<String>,
        refused: Option<Refused>,
        req: Option<String>,
    },
    Unsubscribed {
        sub: String,
    },
    Resumed {
        session: String,
        replayed: Vec<String>,
        reset: Vec<String>,
        failed: Vec<(String, String, String)>,
    },
    /// The frame's `seq` is not the next one: it was not applied; subscribe again.
    Gap {
        sub: String,
        expected_seq: u64,
        got_seq: u64,
    },
    /// The frame's diffs do not apply (or do not decode): nothing was applied; subscribe again.
    InvalidDiffs {
        sub: String,
        seq: u64,
        message: String,
    },
    /// The frame's window digest (`expected`) is not the digest of the list its diffs
    /// give (`got`): the list is not the server's window. Nothing was applied; subscribe again.
    DigestMismatch {
        sub: String,
        seq: u64,
        expected: String,
        got: String,
    },
    Change {
        sub: String,
        seq: u64,
        reset: bool,
        req: Option<String>,
    },
    /// The server ended the subscription; it is gone.
    Ended {
        sub: String,
        reason: String,
        message: String,
    },
    /// A request that changed nothing (`{"type":"ack"}`).
    Ack {
        sub: Option<String>,
        req: Option<String>,
    },
    /// A frame this client cannot read; `sub` names the list it may have concerned
    /// (`None`: any list may have lost data).
    Protocol {
        message: String,
        sub: Option<String>,
    },
    /// The node refused to subscribe (or resume) a list for a reason another node may not
    /// have: `lagging` (the node is too far behind its cluster's log to take subscribers),
    /// or, for a list that has shown data, `seq_not_reached` (it has not caught up with the
    /// list's `floor_seq`). The list keeps its items and stays here, `Subscribing` from
    /// `seq` 0; the client moves to another node (or tries this one again later).
    Behind {
        sub: String,
        message: String,
    },
}

/// The code of a refusal for want of a `min_seq` the node has not reached.
const SEQ_NOT_REACHED: &str = "seq_not_reached";
/// The code of a node too far behind its cluster's log to take subscribers.
const LAGGING: &str = "lagging";

/// A refusal that another node may not give (see `Event::Behind`).
fn another_node_may_take(code: &str, floor: Option<u64>) -> bool {
    code == LAGGING || (code == SEQ_NOT_REACHED && floor.is_some())
}

struct Record<S> {
    sink: S,
    seq: u64,
    phase: Phase,
    /// The greatest `write_seq` applied (`None`: none yet): the `min_seq` of every later
    /// subscribe or resume of this list, so it never goes back in time.
    floor: Option<u64>,
    /// The list's ids and versions, in order: what its window digest hashes.
    rows: imbl::Vector<RowKey>,
}

/// The subscriptions of one client and the session to resume them with.
pub struct ProtocolState<S> {
    /// The session to present in the next `resume`: from `welcome`, replaced by every `resumed`.
    pub session: Option<String>,
    subs: BTreeMap<String, Record<S>>,
}

impl<S: ListSink> Default for ProtocolState<S> {
    fn default() -> Self {
        ProtocolState { session: None, subs: BTreeMap::new() }
    }
}

fn str_of<'a>(frame: &'a Value, key: &str) -> Option<&'a str> {
    frame.get(key).and_then(Value::as_str)
}

fn identity(frame: &Value) -> Option<Identity> {
    Some(Identity {
        sub: str_of(frame, "sub")?.to_owned(),
        role: str_of(frame, "role")?.to_owned(),
        expires_at: frame.get("expires_at")?.as_u64()?,
    })
}

fn preview(frame: &Value) -> String {
    let text = frame.to_string();
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

impl<S: ListSink> ProtocolState<S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a subscription holding `sink` whose last applied frame is `seq`
    /// (0: nothing yet; it is then `Subscribing`).
    pub fn seed(&mut self, sub: &str, sink: S, seq: u64) {
        let phase = if seq == 0 { Phase::Subscribing } else { Phase::Live };
        self.subs.insert(sub.to_owned(), Record { sink, seq, phase, floor: None, rows: imbl::Vector::new() });
    }

    /// The ids and versions of the items a seeded list holds (what `seed` cannot read
    /// from a sink of any item type), so that the next frame's digest can be checked.
    pub fn seed_rows(&mut self, sub: &str, items: &[Value]) -> Result<(), String> {
        let rows = items
            .iter()
            .map(|item| {
                serde::Deserialize::deserialize(item).map_err(|error| format!("an item without an id: {error}"))
            })
            .collect::<Result<imbl::Vector<RowKey>, String>>()?;
        if let Some(record) = self.subs.get_mut(sub) {
            record.rows = rows;
        }
        Ok(())
    }

    /// The client sends `subscribe`.
    pub fn subscribe(&mut self, sub: &str, sink: S) {
        self.seed(sub, sink, 0);
    }

    /// The client sends `unsubscribe` then `subscribe` again for `sub`: its list stays as
    /// it is until the new subscription's first frame (a Reset) replaces it.
    pub fn restart(&mut self, sub: &str) {
        if let Some(record) = self.subs.get_mut(sub) {
            record.phase = Phase::Restarting;
        }
    }

    /// The client subscribes `sub` afresh (it could not be resumed): the next frame has `seq` 1.
    /// The list stays as it is until that frame's Reset.
    pub fn resubscribe(&mut self, sub: &str) {
        if let Some(record) = self.subs.get_mut(sub) {
            record.seq = 0;
            record.phase = Phase::Subscribing;
        }
    }

    /// The client sends `unsubscribe`.
    pub fn unsubscribe(&mut self, sub: &str) {
        if let Some(record) = self.subs.get_mut(sub) {
            record.phase = Phase::Closing;
        }
    }

    /// Forgets a subscription at once (closed while disconnected).
    pub fn forget(&mut self, sub: &str) -> Option<S> {
        self.subs.remove(sub).map(|record| record.sink)
    }

    /// The greatest `write_seq` the list has applied (`None`: none yet, or a server that
    /// sends none): what a subscribe or resume of it asks for as `min_seq`.
    pub fn floor_seq(&self, sub: &str) -> Option<u64> {
        self.subs.get(sub).and_then(|record| record.floor)
    }

    pub fn contains(&self, sub: &str) -> bool {
        self.subs.contains_key(sub)
    }

    pub fn phase(&self, sub: &str) -> Option<Phase> {
        self.subs.get(sub).map(|record| record.phase)
    }

    pub fn sink(&self, sub: &str) -> Option<&S> {
        self.subs.get(sub).map(|record| &record.sink)
    }

    pub fn sink_mut(&mut self, sub: &str) -> Option<&mut S> {
        self.subs.get_mut(sub).map(|record| &mut record.sink)
    }

    /// Every subscription that is not closing: its id, list and last `seq`.
    pub fn live(&self) -> impl Iterator<Item = (&str, &S, u64)> {
        self.subs
            .iter()
            .filter(|(_, record)| record.phase != Phase::Closing)
            .map(|(sub, record)| (sub.as_str(), &record.sink, record.seq))
    }

    /// The connection dropped and the client is about to `resume`: closing subscriptions
    /// are forgotten (the resume does not list them, so the server closes them),
    /// restarting ones start over from `seq` 0. Returns each one to list with its `last_seq`.
    pub fn prepare_resume(&mut self) -> Vec<(String, u64)> {
        self.subs.retain(|_, record| record.phase != Phase::Closing);
        self.subs
            .iter_mut()
            .map(|(sub, record)| {
                if record.phase == Phase::Restarting {
                    record.seq = 0;
                    record.phase = Phase::Subscribing;
                }
                (sub.clone(), record.seq)
            })
            .collect()
    }

    /// Handles one server frame and returns what it means.
    pub fn handle_frame(&mut self, frame: &Value) -> Vec<Event> {
        let Some(kind) = str_of(frame, "type") else {
            return vec![self.unreadable(frame, format!("a frame without a type: {}", preview(frame)))];
        };
        match kind {
            "welcome" => self.on_welcome(frame),
            "authed" => match identity(frame) {
                Some(identity) => vec![Event::Authed(identity)],
                None => vec![Event::Protocol {
                    message: format!("an authed frame without sub, role or expires_at: {}", preview(frame)),
                    sub: None,
                }],
            },
            "auth_expired" => {
                vec![Event::AuthExpired { grace_secs: frame.get("grace_secs").and_then(Value::as_u64).unwrap_or(0) }]
            }
            "diffs" => self.on_diffs(frame),
            "error" => self.on_error(frame),
            "unsubscribed" => self.on_unsubscribed(frame),
            "resumed" => self.on_resumed(frame),
            "ended" => self.on_ended(frame),
            "ack" => vec![Event::Ack {
                sub: str_of(frame, "sub").map(str::to_owned),
                req: str_of(frame, "req").map(str::to_owned),
            }],
            // A newer server's frame: ignored, as the protocol's versioning allows.
            _ => Vec::new(),
        }
    }

    /// The event for a frame that cannot be read: which list it may have concerned.
    pub fn unreadable(&self, frame: &Value, message: String) -> Event {
        let sub = str_of(frame, "sub").filter(|sub| self.subs.contains_key(*sub)).map(str::to_owned);
        Event::Protocol { message, sub }
    }

    fn on_welcome(&mut self, frame: &Value) -> Vec<Event> {
        let Some(session) = str_of(frame, "session") else {
            return vec![Event::Protocol { message: "a welcome without a session".to_owned(), sub: None }];
        };
        let auth = match frame.get("auth") {
            None | Some(Value::Null) => WelcomeAuth::None,
            Some(Value::String(text)) if text == "none" => WelcomeAuth::None,
            // A form this client does not know is taken as "required": a client with a token sends it.
            Some(value) => identity(value).map_or(WelcomeAuth::Required, WelcomeAuth::Authed),
        };
        self.session = Some(session.to_owned());
        vec![Event::Welcome { session: session.to_owned(), auth }]
    }

    fn on_diffs(&mut self, frame: &Value) -> Vec<Event> {
        let (Some(sub), Some(seq), Some(diffs)) = (
            str_of(frame, "sub"),
            frame.get("seq").and_then(Value::as_u64),
            frame.get("diffs").filter(|d| d.is_array()),
        ) else {
            return vec![
                self.unreadable(frame, format!("a diffs frame without a sub, a seq or diffs: {}", preview(frame)))
            ];
        };
        let Some(record) = self.subs.get_mut(sub) else { return Vec::new() };
        if matches!(record.phase, Phase::Closing | Phase::Restarting) {
            return Vec::new();
        }
        if seq != record.seq + 1 {
            return vec![Event::Gap { sub: sub.to_owned(), expected_seq: record.seq + 1, got_seq: seq }];
        }
        let rows = match apply_to_rows(&record.rows, diffs) {
            Ok(rows) => rows,
            Err(message) => return vec![Event::InvalidDiffs { sub: sub.to_owned(), seq, message }],
        };
        if let Some(expected) = frame.get("digest") {
            let got = digest_hex(window_digest(&rows));
            if expected.as_str() != Some(got.as_str()) {
                record.sink.note_digest_mismatch();
                let expected = expected.as_str().map_or_else(|| expected.to_string(), str::to_owned);
                return vec![Event::DigestMismatch { sub: sub.to_owned(), seq, expected, got }];
            }
        }
        let reset = match record.sink.apply(diffs) {
            Ok(reset) => reset,
            Err(message) => return vec![Event::InvalidDiffs { sub: sub.to_owned(), seq, message }],
        };
        record.rows = rows;
        record.seq = seq;
        record.phase = Phase::Live;
        record.sink.set_seq(seq);
        if let Some(total) = frame.get("total").and_then(Value::as_u64) {
            record.sink.set_total(total);
        }
        if let Some(write_seq) = frame.get("write_seq").and_then(Value::as_u64) {
            record.sink.set_write_seq(write_seq);
            record.floor = Some(record.floor.map_or(write_seq, |floor| floor.max(write_seq)));
        }
        vec![Event::Change { sub: sub.to_owned(), seq, reset, req: str_of(frame, "req").map(str::to_owned) }]
    }

    fn on_error(&mut self, frame: &Value) -> Vec<Event> {
        let code = str_of(frame, "code").unwrap_or("internal").to_owned();
        let message = str_of(frame, "message").unwrap_or(&code).to_owned();
        let req = str_of(frame, "req").map(str::to_owned);
        let Some(sub) = str_of(frame, "sub") else {
            return vec![Event::Error { code, message, sub: None, refused: None, req }];
        };
        let mut refused = None;
        if let Some(record) = self.subs.get_mut(sub) {
            match record.phase {
                Phase::Subscribing if another_node_may_take(&code, record.floor) => {
                    record.sink.note_error(format!("{code}: {message}"));
                    record.seq = 0;
                    return vec![Event::Behind { sub: sub.to_owned(), message }];
                }
                Phase::Subscribing => {
                    // A refused subscribe creates nothing.
                    let mut record = self.subs.remove(sub).expect("present");
                    record.sink.end(Ended { reason: code.clone(), message: message.clone() });
                    refused = Some(Refused::Subscribe);
                }
                Phase::Live => refused = Some(Refused::Request),
                // The unsubscribe found nothing to close: the new subscribe's answer is next.
                Phase::Restarting if code == "unknown_subscription" => {
                    record.seq = 0;
                    record.phase = Phase::Subscribing;
                }
                Phase::Closing if code == "unknown_subscription" => {
                    self.subs.remove(sub);
                }
                Phase::Restarting | Phase::Closing => {}
            }
        }
        vec![Event::Error { code, message, sub: Some(sub.to_owned()), refused, req }]
    }

    fn on_unsubscribed(&mut self, frame: &Value) -> Vec<Event> {
        let Some(sub) = str_of(frame, "sub") else {
            return vec![self.unreadable(frame, "an unsubscribed frame without a sub".to_owned())];
        };
        if let Some(record) = self.subs.get_mut(sub) {
            if record.phase == Phase::Restarting {
                // The old subscription is gone; the new one's first frame has seq 1.
                record.seq = 0;
                record.phase = Phase::Subscribing;
                return Vec::new();
            }
        }
        self.subs.remove(sub);
        vec![Event::Unsubscribed { sub: sub.to_owned() }]
    }

    fn on_resumed(&mut self, frame: &Value) -> Vec<Event> {
        if let Some(session) = str_of(frame, "session") {
            self.session = Some(session.to_owned());
        }
        let (mut replayed, mut reset, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        let mut behind = Vec::new();
        for entry in frame.get("subs").and_then(Value::as_array).into_iter().flatten() {
            let Some(sub) = str_of(entry, "sub") else { continue };
            if let Some(error) = entry.get("error").filter(|error| error.is_object()) {
                let code = str_of(error, "code").unwrap_or("internal").to_owned();
                let message = str_of(error, "message").unwrap_or(&code).to_owned();
                if let Some(record) = self.subs.get_mut(sub).filter(|record| another_node_may_take(&code, record.floor))
                {
                    // Kept: the list is subscribed again (elsewhere) with the same floor.
                    record.sink.note_error(format!("{code}: {message}"));
                    record.seq = 0;
                    record.phase = Phase::Subscribing;
                    behind.push(Event::Behind { sub: sub.to_owned(), message });
                    continue;
                }
                if let Some(mut record) = self.subs.remove(sub) {
                    record.sink.end(Ended { reason: code.clone(), message: message.clone() });
                }
                failed.push((sub.to_owned(), code, message));
            } else if entry.get("reset") == Some(&Value::Bool(true)) {
                reset.push(sub.to_owned());
            } else {
                replayed.push(sub.to_owned());
            }
        }
        let session = self.session.clone().unwrap_or_default();
        let mut events = vec![Event::Resumed { session, replayed, reset, failed }];
        events.append(&mut behind);
        events
    }

    fn on_ended(&mut self, frame: &Value) -> Vec<Event> {
        let Some(sub) = str_of(frame, "sub") else {
            return vec![self.unreadable(frame, "an ended frame without a sub".to_owned())];
        };
        let reason = str_of(frame, "reason").unwrap_or("ended").to_owned();
        let message = str_of(frame, "message").unwrap_or(&reason).to_owned();
        match self.subs.get(sub).map(|record| record.phase) {
            // The client already sent `unsubscribe` + `subscribe`: the unsubscribe is
            // answered `unknown_subscription` (the id is free), then the new subscribe's
            // answer follows; `on_error` moves it on.
            Some(Phase::Restarting) => {}
            Some(_) => {
                let mut record = self.subs.remove(sub).expect("present");
                record.sink.end(Ended { reason: reason.clone(), message: message.clone() });
            }
            None => {}
        }
        vec![Event::Ended { sub: sub.to_owned(), reason, message }]
    }
}

/// `rows` after a frame's diffs, on a copy (O(1) for imbl): the list's ids and
/// versions as the frame leaves them, or why the diffs do not apply.
fn apply_to_rows(rows: &imbl::Vector<RowKey>, diffs: &Value) -> Result<imbl::Vector<RowKey>, String> {
    let mut rows = rows.clone();
    for diff in decode_diffs::<RowKey>(diffs, rows.len())? {
        eyeball_im::VectorDiff::from(diff).apply(&mut rows);
    }
    Ok(rows)
}
