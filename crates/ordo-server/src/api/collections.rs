//! The collections' routes: list, create, read, drop, and add or remove a field.

use std::sync::Arc;

use hyper::Response;
use tokio::sync::oneshot;

use super::request::read_body;
use super::{caller, granted_collection, json_response, parse, require_admin, send, Body, Call};
use crate::auth::Role;
use crate::error::{ApiError, ErrorCode};
use crate::http_state::HttpState;
use crate::routing::{is_reserved_name, CollectionEntry};
use crate::rules::{self, Action, Grant};
use crate::submit::AddedField;
use crate::wire::{self, SchemaRequest};
use crate::writer::Command;

/// GET /v1/collections: the collections the caller may read.
pub(super) async fn list(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    let identity = caller(state, token, path)?;
    let rules = state.gate.rules();
    let routes = state.routes.read().expect("routes lock");
    let mut list: Vec<serde_json::Value> = routes
        .iter()
        .filter(|(_, entry)| identity.role == Role::Admin || rules.may_read(&identity, &entry.name))
        .map(|(_, entry)| wire::schema_json(&entry.name, &entry.schema, None, |id| collection_name(&routes, id)))
        .collect();
    drop(routes);
    list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(json_response(200, serde_json::json!({"collections": list}).to_string().into_bytes()))
}

/// PUT /v1/collections/{name}: creates a collection, or finds it as it is.
pub(super) async fn create(call: Call<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    let identity = caller(state, token, path)?;
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    if !state.gate.rules().may_create(&identity, name) {
        return Err(rules::forbidden(name, "create"));
    }
    let body = read_body(request).await?;
    // Every attempt counts against the quota, refused ones too.
    state.gate.take_creation(&identity)?;
    let schema_request: SchemaRequest = parse(&body)?;
    state.gate.rules().check_ref_targets(&identity, schema_request.ref_targets())?;
    let schema = schema_request.to_schema(|target| collection_id(state, target))?;
    let (created, entry) = state.submit.create_collection(&identity, name, schema, &body).await?;
    let body = collection_json(state, &entry, None);
    Ok(json_response(if created { 201 } else { 200 }, body.to_string().into_bytes()))
}

/// POST /v1/collections/{name}/fields (admin).
pub(super) async fn add_field(call: Call<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    let identity = caller(state, token, path)?;
    require_admin(&identity, "adding a field")?;
    let entry = schema_target(state, name)?;
    let body = read_body(request).await?;
    let add: wire::AddFieldRequest = parse(&body)?;
    let (field_type, default) = add.typed(|target| collection_id(state, target))?;
    let field = AddedField { name: add.name, field_type, default, body: &body };
    Ok(fields_changed(state, state.submit.add_field(&identity, &entry, name, field).await?))
}

/// DELETE /v1/collections/{name}/fields/{field} (admin).
pub(super) async fn remove_field(call: Call<'_>, name: &str, field: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    let identity = caller(state, token, path)?;
    require_admin(&identity, "removing a field")?;
    let entry = schema_target(state, name)?;
    Ok(fields_changed(state, state.submit.remove_field(&identity, &entry, name, field).await?))
}

/// DELETE /v1/collections/{name} (admin).
pub(super) async fn drop_collection(call: Call<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    let identity = caller(state, token, path)?;
    require_admin(&identity, "dropping a collection")?;
    let entry = schema_target(state, name)?;
    let seq = state.submit.drop_collection(&identity, &entry, name).await?;
    let body = serde_json::json!({"seq": seq, "dropped": entry.name});
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// GET /v1/collections/{name}: the schema, and the item count for a reader of every item.
pub(super) async fn get(call: Call<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    let identity = caller(state, token, path)?;
    let (entry, grant) = granted_collection(state, &identity, name, Action::Read)?;
    // The item count would tell a reader how many items its rule hides.
    let n_items = match grant {
        Grant::All => {
            let (reply, answer) = oneshot::channel();
            send(state, Command::CollectionLen { collection: entry.id, reply }).await?;
            Some(answer.await.map_err(|_| ApiError::shutting_down())?)
        }
        Grant::Where(_) | Grant::Through(_) | Grant::Related(_) => None,
    };
    let body = collection_json(state, &entry, n_items);
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// The id of the collection a `ref` field names as its target (exact name).
fn collection_id(state: &HttpState, name: &str) -> Option<ordo_core::CollectionId> {
    let routes = state.routes.read().expect("routes lock");
    routes.get(name).filter(|entry| entry.name == name).map(|entry| entry.id)
}

/// The name of a `ref` field's target (a scan: schemas are read rarely, refs are few).
fn collection_name(
    routes: &crate::name_routes::NameRoutes<Arc<CollectionEntry>>,
    id: ordo_core::CollectionId,
) -> Option<String> {
    routes.iter().find(|(_, entry)| entry.id == id).map(|(_, entry)| entry.name.clone())
}

/// The collection JSON, with each `ref` field's target named.
fn collection_json(state: &HttpState, entry: &CollectionEntry, n_items: Option<usize>) -> serde_json::Value {
    let routes = state.routes.read().expect("routes lock");
    wire::schema_json(&entry.name, &entry.schema, n_items, |id| collection_name(&routes, id))
}

/// The collection a schema change or drop names (admins only reach here; the
/// server's own collections are not theirs to change).
fn schema_target(state: &HttpState, name: &str) -> Result<Arc<CollectionEntry>, ApiError> {
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    state.check_writable(name)?;
    state.routes.read().expect("routes lock").get(name).cloned().ok_or_else(|| ApiError::unknown_collection(name))
}

/// The collection JSON plus `seq` of a change of fields.
fn fields_changed(state: &HttpState, (seq, entry): (u64, Arc<CollectionEntry>)) -> Response<Body> {
    let mut body = collection_json(state, &entry, None);
    body["seq"] = seq.into();
    json_response(200, body.to_string().into_bytes())
}
