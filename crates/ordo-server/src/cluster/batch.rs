//! One attempt at publishing several entries as a JetStream *atomic batch*
//! (nats-server 2.12+, a stream with `allow_atomic`): every entry is still its
//! own message, with its own `Nats-Msg-Id` and its own stream seq, but the
//! stream leader proposes them to its Raft group together, in one place of the
//! log, and stores all of them or none. So a group of entries pays one Raft
//! round, one fsync per replica and one acknowledgement instead of one each,
//! and nothing else about an entry changes: every node applies the same
//! entries at the same seqs as if they had been published one by one.
//!
//! The protocol (ADR-50): each message carries `Nats-Batch-Id` (one per
//! attempt) and `Nats-Batch-Sequence` (1, 2, …); the last one also carries
//! `Nats-Batch-Commit: 1` and is a request, answered by the batch's PubAck or
//! its error. A retried attempt sends the same message ids under a new batch
//! id: if an earlier attempt was stored, the stream refuses the whole batch as
//! containing a duplicate message id, which says the entries are in the stream.

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde::Deserialize;

use super::retry::Refusal;
use super::SUBJECT;

/// JetStream's error codes an atomic batch can be answered with that decide
/// what happens next (nats-server's `errors.json`).
const ATOMIC_PUBLISH_DISABLED: u64 = 10174;
const BATCH_CONTAINS_DUPLICATE: u64 = 10201;
const MSG_ID_IN_PROCESS: u64 = 10158;
const TOO_MANY_BATCHES_IN_FLIGHT: u64 = 10210;

/// The most entries one atomic batch carries (nats-server's `max_batch_size`
/// default is 1 000).
pub const MAX_BATCH_ENTRIES: usize = 1_000;

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum BatchAnswer {
    /// Every entry is in the stream, stored by this attempt or an earlier one.
    Stored,
    /// Nothing was stored; `Refusal` says how to go on (`retry::Retry`).
    Refused(Refusal, String),
    /// The stream does not take atomic batches (its `allow_atomic` is off, or
    /// the server is older): publish the entries one by one instead.
    Unsupported(String),
}

#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    error: Option<ReplyError>,
}

#[derive(Deserialize)]
struct ReplyError {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

/// What the commit's reply says.
pub fn read_reply(payload: &[u8]) -> BatchAnswer {
    let reply: Reply = match serde_json::from_slice(payload) {
        Ok(reply) => reply,
        Err(error) => return BatchAnswer::Refused(Refusal::RefusedAtOnce, format!("unreadable batch answer: {error}")),
    };
    let Some(error) = reply.error else { return BatchAnswer::Stored };
    let said = format!("{} ({})", error.description, error.err_code);
    match error.err_code {
        BATCH_CONTAINS_DUPLICATE => BatchAnswer::Stored,
        ATOMIC_PUBLISH_DISABLED => BatchAnswer::Unsupported(said),
        MSG_ID_IN_PROCESS | TOO_MANY_BATCHES_IN_FLIGHT => BatchAnswer::Refused(Refusal::InProcess, said),
        _ => BatchAnswer::Refused(Refusal::RefusedAtOnce, said),
    }
}

fn headers(batch_id: &str, sequence: usize, msg_id: &str, commit: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Batch-Id", batch_id);
    headers.insert("Nats-Batch-Sequence", sequence.to_string().as_str());
    headers.insert("Nats-Msg-Id", msg_id);
    if commit {
        headers.insert("Nats-Batch-Commit", "1");
    }
    headers
}

/// Sends `entries` (message id, payload) as one atomic batch under `batch_id`
/// and reads the answer, all within `timeout`.
pub async fn send(
    client: &async_nats::Client,
    batch_id: &str,
    entries: &[(String, Bytes)],
    timeout: Duration,
) -> BatchAnswer {
    let attempt = async {
        let (last, rest) = entries.split_last().expect("a batch has entries");
        for (index, (msg_id, payload)) in rest.iter().enumerate() {
            let headers = headers(batch_id, index + 1, msg_id, false);
            if let Err(error) = client.publish_with_headers(SUBJECT, headers, payload.clone()).await {
                return BatchAnswer::Refused(Refusal::RefusedAtOnce, error.to_string());
            }
        }
        let headers = headers(batch_id, entries.len(), &last.0, true);
        match client.request_with_headers(SUBJECT, headers, last.1.clone()).await {
            Ok(reply) => read_reply(&reply.payload),
            Err(error) if error.kind() == async_nats::RequestErrorKind::TimedOut => {
                BatchAnswer::Refused(Refusal::TimedOut, error.to_string())
            }
            Err(error) => BatchAnswer::Refused(Refusal::RefusedAtOnce, error.to_string()),
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(answer) => answer,
        Err(_) => BatchAnswer::Refused(Refusal::TimedOut, format!("no answer within {timeout:?}")),
    }
}

/// Turns on `allow_atomic` on the stream if it is off (through the JetStream
/// API: async-nats 0.42's `stream::Config` has no field for it, and updating
/// a stream with that struct would turn it off again). False, with a warning,
/// when the server cannot (before 2.12): the node then publishes one entry per
/// message.
pub async fn allow_atomic(client: &async_nats::Client, stream: &str) -> bool {
    match turn_on_atomic(client, stream).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!("the stream `{stream}` takes no atomic batches ({error}): one entry per message");
            false
        }
    }
}

async fn turn_on_atomic(client: &async_nats::Client, stream: &str) -> Result<(), String> {
    let ask = |subject: String, body: Bytes| async move {
        let reply = tokio::time::timeout(super::PUBLISH_TIMEOUT, client.request(subject, body))
            .await
            .map_err(|_| "no answer".to_owned())?
            .map_err(|error| error.to_string())?;
        let reply: serde_json::Value = serde_json::from_slice(&reply.payload).map_err(|error| error.to_string())?;
        match reply.get("error") {
            Some(error) => Err(error.to_string()),
            None => Ok(reply),
        }
    };
    let info = ask(format!("$JS.API.STREAM.INFO.{stream}"), Bytes::new()).await?;
    let mut config = info.get("config").cloned().ok_or("the stream's info has no config")?;
    if config.get("allow_atomic") == Some(&serde_json::Value::Bool(true)) {
        return Ok(());
    }
    config["allow_atomic"] = serde_json::Value::Bool(true);
    let body = Bytes::from(serde_json::to_vec(&config).map_err(|error| error.to_string())?);
    let updated = ask(format!("$JS.API.STREAM.UPDATE.{stream}"), body).await?;
    match updated.pointer("/config/allow_atomic") {
        Some(serde_json::Value::Bool(true)) => Ok(()),
        _ => Err("the server kept allow_atomic off".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commits_reply_decides_what_follows() {
        let stored = br#"{"stream":"ORDO","seq":12,"batch":"b","count":3}"#;
        assert_eq!(read_reply(stored), BatchAnswer::Stored);
        let error = |code: u64| format!(r#"{{"error":{{"code":400,"err_code":{code},"description":"x"}}}}"#);
        // An earlier attempt of the same entries was stored: they are in the stream.
        assert_eq!(read_reply(error(10201).as_bytes()), BatchAnswer::Stored);
        assert!(matches!(read_reply(error(10174).as_bytes()), BatchAnswer::Unsupported(_)));
        assert!(matches!(read_reply(error(10158).as_bytes()), BatchAnswer::Refused(Refusal::InProcess, _)));
        assert!(matches!(read_reply(error(10210).as_bytes()), BatchAnswer::Refused(Refusal::InProcess, _)));
        assert!(matches!(read_reply(error(10176).as_bytes()), BatchAnswer::Refused(Refusal::RefusedAtOnce, _)));
        assert!(matches!(read_reply(b"not json"), BatchAnswer::Refused(Refusal::RefusedAtOnce, _)));
    }
}
