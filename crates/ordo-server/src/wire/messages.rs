//! Client → server WebSocket messages.

use serde::Deserialize;
use serde_json::Value as Json;

use super::*;
use crate::error::ApiError;
use crate::limits;

/// `sub` and `req` of a client message that is refused before it is parsed
/// (rate limited) or that does not parse, so the error can name them. Read
/// leniently: a value of the wrong type is left out, not an error.
#[derive(Deserialize)]
pub struct SubAndReq {
    #[serde(default)]
    sub: Option<Json>,
    #[serde(default)]
    req: Option<Json>,
}

impl SubAndReq {
    /// The message's `sub` (any string) and `req` (only a valid one, see `check_req`).
    pub fn read(text: &[u8]) -> (Option<String>, Option<Box<str>>) {
        let Ok(SubAndReq { sub, req }) = serde_json::from_slice::<SubAndReq>(text) else { return (None, None) };
        let string = |value: Option<Json>| match value {
            Some(Json::String(text)) => Some(text),
            _ => None,
        };
        let req = string(req).filter(|req| check_req(Some(req)).is_ok()).map(String::into_boxed_str);
        (string(sub), req)
    }
}

/// Client → server WebSocket messages. Every key is listed (no `flatten`) so that
/// an unknown key is refused rather than ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    Subscribe {
        sub: String,
        collection: String,
        #[serde(default)]
        filter: Json,
        #[serde(default, deserialize_with = "null_as_default")]
        sort: Vec<SortRequest>,
        #[serde(default)]
        offset: Option<usize>,
        #[serde(default)]
        around: Option<AroundRequest>,
        #[serde(default)]
        after: Option<String>,
        #[serde(default)]
        before: Option<String>,
        #[serde(default)]
        tail: Option<bool>,
        limit: usize,
        #[serde(default)]
        fields: Option<Vec<String>>,
        #[serde(default = "yes")]
        payload: bool,
        /// Every frame carries the window digest, however large the window.
        #[serde(default)]
        digest: bool,
        /// Wait until the store has applied this batch before the first frame.
        #[serde(default)]
        min_seq: Option<u64>,
        #[serde(default)]
        req: Option<String>,
    },
    SetRange {
        sub: String,
        #[serde(default)]
        offset: Option<usize>,
        #[serde(default)]
        around: Option<AroundRequest>,
        #[serde(default)]
        after: Option<String>,
        #[serde(default)]
        before: Option<String>,
        #[serde(default)]
        tail: Option<bool>,
        limit: usize,
        #[serde(default)]
        req: Option<String>,
    },
    SetView {
        sub: String,
        #[serde(default)]
        filter: Json,
        #[serde(default, deserialize_with = "null_as_default")]
        sort: Vec<SortRequest>,
        #[serde(default)]
        req: Option<String>,
    },
    Unsubscribe {
        sub: String,
        #[serde(default)]
        req: Option<String>,
    },
    Resume {
        session: String,
        subs: Vec<ResumeEntry>,
        #[serde(default)]
        req: Option<String>,
    },
    /// A token for this connection: the first one, or a fresh one before the last expires.
    Auth {
        token: String,
        #[serde(default)]
        req: Option<String>,
    },
}

impl ClientMessage {
    /// The client's id for this request (`req`), echoed on the frame that answers it.
    pub fn req(&self) -> Option<&str> {
        match self {
            ClientMessage::Subscribe { req, .. }
            | ClientMessage::SetRange { req, .. }
            | ClientMessage::SetView { req, .. }
            | ClientMessage::Unsubscribe { req, .. }
            | ClientMessage::Resume { req, .. }
            | ClientMessage::Auth { req, .. } => req.as_deref(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeEntry {
    pub sub: String,
    pub last_seq: u64,
    pub collection: String,
    #[serde(default)]
    pub filter: Json,
    #[serde(default, deserialize_with = "null_as_default")]
    pub sort: Vec<SortRequest>,
    #[serde(default)]
    pub offset: Option<usize>,
    /// A tail window resumes as one (the other anchors placed the window once:
    /// resume it at the `offset` its answer gave).
    #[serde(default)]
    pub tail: Option<bool>,
    pub limit: usize,
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub payload: bool,
    /// As `subscribe`'s `digest`.
    #[serde(default)]
    pub digest: bool,
    /// Wait until the store has applied this batch before resuming.
    #[serde(default)]
    pub min_seq: Option<u64>,
}

/// A request id is 1..=`MAX_REQUEST_ID_BYTES` bytes (any string).
pub fn check_req(req: Option<&str>) -> Result<(), ApiError> {
    match req {
        Some(req) if req.is_empty() || req.len() > limits::MAX_REQUEST_ID_BYTES => Err(ApiError::limit(format!(
            "a request id (`req`) is 1..={} bytes; this one is {}",
            limits::MAX_REQUEST_ID_BYTES,
            req.len()
        ))),
        _ => Ok(()),
    }
}

pub fn check_sub_id(sub: &str) -> Result<(), ApiError> {
    if sub.is_empty() || sub.len() > limits::MAX_SUBSCRIPTION_ID_BYTES {
        return Err(ApiError::limit(format!(
            "a subscription id is 1..={} bytes; this one is {}",
            limits::MAX_SUBSCRIPTION_ID_BYTES,
            sub.len()
        )));
    }
    Ok(())
}
