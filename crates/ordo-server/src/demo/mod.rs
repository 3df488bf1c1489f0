//! The web demo: the page's static files (embedded in the binary, so `ordo serve`
//! needs nothing else at run time) and, with `ordo serve --demo`, the flagship
//! chat: rooms shared among their members, each member's room list live through
//! its memberships, messages readable by the rooms' members, a backend endpoint
//! to send a message and a traffic simulator that keeps the chat moving.
//!
//! Modules: `chat` (the generated chat), `seed` (collections, data and rules at
//! start), `backend` (writes as an app's backend would), `simulator`.

mod backend;
pub mod chat;
pub mod seed;
pub mod simulator;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::access::Gate;
use crate::cluster::Cluster;
use crate::demo_data::{self, MEMBERS, MESSAGES, ROOMS};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::routing::Routes;
use crate::submit::Submitter;
use crate::writer::WriterSender;
use backend::Backend;
use chat::{membership_id, Chat};
pub use simulator::{parse_rate_request, Simulator, Zipf, ZIPF_EXPONENT};

const INDEX_HTML: &str = include_str!("../../demo/index.html");
const APP_JS: &str = include_str!("../../demo/app.js");
const STYLE_CSS: &str = include_str!("../../demo/style.css");
/// The TypeScript client's browser bundle (`clients/typescript`, `dist/ordo-client.js`).
const CLIENT_JS: &str = include_str!("../../demo/ordo-client.js");

/// The demo page's files by name under `/demo/`: (content type, body). `""` is the page.
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "" | "index.html" => ("text/html; charset=utf-8", INDEX_HTML),
        "app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "style.css" => ("text/css; charset=utf-8", STYLE_CSS),
        "ordo-client.js" => ("text/javascript; charset=utf-8", CLIENT_JS),
        _ => return None,
    })
}

/// Where the demo's chat comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatSource {
    /// Generated at start, moved by the simulator and `POST /demo/send`.
    Generated,
    /// `rooms`, `members` and `messages` follow PostgreSQL tables (`--pg-table`,
    /// `make pg-demo`): read-only here, so the demo installs only its rules
    /// and hands out tokens; a message is an INSERT in PostgreSQL.
    Postgres,
}

/// The chat's source from the followed collections: all three of the demo's
/// collections followed, or none.
pub fn chat_source(followed: &HashSet<String>) -> Result<ChatSource, String> {
    let n_followed = [ROOMS, MEMBERS, MESSAGES].iter().filter(|name| followed.contains(**name)).count();
    match n_followed {
        0 => Ok(ChatSource::Generated),
        3 => Ok(ChatSource::Postgres),
        _ => Err(format!(
            "--demo with --pg-table follows `{ROOMS}`, `{MEMBERS}` and `{MESSAGES}` all three (the chat is then PostgreSQL's), or none of them"
        )),
    }
}

/// The demo's state, shared by the simulator and the HTTP handlers.
pub struct Demo {
    pub source: ChatSource,
    pub simulator: Simulator,
    backend: Backend,
    chat: Chat,
    room_index: HashMap<String, usize>,
    /// Each room's last message number, by room index: a message's number is
    /// taken here before it is written, so two writers never take the same one.
    last_seqs: Mutex<Vec<u64>>,
}

/// What `start` found or wrote.
pub struct DemoStart {
    pub demo: Arc<Demo>,
    pub n_rooms_written: usize,
}

/// Makes sure the chat's collections exist (writing the chat into an empty
/// `rooms`), installs the flagship's rules, then starts the simulator. Runs on
/// the network runtime, after the writer thread started.
///
/// In cluster mode (`cluster`), the node first applies the stream as it stood at
/// start, then creates, seeds and installs only what is still missing, through
/// the stream. Every node runs its own simulator (`--demo-rate` each; `make
/// cluster` runs one, on the first node).
pub async fn start(
    writer: &WriterSender,
    routes: &Routes,
    gate: &Gate,
    rate: u32,
    shutdown: watch::Receiver<bool>,
    cluster: Option<Arc<Cluster>>,
    source: ChatSource,
) -> Result<DemoStart, String> {
    let simulator = Simulator::new(rate).map_err(|error| format!("--demo-rate: {}", error.message))?;
    if source == ChatSource::Postgres {
        return start_on_followed(writer, routes, gate).await;
    }
    if let Some(cluster) = &cluster {
        catch_up(cluster).await?;
    }
    let submit = match &cluster {
        Some(cluster) => Submitter::Stream(cluster.clone()),
        None => Submitter::Writer(writer.clone()),
    };
    let backend = Backend::new(submit, writer.clone(), routes.clone());
    let chat = Chat::generate(limits::DEMO_ROOMS);
    let empty = seed::prepare_collections(&backend).await?;
    if empty {
        seed::write_chat(&backend, &chat).await?;
    }
    backend.install_rules(gate, seed::flagship_rules()).await?;
    let last_seqs = seed::stored_last_seqs(&backend, &chat).await?;
    let room_index = chat.rooms.iter().enumerate().map(|(index, room)| (room.id.clone(), index)).collect();
    let last_seqs = Mutex::new(last_seqs);
    let demo = Arc::new(Demo { source, simulator, backend, chat, room_index, last_seqs });
    tokio::spawn(simulator::run(demo.clone(), shutdown));
    Ok(DemoStart { n_rooms_written: if empty { demo.chat.rooms.len() } else { 0 }, demo })
}

/// The chat followed from PostgreSQL: the collections are checked, the rules
/// installed; no chat is written and no simulator runs (its rate stays 0).
async fn start_on_followed(writer: &WriterSender, routes: &Routes, gate: &Gate) -> Result<DemoStart, String> {
    let backend = Backend::new(Submitter::Writer(writer.clone()), writer.clone(), routes.clone());
    seed::check_followed_collections(&backend)?;
    backend.install_rules(gate, seed::flagship_rules()).await?;
    let simulator = Simulator::new(0).map_err(|error| error.message)?;
    let chat = Chat { users: Vec::new(), rooms: Vec::new() };
    let (room_index, last_seqs) = (HashMap::new(), Mutex::new(Vec::new()));
    let demo = Arc::new(Demo { source: ChatSource::Postgres, simulator, backend, chat, room_index, last_seqs });
    Ok(DemoStart { demo, n_rooms_written: 0 })
}

/// Cluster mode: waits (at most a minute) until this node applied the stream
/// as it stood at start, so what the demo finds missing is missing everywhere.
async fn catch_up(cluster: &Cluster) -> Result<(), String> {
    let target = cluster.shared.status.stream_last_seq();
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.shared.status.applied_stream_seq() < target {
        if Instant::now() > deadline {
            return Err(format!("--demo: this node did not catch up with the stream (seq {target}) within a minute"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

impl Demo {
    /// Writes messages (`(room index, author, text)`) as the app's backend would,
    /// in one request of three parts: the messages, their rooms (`recency`,
    /// `last_seq`, `preview`) and each author's read mark. Each part is atomic;
    /// the three are committed together.
    pub async fn write_messages(&self, messages: &[(usize, &str, &str)]) -> Result<Vec<u64>, ApiError> {
        let seqs: Vec<u64> = {
            let mut last_seqs = self.last_seqs.lock().expect("demo seqs lock");
            messages
                .iter()
                .map(|&(room, _, _)| {
                    last_seqs[room] += 1;
                    last_seqs[room]
                })
                .collect()
        };
        let now_ms = demo_data::now_ms();
        let (mut message_ops, mut room_ops, mut member_ops) = (Vec::new(), Vec::new(), Vec::new());
        for (&(room, author, text), &seq) in messages.iter().zip(&seqs) {
            let room_id = &self.chat.rooms[room].id;
            message_ops.push(seed::message_op(room_id, seq, author, text, now_ms));
            room_ops.push(json!({"op": "upsert", "id": room_id, "set_max": {"recency": now_ms, "last_seq": seq},
                                 "fields": {"preview": format!("{author}: {text}")}}));
            member_ops.push(json!({"op": "upsert", "id": membership_id(author, room_id),
                                   "set_max": {"read_upto": seq}}));
        }
        let writes = json!({"writes": [
            {"collection": MESSAGES, "ops": message_ops},
            {"collection": ROOMS, "ops": room_ops},
            {"collection": MEMBERS, "ops": member_ops},
        ]});
        self.backend.write(&writes).await?;
        Ok(seqs)
    }

    /// `POST /demo/send`: `user`'s message to `room`, if `user` is a member of it
    /// (its membership as stored decides). Answers the message's number.
    pub async fn send(&self, user: &str, body: &[u8]) -> Result<u64, ApiError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct SendRequest {
            room: String,
            text: String,
        }
        self.refuse_when_followed("a message is an INSERT INTO messages (room, author, text) in PostgreSQL")?;
        let request: SendRequest = crate::strict_json::parse(body, "the body")?;
        let text = request.text.trim();
        if text.is_empty() || text.len() > limits::MAX_DEMO_TEXT_BYTES {
            return Err(ApiError::bad_request(format!("`text` is 1..={} bytes of text", limits::MAX_DEMO_TEXT_BYTES)));
        }
        // The same words whether the room exists or not: sending is no way to probe rooms.
        let refused =
            || ApiError::new(ErrorCode::Forbidden, format!("this identity may not send to `{}`", request.room));
        let room = *self.room_index.get(&request.room).ok_or_else(refused)?;
        let membership = self
            .backend
            .get_item(MEMBERS, &membership_id(user, &request.room))
            .await
            .map_err(|error| ApiError::new(ErrorCode::Internal, error))?;
        let is_member = membership
            .is_some_and(|item| item["fields"]["owner"] == user && item["fields"]["room"] == request.room.as_str());
        if !is_member {
            return Err(refused());
        }
        let seqs = self.write_messages(&[(room, user, text)]).await?;
        Ok(seqs[0])
    }
}

impl Demo {
    /// The demo's writes are refused when the chat follows PostgreSQL: its
    /// collections are read-only here (`read_only_source`).
    pub fn refuse_when_followed(&self, instead: &str) -> Result<(), ApiError> {
        if self.source == ChatSource::Postgres {
            return Err(ApiError::new(
                ErrorCode::ReadOnlySource,
                format!("the demo's chat follows PostgreSQL and is read-only here: {instead}"),
            ));
        }
        Ok(())
    }

    /// `GET /demo/simulator`'s answer: the rate and messages sent, and whether
    /// the chat follows PostgreSQL (the page then offers no composer).
    pub fn status_json(&self) -> serde_json::Value {
        let mut status = self.simulator.status_json();
        status["follows_postgres"] = json!(self.source == ChatSource::Postgres);
        status
    }
}

/// The body of `POST /demo/token`: `{"user": "alice"}`, one of the demo's named users.
pub fn parse_token_request(body: &[u8]) -> Result<&'static str, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TokenRequest {
        user: String,
    }
    let request: TokenRequest = crate::strict_json::parse(body, "the body")?;
    chat::NAMED_USERS
        .iter()
        .copied()
        .find(|user| *user == request.user)
        .ok_or_else(|| ApiError::bad_request(format!("the demo's users are {}", chat::NAMED_USERS.join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_content_type() {
        for name in ["", "index.html", "app.js", "style.css", "ordo-client.js"] {
            let (content_type, body) = asset(name).unwrap();
            assert!(content_type.contains("charset=utf-8") && !body.is_empty(), "{name}");
        }
        assert!(asset("../Cargo.toml").is_none() && asset("simulator").is_none());
        assert!(asset("").unwrap().1.contains("/demo/app.js"), "the page loads its script by absolute path");
    }

    #[test]
    fn the_chat_is_followed_whole_or_not_at_all() {
        let followed = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect::<HashSet<_>>();
        assert_eq!(chat_source(&followed(&[])), Ok(ChatSource::Generated));
        assert_eq!(chat_source(&followed(&["orders"])), Ok(ChatSource::Generated));
        assert_eq!(chat_source(&followed(&[ROOMS, MEMBERS, MESSAGES, "orders"])), Ok(ChatSource::Postgres));
        assert!(chat_source(&followed(&[ROOMS, MEMBERS])).unwrap_err().contains("all three"));
    }

    #[test]
    fn only_the_named_users_get_tokens() {
        assert_eq!(parse_token_request(br#"{"user":"carol"}"#), Ok("carol"));
        for bad in [r#"{"user":"user0001"}"#, r#"{"user":"mallory"}"#, r#"{}"#] {
            assert!(parse_token_request(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
