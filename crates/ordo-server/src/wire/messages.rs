//! Client → server WebSocket messages.

use serde::Deserialize;
use serde_json::Value as Json;

use super::*;
use crate::error::ApiError;
use crate::limits;

/// The `sub` of a client message that is refused before it is parsed (rate
/// limited), so the error can name the subscription it concerns.
#[derive(Deserialize)]
pub struct SubOnly {
    pub sub: Option<String>,
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
    },
    SetView {
        sub: String,
        #[serde(default)]
        filter: Json,
        #[serde(default, deserialize_with = "null_as_default")]
        sort: Vec<SortRequest>,
    },
    Unsubscribe {
        sub: String,
    },
    Resume {
        session: String,
        subs: Vec<ResumeEntry>,
    },
    /// A token for this connection: the first one, or a fresh one before the last expires.
    Auth {
        token: String,
    },
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
