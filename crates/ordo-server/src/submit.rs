//! The HTTP API's changes of state, by mode: single-node mode hands each one to
//! the writer thread as a `Command`; cluster mode publishes it as a stream entry
//! and answers with the outcome of its apply on this node (`cluster::routes`).
//! Both answer with the same typed values, so the handlers write the same JSON
//! and status whichever mode runs, and never look at the mode themselves.
//!
//! A handler checks what it can first (the caller, the JSON, types against this
//! node's schema) and passes both what it checked (for the writer) and what was
//! sent (a cluster entry carries the request as sent; the apply checks it again).

use std::sync::Arc;
use std::time::Instant;

use ordo_core::{Batch, CollectionId, Schema};
use tokio::sync::oneshot;

use crate::access::Gate;
use crate::auth::Identity;
use crate::cluster::{self, Cluster};
use crate::error::{ApiError, ErrorCode};
use crate::routing::CollectionEntry;
use crate::rules::RuleSet;
use crate::write_buffers;
use crate::write_guard::WriteGuard;
use crate::writer::{Command, FieldChange, WriteResults, WriterSender};

/// Where a change goes: the writer thread's queue, or the cluster's stream.
pub enum Submitter {
    /// Single-node mode: the writer commits it.
    Writer(WriterSender),
    /// Cluster mode: published to the stream, applied by every node.
    Stream(Arc<Cluster>),
}

/// A field added by `POST /v1/collections/{name}/fields`: as checked, and as sent.
pub struct AddedField<'a> {
    pub name: String,
    pub field_type: ordo_core::FieldType,
    pub default: ordo_core::OwnedValue,
    pub body: &'a [u8],
}

/// What a write request sent, for cluster mode's entries (one per part written).
pub enum WriteSource<'a> {
    /// `POST /v1/collections/{name}/batch`: its body.
    Batch { collection: &'a str, body: &'a [u8] },
    /// `POST /v1/batch`: its body and the parts refused before submitting, by
    /// index (in order); every other part is submitted.
    Multi { body: &'a [u8], refused: &'a [(usize, ApiError)] },
    /// `DELETE /v1/collections/{name}/items/{id}`.
    Remove { collection: &'a str, id: &'a str },
}

/// One request's parts, as checked on this node: the batches (one per part
/// submitted, each with its collection) and the guards of the parts under a
/// filtered write rule, by index into `batches`.
#[derive(Default)]
pub struct WriteParts {
    pub batches: Vec<(CollectionId, Batch)>,
    pub guards: Vec<(usize, Arc<WriteGuard>)>,
}

impl Submitter {
    /// Whether a write refused here for `error` is submitted all the same. In
    /// cluster mode, a collection this node does not know *yet* (created through
    /// another node, not applied here so far) may exist at the entry's place in
    /// the stream: the apply decides. The writer would refuse it: never then.
    pub fn submits_despite(&self, error: &ApiError) -> bool {
        matches!(self, Submitter::Stream(_)) && error.code == ErrorCode::UnknownCollection
    }

    /// Writes the parts; a result per part submitted, in order. Their batches'
    /// buffers come back to this thread's pool, and so should the results once
    /// answered (`write_buffers::give_results`).
    pub async fn write(
        &self,
        identity: &Identity,
        parts: WriteParts,
        source: WriteSource<'_>,
    ) -> Result<WriteResults, ApiError> {
        let writer = match self {
            Submitter::Writer(writer) => writer,
            Submitter::Stream(cluster) => {
                // The batches were only built to check the request.
                write_buffers::give_list(parts.batches);
                let entries = write_entries(identity, source)?;
                return Ok(cluster::routes::write(cluster, entries).await);
            }
        };
        let WriteParts { batches, guards } = parts;
        let results = write_buffers::take_results(batches.len());
        let reply =
            ask(writer, |reply| Command::Write { batches, reply, queued_at: Instant::now(), guards, results }).await?;
        write_buffers::give_list(reply.batches);
        Ok(reply.results)
    }

    /// Creates a collection (`(true, entry)`), or finds it as it is (`false`).
    pub async fn create_collection(
        &self,
        identity: &Identity,
        name: &str,
        schema: Schema,
        body: &[u8],
    ) -> Result<(bool, Arc<CollectionEntry>), ApiError> {
        match self {
            Submitter::Writer(writer) => {
                let name = name.to_owned();
                ask(writer, |reply| Command::CreateCollection { name, schema, reply }).await?
            }
            Submitter::Stream(cluster) => cluster::routes::create_collection(cluster, identity, name, body).await,
        }
    }

    /// Adds a field; answers the change's `seq` and the new entry.
    pub async fn add_field(
        &self,
        identity: &Identity,
        entry: &CollectionEntry,
        name: &str,
        field: AddedField<'_>,
    ) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
        match self {
            Submitter::Writer(writer) => {
                let AddedField { name, field_type, default, .. } = field;
                change_fields(writer, entry.id, FieldChange::Add { name, field_type, default }).await
            }
            Submitter::Stream(cluster) => cluster::routes::add_field(cluster, identity, name, field.body).await,
        }
    }

    /// Removes a field; answers the change's `seq` and the new entry.
    pub async fn remove_field(
        &self,
        identity: &Identity,
        entry: &CollectionEntry,
        name: &str,
        field: &str,
    ) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
        match self {
            Submitter::Writer(writer) => {
                change_fields(writer, entry.id, FieldChange::Remove { name: field.to_owned() }).await
            }
            Submitter::Stream(cluster) => cluster::routes::remove_field(cluster, identity, name, field).await,
        }
    }

    /// Drops a collection; answers the drop's `seq`.
    pub async fn drop_collection(
        &self,
        identity: &Identity,
        entry: &CollectionEntry,
        name: &str,
    ) -> Result<u64, ApiError> {
        match self {
            Submitter::Writer(writer) => {
                let collection = entry.id;
                ask(writer, |reply| Command::DropCollection { collection, reply }).await?
            }
            Submitter::Stream(cluster) => cluster::routes::drop_collection(cluster, identity, name).await,
        }
    }

    /// Replaces the access rules (`doc`, compiled as `rules`); answers their `seq`.
    /// Single-node mode installs them in `gate` once stored; in cluster mode the
    /// apply installs them, on every node, in stream order.
    pub async fn set_rules(
        &self,
        identity: &Identity,
        doc: String,
        rules: RuleSet,
        gate: &Gate,
    ) -> Result<u64, ApiError> {
        match self {
            Submitter::Writer(writer) => {
                let seq = ask(writer, |reply| Command::SetRules { doc, reply }).await??;
                gate.set_rules(rules);
                Ok(seq)
            }
            Submitter::Stream(cluster) => cluster::routes::set_rules(cluster, identity, &doc).await,
        }
    }
}

/// Sends the writer a command and waits for its answer.
async fn ask<T>(writer: &WriterSender, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, ApiError> {
    let (reply, answer) = oneshot::channel();
    writer.send(command(reply)).await.map_err(|_| ApiError::shutting_down())?;
    answer.await.map_err(|_| ApiError::shutting_down())
}

async fn change_fields(
    writer: &WriterSender,
    collection: CollectionId,
    change: FieldChange,
) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
    ask(writer, |reply| Command::ChangeFields { collection, change, reply }).await?
}

/// Cluster mode's entries of a write request: one per part submitted.
fn write_entries(identity: &Identity, source: WriteSource<'_>) -> Result<Vec<Vec<u8>>, ApiError> {
    match source {
        WriteSource::Batch { collection, body } => Ok(vec![cluster::routes::batch_entry(identity, collection, body)?]),
        WriteSource::Remove { collection, id } => Ok(vec![cluster::routes::remove_entry(identity, collection, id)]),
        WriteSource::Multi { body, refused } => {
            let raw: cluster::routes::RawMulti<'_> = crate::api::parse_write(body)?;
            let mut refused = refused.iter().map(|(index, _)| *index).peekable();
            let mut entries = Vec::with_capacity(raw.writes.len());
            for (index, part) in raw.writes.iter().enumerate() {
                if refused.next_if_eq(&index).is_some() {
                    continue;
                }
                entries.push(cluster::routes::write_entry(identity, &part.collection, part.ops));
            }
            Ok(entries)
        }
    }
}
