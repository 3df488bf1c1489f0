//! The read routes: an item, and a one-shot query of a window.

use hyper::Response;
use tokio::sync::oneshot;

use super::request::read_body;
use super::{caller, granted_collection, json_response, parse, send, Body, Call};
use crate::error::{ApiError, ErrorCode};
use crate::rules::Action;
use crate::wire::{self, QueryRequest};
use crate::writer::Command;

/// GET /v1/collections/{name}/items/{id}.
pub(super) async fn get_item(call: Call<'_>, name: &str, id: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    let identity = caller(state, token, path)?;
    let (entry, grant) = granted_collection(state, &identity, name, Action::Read)?;
    // A collection read by relationship has no row predicate: its items are read
    // only in views pinned to a related value, never by id (`Grant::predicate`).
    let predicate = grant.predicate(&entry.schema)?;
    let (reply, answer) = oneshot::channel();
    send(state, Command::GetItem { collection: entry.id, id: id.to_string(), predicate, reply }).await?;
    match answer.await.map_err(|_| ApiError::shutting_down())? {
        Some(body) => Ok(json_response(200, body)),
        None => Err(ApiError::new(ErrorCode::NotFound, format!("no item `{id}` in `{}`", entry.name))),
    }
}

/// POST /v1/collections/{name}/query: a one-shot window.
pub(super) async fn query(call: Call<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    let identity = caller(state, token, path)?;
    let granted = match granted_collection(state, &identity, name, Action::Read) {
        Err(error) if error.code != ErrorCode::UnknownCollection => return Err(error),
        granted => granted,
    };
    let body = read_body(request).await?;
    let parsed: Result<QueryRequest, ApiError> = parse(&body);
    let (entry, grant) = match granted {
        // A collection created by the entry at `min_seq` or before, not
        // applied here yet (another node of a cluster answered its
        // creation): wait for it, then look again. Otherwise an unknown
        // collection is the answer, whatever the body.
        Err(error) if error.code == ErrorCode::UnknownCollection => match &parsed {
            Ok(query) if query.min_seq.is_some_and(|min_seq| min_seq > crate::min_seq::last(&state.seq)) => {
                crate::min_seq::wait(&state.seq, query.min_seq).await?;
                granted_collection(state, &identity, name, Action::Read)?
            }
            _ => return Err(error),
        },
        granted => granted?,
    };
    let query = parsed?;
    let access = crate::related::view_access(&state.gate, &state.routes, &identity, &entry, &grant, &query.filter)?;
    let reader = crate::refs::Reader { gate: &state.gate, routes: &state.routes, identity: &identity };
    let read_schema = crate::refs::read_schema(&reader, &entry, &query.filter, &query.sort, query.fields.as_deref())?;
    let schema = read_schema.as_ref().unwrap_or(&entry.schema);
    let mut spec = wire::window_spec(
        schema,
        &query.filter,
        &query.sort,
        query.position_keys(),
        query.limit,
        query.fields.as_deref(),
        query.payload,
    )?;
    wire::restrict_spec(&mut spec, access.predicate.as_ref(), schema)?;
    spec.relation = access.relation;
    // Read-your-writes: the writer answers queries in order, after every
    // batch it applied before, so once it has published `min_seq` the
    // answer reflects it.
    crate::min_seq::wait(&state.seq, query.min_seq).await?;
    let (reply, answer) = oneshot::channel();
    send(state, Command::Query { collection: entry.id, schema: entry.schema.clone(), spec, reply }).await?;
    let body = answer.await.map_err(|_| ApiError::shutting_down())??;
    Ok(json_response(200, body))
}
