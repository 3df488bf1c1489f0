//! Wire types: only what the load generator reads, borrowed where it can be.

use std::borrow::Cow;

use serde::Deserialize;

/// Every field of the scenarios' schemas; a scenario's items leave the others `None`.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ItemFields {
    pub name: Option<String>,
    pub recency: Option<u64>,
    pub unread: Option<u64>,
    pub score: Option<i64>,
    pub sent_at: Option<u64>,
    pub update: Option<u64>,
    pub msg: Option<u64>,
    /// `pg-bench`'s rooms (a PostgreSQL table's column).
    pub last_seq: Option<u64>,
    /// The flagship's room fields, read through the membership's reference.
    #[serde(rename = "room.recency")]
    pub room_recency: Option<u64>,
    #[serde(rename = "room.msg")]
    pub room_msg: Option<u64>,
}

/// An item; its payload (none is written) is not read.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub id: String,
    pub fields: ItemFields,
}

/// `eyeball_im::VectorDiff<Item>` as serde_json writes it (PROTOCOL.md).
#[derive(Deserialize)]
pub enum WireDiff {
    Append { values: Vec<Item> },
    Clear {},
    PushFront { value: Item },
    PushBack { value: Item },
    PopFront {},
    PopBack {},
    Insert { index: usize, value: Item },
    Set { index: usize, value: Item },
    Remove { index: usize },
    Truncate { length: usize },
    Reset { values: Vec<Item> },
}

#[derive(Deserialize, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    Welcome,
    Diffs,
    Error,
    Unsubscribed,
    Resumed,
    #[serde(other)]
    Unknown,
}

/// Any server frame: the keys of every kind, each optional; others are skipped.
#[derive(Deserialize)]
pub struct ServerFrame<'a> {
    #[serde(rename = "type")]
    pub kind: FrameKind,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub diffs: Vec<WireDiff>,
    #[serde(default, borrow)]
    pub code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub message: Option<Cow<'a, str>>,
}

/// `welcome.auth`: `"none"`, `"required"`, or the identity of a token sent at connect.
#[derive(Deserialize)]
pub struct WelcomeAuth {
    #[serde(default)]
    pub auth: Option<serde_json::Value>,
}

/// The answer to `{"op":"auth"}`: `authed` or `error`.
#[derive(Deserialize)]
pub struct AuthReply {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub sub: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Deserialize)]
pub struct QueryReply {
    pub items: Vec<Item>,
}

/// `POST /v1/batch`: one result per part, a sequence number or an error.
#[derive(Deserialize)]
pub struct MultiBatchReply {
    pub results: Vec<PartResult>,
}

/// `POST /v1/collections/{name}/batch`.
#[derive(Deserialize)]
pub struct SingleBatchReply {
    pub seq: u64,
}

#[derive(Deserialize)]
pub struct PartResult {
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}
