//! The HTTP API's mutating requests in cluster mode: each becomes an entry,
//! published and then answered with the outcome of its apply on this node,
//! as the same typed values the writer's commands answer in single-node mode
//! (so the `api` handlers, through `submit`, write the same JSON and status).
//! The handlers check what they can first (the caller, JSON, types against this
//! node's schema), so that a request refused outright never takes a seq; the
//! apply checks it all again.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::entry::{Caller, Entry, Kind};
use super::{Cluster, Outcome};
use crate::auth::Identity;
use crate::error::{ApiError, ErrorCode};
use crate::routing::CollectionEntry;
use crate::writer::WriteResults;

fn unexpected(outcome: Outcome) -> ApiError {
    match outcome {
        Outcome::Malformed(error) => error,
        other => ApiError::new(ErrorCode::Internal, format!("an entry came back as another kind: {other:?}")),
    }
}

/// `{"ops": [...]}` of `POST /v1/collections/{name}/batch`, as sent.
#[derive(Deserialize)]
struct RawOps<'a> {
    #[serde(borrow)]
    ops: &'a RawValue,
}

/// `{"writes": [{"collection", "ops"}]}` of `POST /v1/batch`, as sent.
#[derive(Deserialize)]
pub struct RawMulti<'a> {
    #[serde(borrow)]
    pub writes: Vec<RawPart<'a>>,
}

#[derive(Deserialize)]
pub struct RawPart<'a> {
    #[serde(borrow)]
    pub collection: Cow<'a, str>,
    #[serde(borrow)]
    pub ops: &'a RawValue,
}

/// The entry of one write part (one batch: one seq, as in single-node mode).
pub fn write_entry(identity: &Identity, collection: &str, ops: &RawValue) -> Vec<u8> {
    let mut entry = Entry::new(Kind::Write, Some(collection), Caller::of(identity));
    entry.ops = Some(ops);
    entry.encode()
}

/// The entry of `POST /v1/collections/{name}/batch`'s body (already checked).
pub fn batch_entry(identity: &Identity, collection: &str, body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let raw: RawOps<'_> = serde_json::from_slice(body).map_err(|error| ApiError::from_json(&error))?;
    Ok(write_entry(identity, collection, raw.ops))
}

/// The entry of `DELETE /v1/collections/{name}/items/{id}`.
pub fn remove_entry(identity: &Identity, collection: &str, id: &str) -> Vec<u8> {
    let ops = serde_json::json!([{"op": "remove", "id": id}]).to_string();
    let ops = RawValue::from_string(ops).expect("valid JSON");
    write_entry(identity, collection, &ops)
}

/// Publishes the write entries, one per part, and answers each part's result.
pub async fn write(cluster: &Cluster, entries: Vec<Vec<u8>>) -> WriteResults {
    cluster
        .submit_all(entries)
        .await
        .into_iter()
        .map(|result| match result? {
            Outcome::Write(result) => result,
            other => Err(unexpected(other)),
        })
        .collect()
}

pub async fn create_collection(
    cluster: &Cluster,
    identity: &Identity,
    name: &str,
    schema: &[u8],
) -> Result<(bool, Arc<CollectionEntry>), ApiError> {
    let schema: &RawValue = serde_json::from_slice(schema).map_err(|error| ApiError::from_json(&error))?;
    let mut entry = Entry::new(Kind::CreateCollection, Some(name), Caller::of(identity));
    entry.schema = Some(schema);
    match cluster.submit(entry.encode()).await? {
        Outcome::Create(result) => result,
        other => Err(unexpected(other)),
    }
}

pub async fn add_field(
    cluster: &Cluster,
    identity: &Identity,
    name: &str,
    field: &[u8],
) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
    let field: &RawValue = serde_json::from_slice(field).map_err(|error| ApiError::from_json(&error))?;
    let mut entry = Entry::new(Kind::AddField, Some(name), Caller::of(identity));
    entry.field = Some(field);
    fields_outcome(cluster.submit(entry.encode()).await?)
}

pub async fn remove_field(
    cluster: &Cluster,
    identity: &Identity,
    name: &str,
    field: &str,
) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
    let field = RawValue::from_string(serde_json::Value::from(field).to_string()).expect("valid JSON");
    let mut entry = Entry::new(Kind::RemoveField, Some(name), Caller::of(identity));
    entry.field = Some(&field);
    fields_outcome(cluster.submit(entry.encode()).await?)
}

fn fields_outcome(outcome: Outcome) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
    match outcome {
        Outcome::Fields(result) => result,
        other => Err(unexpected(other)),
    }
}

pub async fn drop_collection(cluster: &Cluster, identity: &Identity, name: &str) -> Result<u64, ApiError> {
    let entry = Entry::new(Kind::DropCollection, Some(name), Caller::of(identity));
    match cluster.submit(entry.encode()).await? {
        Outcome::Drop(result) => result,
        other => Err(unexpected(other)),
    }
}

pub async fn set_rules(cluster: &Cluster, identity: &Identity, doc: &str) -> Result<u64, ApiError> {
    let rules = RawValue::from_string(doc.to_owned()).map_err(|error| ApiError::from_json(&error))?;
    let mut entry = Entry::new(Kind::SetRules, None, Caller::of(identity));
    entry.rules = Some(&rules);
    match cluster.submit(entry.encode()).await? {
        Outcome::Rules(result) => result,
        other => Err(unexpected(other)),
    }
}
