//! The HTTP API: every request after the accept loop. The `Host` and `Origin`
//! gate, then the route table (`route`): each route has its own handler, which
//! authenticates its caller, asks the rules what it may do, and hands typed,
//! pre-checked requests to the writer thread, or changes of state to `submit`.
//! The handlers, by resource: `collections` (schemas), `writes` (batches and
//! removals), `reads` (items and one-shot queries), `admin` (health, limits,
//! metrics, rules, backup) and `demo`; `upgrade` is the WebSocket upgrade,
//! which continues in `ws`; `request` reads what a request sent.

mod admin;
mod collections;
mod demo;
mod idempotent;
mod reads;
mod request;
mod upgrade;
mod writes;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use crate::auth::{Identity, Role};
use crate::error::{ApiError, ErrorCode};
use crate::http_state::{ConnectionSlot, HttpState};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::rate_limit::TokenBucket;
use crate::routing::CollectionEntry;
use crate::rules::{Action, Grant};
use crate::writer::Command;

use idempotent::WriteRoute;
pub(crate) use idempotent::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use request::{bearer_token, check_single_headers, host_of, percent_decode};
pub(crate) use request::{parse, parse_write};

/// Every answer's body: whole, in one buffer.
pub(crate) type Body = Full<Bytes>;

/// One request on its way to its handler.
struct Call<'a> {
    state: &'a HttpState,
    request: Request<Incoming>,
    /// The path as sent (before percent-decoding).
    path: &'a str,
    /// The bearer token of the `Authorization` header, if any.
    token: Option<&'a str>,
}

fn json_response(status: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

fn error_response(error: &ApiError) -> Response<Body> {
    metrics::count_error(error.code);
    let mut response = json_response(error.status(), error.to_json_body());
    if error.status() == 413 {
        // The rest of an oversized body is not read: an HTTP/1.1 connection cannot
        // carry another request after it, and the client is told so.
        response.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    response
}

/// The request's `X-Request-Id`, if it is one the server echoes: 1 to
/// `MAX_HTTP_REQUEST_ID_BYTES` bytes of visible ASCII (no spaces, no controls).
/// Any other value is ignored: not echoed, not logged.
pub(crate) fn request_id(request: &Request<Incoming>) -> Option<hyper::header::HeaderValue> {
    let mut values = request.headers().get_all(X_REQUEST_ID).iter();
    let value = values.next()?;
    // Two ids: neither is the request's (the log and the answer would name different ones).
    if values.next().is_some() {
        return None;
    }
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= limits::MAX_HTTP_REQUEST_ID_BYTES
        && bytes.iter().all(|byte| byte.is_ascii_graphic());
    valid.then(|| value.clone())
}

pub(crate) const X_REQUEST_ID: &str = "x-request-id";

/// Every answer echoes the request's `X-Request-Id` (when valid, see `request_id`).
pub(crate) async fn handle(
    request: Request<Incoming>,
    state: Arc<HttpState>,
    bucket: Arc<Mutex<TokenBucket>>,
    slot: Arc<ConnectionSlot>,
) -> Response<Body> {
    let request_id = request_id(&request);
    let mut response = handle_request(request, state, bucket, slot, request_id.as_ref()).await;
    if let Some(request_id) = request_id {
        response.headers_mut().insert(X_REQUEST_ID, request_id);
    }
    response
}

async fn handle_request(
    request: Request<Incoming>,
    state: Arc<HttpState>,
    bucket: Arc<Mutex<TokenBucket>>,
    slot: Arc<ConnectionSlot>,
    request_id: Option<&hyper::header::HeaderValue>,
) -> Response<Body> {
    metrics::add(&METRICS.http_requests, 1);
    // Both are cheap to keep (no allocation): a refusal is logged with them.
    let (method, uri) = (request.method().clone(), request.uri().clone());
    if !bucket.lock().expect("budget lock").try_take() {
        let error = ApiError::new(
            ErrorCode::RateLimited,
            format!("more than {} requests per second on this connection", state.http_requests_per_second),
        );
        return refused(&method, uri.path(), &error, request_id);
    }
    if *state.shutdown.borrow() {
        return refused(&method, uri.path(), &ApiError::shutting_down(), request_id);
    }
    // Where the request comes from is checked before anything else is read.
    if let Err(error) = check_single_headers(&request) {
        return refused(&method, uri.path(), &error, request_id);
    }
    let host = host_of(&request);
    let origin = request.headers().get(hyper::header::ORIGIN).and_then(|value| value.to_str().ok());
    let checked =
        state.gate.check_host(host.as_deref()).and_then(|()| state.gate.check_origin(origin, host.as_deref()));
    if let Err(error) = checked {
        return refused(&method, uri.path(), &error, request_id);
    }
    match route(request, &state, slot).await {
        Ok(response) => response,
        Err(error) => refused(&method, uri.path(), &error, request_id),
    }
}

/// A request answered with an error: counted (and, for a write, counted as a
/// refused batch: `ordo_batches_refused_total` is one per error a write
/// request is answered with, wherever the refusal came from) and logged.
fn refused(
    method: &Method,
    path: &str,
    error: &ApiError,
    request_id: Option<&hyper::header::HeaderValue>,
) -> Response<Body> {
    if is_write(method, path) {
        metrics::add(&METRICS.batches_refused, 1);
    }
    // The client's request id (already checked to be visible ASCII) lets an
    // operator find the client's own record of this request.
    let request_id = request_id.and_then(|id| id.to_str().ok());
    // A client over its rate would get a line per refused request: that one is `debug`.
    if error.code == ErrorCode::RateLimited {
        tracing::debug!(%method, path, code = error.code.as_str(), status = error.status(), request_id, "request refused: {}", error.message);
    } else {
        tracing::info!(%method, path, code = error.code.as_str(), status = error.status(), request_id, "request refused: {}", error.message);
    }
    error_response(error)
}

/// The requests that write batches (`POST .../batch`, `DELETE .../items/{id}`).
fn is_write(method: &Method, path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    let segments =
        [segments.next(), segments.next(), segments.next(), segments.next(), segments.next(), segments.next()];
    matches!(
        (method, segments),
        (&Method::POST, [Some("v1"), Some("batch"), None, ..])
            | (&Method::POST, [Some("v1"), Some("collections"), Some(_), Some("batch"), None, _])
            | (&Method::DELETE, [Some("v1"), Some("collections"), Some(_), Some("items"), Some(_), None])
    )
}

/// The route table: each method and path to its handler. A path matched with
/// another method is `405`; any other path `404`.
async fn route(
    request: Request<Incoming>,
    state: &Arc<HttpState>,
    slot: Arc<ConnectionSlot>,
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    let segments: Vec<String> =
        path.trim_start_matches('/').split('/').map(percent_decode).collect::<Result<_, _>>()?;
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = request.method().clone();
    let token = bearer_token(&request);
    let call = Call { state, request, path: &path, token: token.as_deref() };
    if segments.first() == Some(&"demo") && !state.demo_enabled {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no such path: {path} (the demo runs with `ordo serve --demo`)"),
        ));
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "health"]) => admin::health(call).await,
        (&Method::GET, ["v1", "limits"]) => Ok(admin::limits(call)),
        (&Method::GET, ["metrics"]) => admin::metrics(call).await,
        (&Method::GET, ["v1", "ws"]) => upgrade::upgrade(call, slot),
        (&Method::GET, ["v1", "rules"]) => admin::get_rules(call).await,
        (&Method::PUT, ["v1", "rules"]) => admin::put_rules(call).await,
        (&Method::POST, ["v1", "backup"]) => admin::backup(call).await,
        (&Method::POST, ["demo", "token"]) => demo::token(call).await,
        (_, ["demo", "simulator" | "send"]) if state.demo.is_none() => {
            Err(ApiError::new(ErrorCode::NotFound, "the demo's simulator runs only with `ordo serve --demo`"))
        }
        (&Method::GET, ["demo", "simulator"]) => demo::simulator_status(call).await,
        (&Method::POST, ["demo", "send"]) => demo::send(call).await,
        (&Method::POST, ["demo", "simulator"]) => demo::set_simulator_rate(call).await,
        (&Method::GET, ["demo"]) => Ok(demo::page()),
        (&Method::GET, ["demo", name]) => demo::file(&path, name),
        (&Method::GET, ["v1", "collections"]) => collections::list(call).await,
        (&Method::PUT, ["v1", "collections", name]) => collections::create(call, name).await,
        (&Method::POST, ["v1", "collections", name, "fields"]) => collections::add_field(call, name).await,
        (&Method::DELETE, ["v1", "collections", name, "fields", field]) => {
            collections::remove_field(call, name, field).await
        }
        (&Method::DELETE, ["v1", "collections", name]) => collections::drop_collection(call, name).await,
        (&Method::GET, ["v1", "collections", name]) => collections::get(call, name).await,
        (&Method::POST, ["v1", "collections", name, "batch"]) => {
            idempotent::write(call, state, WriteRoute::Batch { collection: (*name).to_owned() }).await
        }
        (&Method::POST, ["v1", "batch"]) => idempotent::write(call, state, WriteRoute::Multi).await,
        (&Method::GET, ["v1", "collections", name, "items", id]) => reads::get_item(call, name, id).await,
        (&Method::DELETE, ["v1", "collections", name, "items", id]) => {
            let route = WriteRoute::Remove { collection: (*name).to_owned(), id: (*id).to_owned() };
            idempotent::write(call, state, route).await
        }
        (&Method::POST, ["v1", "collections", name, "query"]) => reads::query(call, name).await,
        _ => Err(no_route(&method, &path, &segments)),
    }
}

/// The answer to a request no route takes: `405` on a known path, else `404`.
fn no_route(method: &Method, path: &str, segments: &[&str]) -> ApiError {
    let known_path = matches!(
        segments,
        ["v1", "health" | "limits" | "ws" | "collections" | "batch" | "rules" | "backup"]
            | ["metrics"]
            | ["demo"]
            | ["demo", "simulator" | "token" | "send"]
            | ["v1", "collections", _]
            | ["v1", "collections", _, "batch" | "query" | "fields"]
            | ["v1", "collections", _, "fields", _]
            | ["v1", "collections", _, "items", _]
    ) || matches!(segments, ["demo", name] if crate::demo::asset(name).is_some());
    if known_path {
        let error = ApiError::bad_request(format!("{method} is not allowed on {path}"));
        return ApiError { status: Some(405), ..error };
    }
    ApiError::new(ErrorCode::NotFound, format!("no such path: {path} (see docs/PROTOCOL.md)"))
}

/// The caller, or `unauthorized`; a reader's request counts against its identity's rate.
fn caller(state: &HttpState, token: Option<&str>, path: &str) -> Result<Arc<Identity>, ApiError> {
    let identity = state.gate.authenticate(token, path)?;
    state.gate.take_request(&identity)?;
    Ok(identity)
}

fn require_admin(identity: &Identity, what: &str) -> Result<(), ApiError> {
    if identity.role == Role::Admin {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, format!("{what} needs an admin token")))
    }
}

fn granted_collection(
    state: &HttpState,
    identity: &Identity,
    name: &str,
    action: Action,
) -> Result<(Arc<CollectionEntry>, Grant), ApiError> {
    state.gate.granted_collection(&state.routes, identity, name, action)
}

fn granted_write(
    state: &HttpState,
    identity: &Identity,
    name: &str,
) -> Result<(Arc<CollectionEntry>, crate::write_rules::WriteGrant), ApiError> {
    state.check_writable(name)?;
    state.gate.granted_write(&state.routes, identity, name)
}

async fn send(state: &HttpState, command: Command) -> Result<(), ApiError> {
    state.writer.send(command).await.map_err(|_| ApiError::shutting_down())
}
