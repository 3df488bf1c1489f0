//! The write routes as the route table calls them: the caller, the body, then
//! the handler of `writes`; with an `Idempotency-Key`, through the table of
//! remembered answers (`crate::idempotency`). A request with a key runs on a
//! task of its own, so that its answer is recorded even when its client went
//! away before it came: that is the case the key is for.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::Response;

use super::request::read_body;
use super::{caller, json_response, writes, Body, Call};
use crate::auth::Identity;
use crate::error::{ApiError, ErrorCode};
use crate::http_state::HttpState;
use crate::idempotency::{self, Answer, Begin, Ticket};

pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on an answer sent again for a retry with the same key.
pub(crate) const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Which write route, with its path's parts.
pub(super) enum WriteRoute {
    Batch { collection: String },
    Multi,
    Remove { collection: String, id: String },
}

impl WriteRoute {
    async fn run(
        &self,
        state: &HttpState,
        identity: Arc<Identity>,
        body: bytes::Bytes,
    ) -> Result<Response<Body>, ApiError> {
        match self {
            WriteRoute::Batch { collection } => writes::batch(state, identity, collection, body).await,
            WriteRoute::Multi => writes::multi_batch(state, identity, body).await,
            WriteRoute::Remove { collection, id } => writes::remove_item(state, identity, collection, id).await,
        }
    }
}

/// A write request: run once per (identity, key) when it has a key.
pub(super) async fn write(
    call: Call<'_>,
    state: &Arc<HttpState>,
    route: WriteRoute,
) -> Result<Response<Body>, ApiError> {
    let key = idempotency_key(&call.request)?;
    let identity = caller(state, call.token, call.path)?;
    let method = call.request.method().clone();
    let path = call.path.to_owned();
    let body = match route {
        WriteRoute::Remove { .. } => bytes::Bytes::new(),
        _ => read_body(call.request).await?,
    };
    let Some(key) = key else { return route.run(state, identity, body).await };
    let fingerprint = state.idempotency.fingerprint(method.as_str(), &path, &body);
    loop {
        match state.idempotency.begin(&identity.key, &key, fingerprint, Instant::now()) {
            Begin::Run(ticket) => return run_once(state.clone(), identity, route, body, ticket).await,
            Begin::Replay(answer) => return Ok(replayed(answer)),
            Begin::Reused => {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    format!(
                        "the Idempotency-Key `{key}` was used by another request: send a new key with a new request"
                    ),
                ))
            }
            // Woken when the first is answered or gone: looked up again.
            Begin::Wait(mut first) => while first.changed().await.is_ok() {},
            Begin::Full => {
                return Err(ApiError::limit(format!(
                    "too many requests with an Idempotency-Key are in flight (at most {} per caller, {} in all)",
                    idempotency::MAX_IDEMPOTENCY_KEYS_PER_IDENTITY,
                    idempotency::MAX_IDEMPOTENCY_KEYS
                )))
            }
        }
    }
}

/// Runs the first request with a key on its own task, records its answer
/// there, and answers it here.
async fn run_once(
    state: Arc<HttpState>,
    identity: Arc<Identity>,
    route: WriteRoute,
    body: bytes::Bytes,
    ticket: Ticket,
) -> Result<Response<Body>, ApiError> {
    let task = tokio::spawn(async move {
        let result = route.run(&state, identity, body).await;
        record(result, ticket).await
    });
    task.await.unwrap_or_else(|_| Err(ApiError::new(ErrorCode::Internal, "the write's task failed")))
}

/// Records an answer for its retries. An answer that says nothing about the
/// write (the server shutting down, a stream that did not answer: `5xx`, or a
/// rate limit) is not: the ticket is dropped, and a retry runs the request again.
async fn record(result: Result<Response<Body>, ApiError>, ticket: Ticket) -> Result<Response<Body>, ApiError> {
    let remembered = |status: u16| status < 500 && status != 429;
    match result {
        Ok(response) if remembered(response.status().as_u16()) => {
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await.map(|collected| collected.to_bytes()).unwrap_or_default();
            ticket.finish(Answer { status: parts.status.as_u16(), body: bytes.clone() });
            Ok(Response::from_parts(parts, Body::new(bytes)))
        }
        Err(error) if remembered(error.status()) => {
            ticket.finish(Answer { status: error.status(), body: error.to_json_body().into() });
            Err(error)
        }
        other => other,
    }
}

fn replayed(answer: Answer) -> Response<Body> {
    let mut response = json_response(answer.status, answer.body.to_vec());
    response.headers_mut().insert(IDEMPOTENT_REPLAYED, hyper::header::HeaderValue::from_static("true"));
    response
}

/// The request's `Idempotency-Key`, if it sent one; a malformed one, or two, is `400`.
fn idempotency_key(request: &hyper::Request<hyper::body::Incoming>) -> Result<Option<String>, ApiError> {
    let mut values = request.headers().get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::bad_request("a request has at most one Idempotency-Key header"));
    }
    if !idempotency::is_valid_key(value.as_bytes()) {
        return Err(ApiError::bad_request(format!(
            "an Idempotency-Key is 1 to {} bytes of ASCII letters, digits, `_`, `-`, `.` or `:`",
            idempotency::MAX_IDEMPOTENCY_KEY_BYTES
        )));
    }
    Ok(Some(String::from_utf8_lossy(value.as_bytes()).into_owned()))
}
