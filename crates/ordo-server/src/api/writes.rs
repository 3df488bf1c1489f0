//! The write routes: a batch, batches of several collections, and removing an
//! item. Each is checked here (the caller, its write rule, the JSON, types
//! against the schema) and goes to `submit`.

use std::sync::Arc;

use hyper::Response;

use ordo_core::{Batch, CollectionId};

use bytes::Bytes;

use super::{granted_write, json_response, parse_write, Body};
use crate::auth::Identity;
use crate::error::{ApiError, ErrorCode};
use crate::frame::write_u64;
use crate::http_state::HttpState;
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::routing::CollectionEntry;
use crate::rules::{Action, Grant};
use crate::submit::{WriteParts, WriteSource};
use crate::wire::{self, BatchRequest, CollectionWrite, MultiBatchRequest};
use crate::write_buffers;
use crate::write_guard::WriteGuard;
use crate::write_rules::WriteGrant;
use crate::writer::WriteResults;

/// POST /v1/collections/{name}/batch: one atomic batch.
pub(super) async fn batch(
    state: &HttpState,
    identity: Arc<Identity>,
    name: &str,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let granted = granted_write(state, &identity, name);
    if let Some(error) = granted.as_ref().err().filter(|error| state.submit.submits_despite(error)) {
        check_op_count(parse_write::<BatchRequest>(&body)?.ops.len())?;
        let source = WriteSource::Batch { collection: name, body: &body };
        let mut results =
            state.submit.write(&identity, WriteParts::default(), source).await.map_err(|_| error.clone())?;
        let ack = results.pop().expect("one result");
        write_buffers::give_results(results);
        let ack = ack.map_err(|error| shown_to(state, &identity, name, error))?;
        let mut body = Vec::with_capacity(64);
        write_ack(&mut body, &ack);
        return Ok(json_response(200, body));
    }
    let (entry, grant) = granted?;
    let mut guards = Vec::new();
    write_guard(0, &entry, &grant, &mut guards)?;
    let batch_request: BatchRequest = parse_write(&body)?;
    check_op_count(batch_request.ops.len())?;
    let mut batch = write_buffers::take_batch();
    wire::fill_batch(&mut batch, &entry.schema, &batch_request.ops, 0)?;
    check_shape(&guards, 0, &batch)?;
    let mut parts = write_buffers::take_list();
    parts.push((entry.id, batch));
    let parts = WriteParts { batches: parts, guards };
    let mut results =
        state.submit.write(&identity, parts, WriteSource::Batch { collection: name, body: &body }).await?;
    let ack = results.pop().expect("one result per part");
    write_buffers::give_results(results);
    let ack = ack.map_err(|error| shown_to(state, &identity, name, error))?;
    let mut body = Vec::with_capacity(64);
    write_ack(&mut body, &ack);
    Ok(json_response(200, body))
}

/// POST /v1/batch: batches of several collections, each atomic on its own.
pub(super) async fn multi_batch(
    state: &HttpState,
    identity: Arc<Identity>,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let multi: MultiBatchRequest = parse_write(&body)?;
    check_op_count(multi.writes.iter().map(|write| write.ops.len()).sum())?;
    // A part refused here (unknown collection, a value of the wrong type) fails
    // alone, as a part refused by the engine would; the others are written.
    let mut refused: Vec<(usize, ApiError)> = Vec::new();
    let mut parts = write_buffers::take_list();
    let mut guards = Vec::new();
    let mut guarded_items = GuardedItems::default();
    for (index, part) in multi.writes.iter().enumerate() {
        let prepared = prepare_part(state, &identity, part, parts.len(), &mut guards, &mut guarded_items);
        match prepared {
            // Submitted without a local batch: its result follows those of the parts before it.
            Err(error) if state.submit.submits_despite(&error) => {}
            Ok(prepared) => parts.push(prepared),
            Err(error) => {
                refused.push((index, ApiError { message: format!("write {index}: {}", error.message), ..error }))
            }
        }
    }
    let source = WriteSource::Multi { body: &body, refused: &refused };
    let parts = WriteParts { batches: parts, guards };
    let written = state.submit.write(&identity, parts, source).await?;
    Ok(multi_answer(state, &identity, &multi, refused, written))
}

/// One part of a `POST /v1/batch`, checked and built: its collection's batch,
/// and its guard (in `guards`, at `part_index`: its index among the batches
/// submitted) under a filtered write rule.
fn prepare_part(
    state: &HttpState,
    identity: &Identity,
    part: &CollectionWrite<'_>,
    part_index: usize,
    guards: &mut Vec<(usize, Arc<WriteGuard>)>,
    guarded_items: &mut GuardedItems,
) -> Result<(CollectionId, Batch), ApiError> {
    let (entry, grant) = granted_write(state, identity, &part.collection)?;
    write_guard(part_index, &entry, &grant, guards)?;
    let guarded = guards.last().is_some_and(|(guarded, _)| *guarded == part_index);
    let mut batch = write_buffers::take_batch();
    let filled = wire::fill_batch(&mut batch, &entry.schema, &part.ops, 0).and_then(|()| {
        if guarded {
            check_shape(guards, part_index, &batch)?;
            guarded_items.claim(entry.id, &batch)
        } else {
            Ok(())
        }
    });
    match filled {
        Ok(()) => Ok((entry.id, batch)),
        Err(error) => {
            if guarded {
                guards.pop();
            }
            write_buffers::give_batch(batch);
            Err(error)
        }
    }
}

/// `POST /v1/batch`'s answer: a result per part, in order, each refused here
/// (`refused`, by index) or as submitted (`written`).
fn multi_answer(
    state: &HttpState,
    identity: &Identity,
    multi: &MultiBatchRequest<'_>,
    refused: Vec<(usize, ApiError)>,
    mut written_list: WriteResults,
) -> Response<Body> {
    let mut written = written_list.drain(..);
    let mut refused = refused.into_iter().peekable();
    let mut status = 200;
    // `{"results":[...]}`, written directly: one allocation for the whole answer.
    let mut body = Vec::with_capacity(16 + 48 * multi.writes.len());
    body.extend_from_slice(b"{\"results\":[");
    for index in 0..multi.writes.len() {
        if index > 0 {
            body.push(b',');
        }
        let result = match refused.next_if(|(refused_index, _)| *refused_index == index) {
            Some((_, error)) => Err(error),
            None => written
                .next()
                .expect("one result per part written")
                .map_err(|error| shown_to(state, identity, &multi.writes[index].collection, error)),
        };
        match result {
            Ok(ack) => write_ack(&mut body, &ack),
            Err(error) => {
                metrics::count_error(error.code);
                metrics::add(&METRICS.batches_refused, 1);
                tracing::info!(code = error.code.as_str(), "write refused: {}", error.message);
                // 409 when every refused part is a conflict, else 422.
                let refusal_status = if error.code == ErrorCode::Conflict { 409 } else { 422 };
                status = if status == 200 || status == refusal_status { refusal_status } else { 422 };
                body.extend_from_slice(&error.to_json_body());
            }
        }
    }
    body.extend_from_slice(b"]}");
    drop(written);
    write_buffers::give_results(written_list);
    json_response(status, body)
}

/// DELETE /v1/collections/{name}/items/{id}.
pub(super) async fn remove_item(
    state: &HttpState,
    identity: Arc<Identity>,
    name: &str,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let granted = granted_write(state, &identity, name);
    if let Some(error) = granted.as_ref().err().filter(|error| state.submit.submits_despite(error)) {
        let source = WriteSource::Remove { collection: name, id };
        let ack = state.submit.write(&identity, WriteParts::default(), source).await?.pop().expect("one result");
        let ack = ack.map_err(|_| error.clone())?;
        let body = serde_json::json!({"seq": ack.seq, "removed": ack.summary.n_removed == 1});
        return Ok(json_response(200, body.to_string().into_bytes()));
    }
    let (entry, grant) = granted?;
    let mut guards = Vec::new();
    write_guard(0, &entry, &grant, &mut guards)?;
    let mut batch = Batch::new();
    batch.remove(id);
    check_shape(&guards, 0, &batch)?;
    let parts = WriteParts { batches: vec![(entry.id, batch)], guards };
    let mut results = state.submit.write(&identity, parts, WriteSource::Remove { collection: name, id }).await?;
    let ack = results.pop().expect("one result per part");
    write_buffers::give_results(results);
    let ack = ack.map_err(|error| shown_to(state, &identity, name, error))?;
    let body = serde_json::json!({"seq": ack.seq, "removed": ack.summary.n_removed == 1});
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// A write's refusal as its caller may see it: unless the caller may read
/// every item of the collection, a conflict does not say what state the item
/// was found in (docs/SECURITY.md, "What a refusal reveals").
fn shown_to(state: &HttpState, identity: &Identity, collection: &str, error: ApiError) -> ApiError {
    match state.gate.rules().grant(identity, collection, Action::Read) {
        Some(Grant::All) => error,
        _ => error.for_partial_reader(),
    }
}

/// A write's part and, under a restricted write grant, the guard the writer checks.
fn write_guard(
    index: usize,
    entry: &CollectionEntry,
    grant: &WriteGrant,
    guards: &mut Vec<(usize, Arc<WriteGuard>)>,
) -> Result<(), ApiError> {
    if let Some(guard) = WriteGuard::new(grant, &entry.schema)? {
        guards.push((index, Arc::new(guard)));
    }
    Ok(())
}

/// Refuses here, before it takes the writer's time (or a cluster seq), a
/// guarded part with an op no rule admits by what it sets, applies or removes;
/// the writer checks it all again, with the state.
fn check_shape(guards: &[(usize, Arc<WriteGuard>)], part_index: usize, batch: &Batch) -> Result<(), ApiError> {
    let Some((_, guard)) = guards.iter().find(|(index, _)| *index == part_index) else { return Ok(()) };
    guard.check_shape(batch).map_err(|refusal| refusal.to_error(batch))
}

/// The items the guarded parts of one `POST /v1/batch` write. Each part is
/// checked against the committed items, but applied after the parts before it,
/// and those may still be refused whole (a precondition): a later part's check
/// could hold for one outcome and not the other (a part removing `a`, the next
/// upserting `a` without `owner`). So under a write rule an item is written by
/// one part of a request; its ops may repeat it within that part, where the
/// guard follows them one by one.
#[derive(Default)]
struct GuardedItems {
    written: std::collections::HashSet<(ordo_core::CollectionId, Box<str>)>,
}

impl GuardedItems {
    fn claim(&mut self, collection: ordo_core::CollectionId, batch: &Batch) -> Result<(), ApiError> {
        if let Some(op) = batch.ops().find(|op| self.written.contains(&(collection, Box::from(op.id())))) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "item `{}` is also written by an earlier part of this request: under a write rule an item may be written by one part of a request only",
                    op.id()
                ),
            ));
        }
        self.written.extend(batch.ops().map(|op| (collection, Box::from(op.id()))));
        Ok(())
    }
}

/// `{"seq":..,"upserted":..,"removed":..}`
fn write_ack(out: &mut Vec<u8>, ack: &ordo_store::Ack) {
    out.extend_from_slice(b"{\"seq\":");
    write_u64(out, ack.seq);
    out.extend_from_slice(b",\"upserted\":");
    write_u64(out, ack.summary.n_upserted as u64);
    out.extend_from_slice(b",\"removed\":");
    write_u64(out, ack.summary.n_removed as u64);
    out.push(b'}');
}

fn check_op_count(n_ops: usize) -> Result<(), ApiError> {
    if n_ops > limits::MAX_OPS_PER_REQUEST {
        return Err(ApiError::limit(format!(
            "the request has {n_ops} ops; at most {} are allowed",
            limits::MAX_OPS_PER_REQUEST
        )));
    }
    Ok(())
}
