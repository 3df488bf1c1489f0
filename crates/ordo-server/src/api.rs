//! The HTTP API: every request after the accept loop. The `Host` and `Origin`
//! gate, then the router: each route authenticates its caller, asks the rules
//! what it may do, and hands typed, pre-checked commands to the writer thread.
//! The WebSocket upgrade ends here and continues in `ws`.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tokio::sync::oneshot;

use ordo_core::Batch;

use crate::auth::{self, Identity, Role};
use crate::error::{ApiError, ErrorCode};
use crate::frame::write_u64;
use crate::http_state::{ConnectionSlot, HttpState};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::rate_limit::TokenBucket;
use crate::routing::{is_reserved_name, CollectionEntry};
use crate::rules::{self, Action, Grant, RuleSet, RulesDoc};
use crate::submit::{AddedField, WriteParts, WriteSource};
use crate::wire::{self, BatchRequest, MultiBatchRequest, QueryRequest, SchemaRequest};
use crate::write_buffers;
use crate::write_guard::WriteGuard;
use crate::writer::Command;
use crate::ws;

/// Every answer's body: whole, in one buffer.
pub(crate) type Body = Full<Bytes>;

fn json_response(status: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// A file of the demo page. `no-cache`: a browser revalidates, so a rebuilt
/// server's page is never mixed with a cached script of the last one.
fn demo_asset(name: &str) -> Option<Response<Body>> {
    let (content_type, body) = crate::demo::asset(name)?;
    let response = Response::builder()
        .status(200)
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("a valid response");
    Some(response)
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

/// Headers the server reads, each of which a request may send once: with two
/// copies, the check (the `Host` and `Origin` gate, authentication) and what a
/// proxy, a log or the next reader takes could be different copies.
const SINGLE_HEADERS: [hyper::header::HeaderName; 4] =
    [hyper::header::HOST, hyper::header::ORIGIN, hyper::header::AUTHORIZATION, hyper::header::SEC_WEBSOCKET_KEY];

/// Refuses (`bad_request`) a request repeating a header of `SINGLE_HEADERS`, or
/// naming two different hosts (an HTTP/2 `:authority` and a `Host`, or an
/// HTTP/1.1 absolute URI and a `Host`).
fn check_single_headers(request: &Request<Incoming>) -> Result<(), ApiError> {
    let headers = request.headers();
    for name in &SINGLE_HEADERS {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(ApiError::bad_request(format!("the request has more than one `{name}` header")));
        }
    }
    let host = headers.get(hyper::header::HOST).map(hyper::header::HeaderValue::as_bytes);
    let authority = request.uri().authority().map(|authority| authority.as_str().as_bytes());
    if let (Some(host), Some(authority)) = (host, authority) {
        if !host.eq_ignore_ascii_case(authority) {
            return Err(ApiError::bad_request("the request names two different hosts (its URI and `Host`)"));
        }
    }
    Ok(())
}

/// The request's host: `Host`, or the URI's authority (HTTP/2's `:authority`).
fn host_of(request: &Request<Incoming>) -> Option<String> {
    match request.headers().get(hyper::header::HOST).and_then(|value| value.to_str().ok()) {
        Some(host) => Some(host.to_owned()),
        None => request.uri().authority().map(|authority| authority.as_str().to_owned()),
    }
}

/// The bearer token of the request's `Authorization` header.
fn bearer_token(request: &Request<Incoming>) -> Option<String> {
    let header = request.headers().get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    auth::bearer(header).map(str::to_owned)
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

/// A write's refusal as its caller may see it: unless the caller may read
/// every item of the collection, a conflict does not say what state the item
/// was found in (docs/SECURITY.md, "What a refusal reveals").
fn shown_to(state: &HttpState, identity: &Identity, collection: &str, error: ApiError) -> ApiError {
    match state.gate.rules().grant(identity, collection, Action::Read) {
        Some(Grant::All) => error,
        _ => error.for_partial_reader(),
    }
}

/// A write's part and, under a filtered write rule, the guard the writer checks.
fn write_guard(
    index: usize,
    entry: &CollectionEntry,
    grant: &Grant,
    guards: &mut Vec<(usize, Arc<WriteGuard>)>,
) -> Result<(), ApiError> {
    if let Some(guard) = WriteGuard::new(grant, &entry.schema)? {
        guards.push((index, Arc::new(guard)));
    }
    Ok(())
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

async fn route(
    request: Request<Incoming>,
    state: &HttpState,
    slot: Arc<ConnectionSlot>,
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    let segments: Vec<String> =
        path.trim_start_matches('/').split('/').map(percent_decode).collect::<Result<_, _>>()?;
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = request.method().clone();
    let token = bearer_token(&request);
    let token = token.as_deref();
    let demo_path = segments.first() == Some(&"demo");
    if demo_path && !state.demo_enabled {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no such path: {path} (the demo runs with `ordo serve --demo`)"),
        ));
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "health"]) => {
            // Anyone may ask whether the server is up; only an admin learns its sizes.
            let admin = token.is_some() || !state.gate.auth_enabled();
            let admin = admin && caller(state, token, &path).is_ok_and(|identity| identity.role == Role::Admin);
            let body = if admin {
                let gauges = gauges(state).await?;
                serde_json::json!({
                    "status": "ok", "protocol": 1, "last_seq": gauges.last_seq,
                    "collections": gauges.n_collections, "items": gauges.n_items,
                })
            } else {
                serde_json::json!({"status": "ok", "protocol": 1})
            };
            let mut body = body;
            if let Some(cluster) = state.cluster_health() {
                // Everyone: a load balancer reads `lagging` without a token.
                body["cluster"] = cluster;
            }
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (&Method::GET, ["v1", "limits"]) => Ok(json_response(200, state.limits_json.to_string().into_bytes())),
        (&Method::GET, ["metrics"]) => {
            if !state.metrics_public {
                require_admin(&*caller(state, token, &path)?, "/metrics (or `--metrics-public`)")?;
            }
            let gauges = gauges(state).await?;
            let depth = state.writer.max_capacity() - state.writer.capacity();
            let mut text = metrics::render(&gauges, depth);
            state.render_cluster_metrics(&mut text);
            Ok(Response::builder()
                .status(200)
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(text)))
                .expect("a valid response"))
        }
        (&Method::GET, ["v1", "ws"]) => upgrade(request, state, token, slot),
        (&Method::GET, ["v1", "rules"]) => {
            require_admin(&*caller(state, token, &path)?, "reading the rules")?;
            let body = serde_json::to_vec(state.gate.rules().doc()).expect("rules serialise");
            Ok(json_response(200, body))
        }
        (&Method::PUT, ["v1", "rules"]) => {
            let identity = caller(state, token, &path)?;
            require_admin(&identity, "changing the rules")?;
            let body = read_body(request).await?;
            let doc: RulesDoc = parse(&body)?;
            let rules = RuleSet::compile(doc.clone())?;
            let text = serde_json::to_string(&doc).expect("rules serialise");
            let seq = state.submit.set_rules(&identity, text, rules, &state.gate).await?;
            let mut body = serde_json::to_value(&doc).expect("rules serialise");
            body["seq"] = seq.into();
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (&Method::POST, ["v1", "backup"]) => {
            require_admin(&*caller(state, token, &path)?, "a backup")?;
            let body = read_body(request).await?;
            Ok(json_response(200, crate::backup::backup(state, &body).await?))
        }
        (&Method::POST, ["demo", "token"]) => {
            let body = read_body(request).await?;
            let user = crate::demo::parse_token_request(&body)?;
            let secret = state.demo_secret.as_ref().expect("--demo has a secret");
            let ttl = limits::DEMO_TOKEN_TTL_SECS;
            let token = auth::mint(secret, "role", user, Role::Reader, ttl, &serde_json::Map::new());
            let body = serde_json::json!({"token": token, "sub": user, "role": "reader", "expires_in": ttl});
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (_, ["demo", "simulator"]) if state.demo.is_none() => {
            Err(ApiError::new(ErrorCode::NotFound, "the demo's simulator runs only with `ordo serve --demo`"))
        }
        (&Method::GET, ["demo", "simulator"]) => {
            let simulator = state.demo.as_ref().expect("checked above");
            Ok(json_response(200, simulator.status_json().to_string().into_bytes()))
        }
        (&Method::POST, ["demo", "simulator"]) => {
            require_admin(&*caller(state, token, &path)?, "changing the simulator's rate")?;
            let simulator = state.demo.as_ref().expect("checked above");
            let body = read_body(request).await?;
            let rate = crate::demo::parse_rate_request(&body)?;
            simulator.set_rate(rate);
            Ok(json_response(200, serde_json::json!({ "rate": rate }).to_string().into_bytes()))
        }
        (&Method::GET, ["demo"]) => Ok(demo_asset("").expect("the page is embedded")),
        (&Method::GET, ["demo", name]) => demo_asset(name)
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no such path: {path} (the demo is at /demo)"))),
        (&Method::GET, ["v1", "collections"]) => {
            let identity = caller(state, token, &path)?;
            let rules = state.gate.rules();
            let routes = state.routes.read().expect("routes lock");
            let mut list: Vec<serde_json::Value> = routes
                .iter()
                .filter(|(_, entry)| identity.role == Role::Admin || rules.may_read(&identity, &entry.name))
                .map(|(_, entry)| {
                    wire::schema_json(&entry.name, &entry.schema, None, |id| collection_name(&routes, id))
                })
                .collect();
            drop(routes);
            list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json_response(200, serde_json::json!({"collections": list}).to_string().into_bytes()))
        }
        (&Method::PUT, ["v1", "collections", name]) => {
            let identity = caller(state, token, &path)?;
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
        (&Method::POST, ["v1", "collections", name, "fields"]) => {
            let identity = caller(state, token, &path)?;
            require_admin(&identity, "adding a field")?;
            let entry = schema_target(state, name)?;
            let body = read_body(request).await?;
            let add: wire::AddFieldRequest = parse(&body)?;
            let (field_type, default) = add.typed(|target| collection_id(state, target))?;
            let field = AddedField { name: add.name, field_type, default, body: &body };
            Ok(fields_changed(state, state.submit.add_field(&identity, &entry, name, field).await?))
        }
        (&Method::DELETE, ["v1", "collections", name, "fields", field]) => {
            let identity = caller(state, token, &path)?;
            require_admin(&identity, "removing a field")?;
            let entry = schema_target(state, name)?;
            Ok(fields_changed(state, state.submit.remove_field(&identity, &entry, name, field).await?))
        }
        (&Method::DELETE, ["v1", "collections", name]) => {
            let identity = caller(state, token, &path)?;
            require_admin(&identity, "dropping a collection")?;
            let entry = schema_target(state, name)?;
            let seq = state.submit.drop_collection(&identity, &entry, name).await?;
            let body = serde_json::json!({"seq": seq, "dropped": entry.name});
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (&Method::GET, ["v1", "collections", name]) => {
            let identity = caller(state, token, &path)?;
            let (entry, grant) = granted_collection(state, &identity, name, Action::Read)?;
            // The item count would tell a reader how many items its rule hides.
            let n_items = match grant {
                Grant::All => {
                    let (reply, answer) = oneshot::channel();
                    send(state, Command::CollectionLen { collection: entry.id, reply }).await?;
                    Some(answer.await.map_err(|_| ApiError::shutting_down())?)
                }
                Grant::Where(_) => None,
            };
            let body = collection_json(state, &entry, n_items);
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (&Method::POST, ["v1", "collections", name, "batch"]) => {
            let identity = caller(state, token, &path)?;
            let granted = granted_collection(state, &identity, name, Action::Write);
            if let Some(error) = granted.as_ref().err().filter(|error| state.submit.submits_despite(error)) {
                let body = read_body(request).await?;
                check_op_count(parse_write::<BatchRequest>(&body)?.ops.len())?;
                let source = WriteSource::Batch { collection: name, body: &body };
                let results = state.submit.write(&identity, WriteParts::default(), source).await;
                let ack = results.map_err(|_| error.clone())?.pop().expect("one result");
                let ack = ack.map_err(|error| shown_to(state, &identity, name, error))?;
                let mut body = Vec::with_capacity(64);
                write_ack(&mut body, &ack);
                return Ok(json_response(200, body));
            }
            let (entry, grant) = granted?;
            let mut guards = Vec::new();
            write_guard(0, &entry, &grant, &mut guards)?;
            let body = read_body(request).await?;
            let batch_request: BatchRequest = parse_write(&body)?;
            check_op_count(batch_request.ops.len())?;
            let mut batch = write_buffers::take_batch();
            wire::fill_batch(&mut batch, &entry.schema, &batch_request.ops, 0)?;
            let mut parts = write_buffers::take_list();
            parts.push((entry.id, batch));
            let parts = WriteParts { batches: parts, guards };
            let mut results =
                state.submit.write(&identity, parts, WriteSource::Batch { collection: name, body: &body }).await?;
            let ack =
                results.pop().expect("one result per part").map_err(|error| shown_to(state, &identity, name, error))?;
            let mut body = Vec::with_capacity(64);
            write_ack(&mut body, &ack);
            Ok(json_response(200, body))
        }
        (&Method::POST, ["v1", "batch"]) => {
            let identity = caller(state, token, &path)?;
            let body = read_body(request).await?;
            let multi: MultiBatchRequest = parse_write(&body)?;
            check_op_count(multi.writes.iter().map(|write| write.ops.len()).sum())?;
            // A part refused here (unknown collection, a value of the wrong type) fails
            // alone, as a part refused by the engine would; the others are written.
            let mut refused: Vec<(usize, ApiError)> = Vec::new();
            let mut parts = write_buffers::take_list();
            let mut guards = Vec::new();
            let mut guarded_items = GuardedItems::default();
            for (index, part) in multi.writes.iter().enumerate() {
                let prepared =
                    granted_collection(state, &identity, &part.collection, Action::Write).and_then(|(entry, grant)| {
                        write_guard(parts.len(), &entry, &grant, &mut guards)?;
                        let guarded = guards.last().is_some_and(|(guarded, _)| *guarded == parts.len());
                        let mut batch = write_buffers::take_batch();
                        let filled = wire::fill_batch(&mut batch, &entry.schema, &part.ops, 0).and_then(|()| {
                            if guarded {
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
                    });
                match prepared {
                    // Submitted without a local batch: its result follows those of the parts before it.
                    Err(error) if state.submit.submits_despite(&error) => {}
                    Ok(prepared) => parts.push(prepared),
                    Err(error) => refused
                        .push((index, ApiError { message: format!("write {index}: {}", error.message), ..error })),
                }
            }
            let source = WriteSource::Multi { body: &body, refused: &refused };
            let parts = WriteParts { batches: parts, guards };
            let mut written = state.submit.write(&identity, parts, source).await?.into_iter();
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
                        .map_err(|error| shown_to(state, &identity, &multi.writes[index].collection, error)),
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
            Ok(json_response(status, body))
        }
        (&Method::GET, ["v1", "collections", name, "items", id]) => {
            let identity = caller(state, token, &path)?;
            let (entry, grant) = granted_collection(state, &identity, name, Action::Read)?;
            let predicate = grant.predicate(&entry.schema)?;
            let (reply, answer) = oneshot::channel();
            send(state, Command::GetItem { collection: entry.id, id: id.to_string(), predicate, reply }).await?;
            match answer.await.map_err(|_| ApiError::shutting_down())? {
                Some(body) => Ok(json_response(200, body)),
                None => Err(ApiError::new(ErrorCode::NotFound, format!("no item `{id}` in `{}`", entry.name))),
            }
        }
        (&Method::DELETE, ["v1", "collections", name, "items", id]) => {
            let identity = caller(state, token, &path)?;
            let granted = granted_collection(state, &identity, name, Action::Write);
            if let Some(error) = granted.as_ref().err().filter(|error| state.submit.submits_despite(error)) {
                let source = WriteSource::Remove { collection: name, id };
                let ack =
                    state.submit.write(&identity, WriteParts::default(), source).await?.pop().expect("one result");
                let ack = ack.map_err(|_| error.clone())?;
                let body = serde_json::json!({"seq": ack.seq, "removed": ack.summary.n_removed == 1});
                return Ok(json_response(200, body.to_string().into_bytes()));
            }
            let (entry, grant) = granted?;
            let mut guards = Vec::new();
            write_guard(0, &entry, &grant, &mut guards)?;
            let mut batch = Batch::new();
            batch.remove(id);
            let parts = WriteParts { batches: vec![(entry.id, batch)], guards };
            let mut results =
                state.submit.write(&identity, parts, WriteSource::Remove { collection: name, id }).await?;
            let ack =
                results.pop().expect("one result per part").map_err(|error| shown_to(state, &identity, name, error))?;
            let body = serde_json::json!({"seq": ack.seq, "removed": ack.summary.n_removed == 1});
            Ok(json_response(200, body.to_string().into_bytes()))
        }
        (&Method::POST, ["v1", "collections", name, "query"]) => {
            let identity = caller(state, token, &path)?;
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
            let reader = crate::refs::Reader { gate: &state.gate, routes: &state.routes, identity: &identity };
            let read_schema =
                crate::refs::read_schema(&reader, &entry, &query.filter, &query.sort, query.fields.as_deref())?;
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
            wire::restrict_spec(&mut spec, grant.predicate(&entry.schema)?.as_ref(), schema)?;
            // Read-your-writes: the writer answers queries in order, after every
            // batch it applied before, so once it has published `min_seq` the
            // answer reflects it.
            crate::min_seq::wait(&state.seq, query.min_seq).await?;
            let (reply, answer) = oneshot::channel();
            send(state, Command::Query { collection: entry.id, schema: entry.schema.clone(), spec, reply }).await?;
            let body = answer.await.map_err(|_| ApiError::shutting_down())??;
            Ok(json_response(200, body))
        }
        _ => {
            let known_path = matches!(
                segments.as_slice(),
                ["v1", "health" | "limits" | "ws" | "collections" | "batch" | "rules" | "backup"]
                    | ["metrics"]
                    | ["demo"]
                    | ["demo", "simulator" | "token"]
                    | ["v1", "collections", _]
                    | ["v1", "collections", _, "batch" | "query" | "fields"]
                    | ["v1", "collections", _, "fields", _]
                    | ["v1", "collections", _, "items", _]
            ) || matches!(segments.as_slice(), ["demo", name] if crate::demo::asset(name).is_some());
            if known_path {
                let error = ApiError::bad_request(format!("{method} is not allowed on {path}"));
                return Err(ApiError { status: Some(405), ..error });
            }
            Err(ApiError::new(ErrorCode::NotFound, format!("no such path: {path} (see docs/PROTOCOL.md)")))
        }
    }
}

/// The collection a schema change or drop names (admins only reach here; the
/// server's own collections are not theirs to change).
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

fn schema_target(state: &HttpState, name: &str) -> Result<Arc<CollectionEntry>, ApiError> {
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    state.routes.read().expect("routes lock").get(name).cloned().ok_or_else(|| ApiError::unknown_collection(name))
}

/// The collection JSON plus `seq` of a change of fields.
fn fields_changed(state: &HttpState, (seq, entry): (u64, Arc<CollectionEntry>)) -> Response<Body> {
    let mut body = collection_json(state, &entry, None);
    body["seq"] = seq.into();
    json_response(200, body.to_string().into_bytes())
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

async fn send(state: &HttpState, command: Command) -> Result<(), ApiError> {
    state.writer.send(command).await.map_err(|_| ApiError::shutting_down())
}

async fn gauges(state: &HttpState) -> Result<crate::metrics::WriterGauges, ApiError> {
    let (reply, answer) = oneshot::channel();
    send(state, Command::Gauges { reply }).await?;
    answer.await.map_err(|_| ApiError::shutting_down())
}

/// A body read as a whole: checked for one meaning first (`strict_json`).
pub(crate) fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    crate::strict_json::parse(body, "the body")
}

/// A write's body, on the write path: its typed parse refuses every repeated
/// key and every integer too wide for 64 bits itself (derived structs for the
/// known keys, `wire::fill_batch` for field values and the payload), so the
/// body is read once.
pub(crate) fn parse_write<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|error| ApiError::from_json(&error))
}

/// The body, at most `MAX_HTTP_BODY_BYTES`: one that says it is longer
/// (`Content-Length`) is refused before any of it is read, and one sent without
/// a length (chunked, or HTTP/2 without `content-length`) is refused as soon as
/// it passes the limit; both with `413 limit_exceeded`, and the connection is
/// then closed (`refused`) rather than the rest read.
async fn read_body(request: Request<Incoming>) -> Result<Bytes, ApiError> {
    use hyper::body::Body as _;
    let too_large = || {
        let error = ApiError::limit(format!("the request body is over {} bytes", limits::MAX_HTTP_BODY_BYTES));
        ApiError { status: Some(413), ..error }
    };
    let body = request.into_body();
    if body.size_hint().lower() > limits::MAX_HTTP_BODY_BYTES as u64 {
        return Err(too_large());
    }
    match Limited::new(body, limits::MAX_HTTP_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(error) => Err(ApiError::bad_request(format!("could not read the request body: {error}"))),
    }
}

fn percent_decode(segment: &str) -> Result<String, ApiError> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes.get(index + 1..index + 3).and_then(|hex| std::str::from_utf8(hex).ok());
            let byte = hex.and_then(|hex| u8::from_str_radix(hex, 16).ok());
            let byte = byte.ok_or_else(|| ApiError::bad_request(format!("bad percent-encoding in `{segment}`")))?;
            out.push(byte);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request(format!("`{segment}` is not UTF-8 once decoded")))
}

/// The WebSocket upgrade. The WebSocket takes over the TCP connection, and with
/// it the connection's `slot` under the cap (so WebSockets need no cap of their
/// own). A token may come in the `Authorization` header or the `access_token`
/// query parameter (browsers cannot set headers; the `auth` message is the
/// better way for them, as it keeps the token out of URLs and logs).
fn upgrade(
    mut request: Request<Incoming>,
    state: &HttpState,
    token: Option<&str>,
    slot: Arc<ConnectionSlot>,
) -> Result<Response<Body>, ApiError> {
    if !fastwebsockets::upgrade::is_upgrade_request(&request) {
        return Err(ApiError::bad_request("/v1/ws takes a WebSocket upgrade request"));
    }
    let query = request.uri().query().unwrap_or("");
    let mut query_tokens = query.split('&').filter_map(|pair| pair.strip_prefix("access_token="));
    let query_token = query_tokens.next().map(percent_decode).transpose()?;
    if query_tokens.next().is_some() || (query_token.is_some() && token.is_some()) {
        return Err(ApiError::bad_request("the upgrade carries more than one token; send one"));
    }
    let identity = state.gate.authenticate_optional(token.or(query_token.as_deref()), "/v1/ws")?;
    if let Some(identity) = &identity {
        state.gate.take_request(identity)?;
    }
    let identity_slot = state.gate.open_connection(identity.as_deref())?;
    let (response, upgrade) = fastwebsockets::upgrade::upgrade(&mut request)
        .map_err(|error| ApiError::bad_request(format!("WebSocket upgrade refused: {error}")))?;
    let context = state.connection_context(identity);
    tokio::spawn(async move {
        let _slot = slot;
        if let Ok(ws) = upgrade.await {
            ws::serve_connection(ws, context, identity_slot).await;
        }
    });
    let (parts, _) = response.into_parts();
    Ok(Response::from_parts(parts, Full::new(Bytes::new())))
}
