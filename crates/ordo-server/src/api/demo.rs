//! The demo's routes (`ordo serve --demo` only): its page and files, its users'
//! tokens, sending a message as the chat's backend would, and the traffic
//! simulator's rate.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;

use super::request::read_body;
use super::{caller, json_response, require_admin, Body, Call};
use crate::auth::{self, Role};
use crate::error::{ApiError, ErrorCode};
use crate::limits;

/// GET /demo: the page.
pub(super) fn page() -> Response<Body> {
    demo_asset("").expect("the page is embedded")
}

/// GET /demo/{name}: one of the page's files.
pub(super) fn file(path: &str, name: &str) -> Result<Response<Body>, ApiError> {
    demo_asset(name)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no such path: {path} (the demo is at /demo)")))
}

/// POST /demo/token: a demo user's reader token.
pub(super) async fn token(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, request, .. } = call;
    let body = read_body(request).await?;
    let user = crate::demo::parse_token_request(&body)?;
    let secret = state.demo_secret.as_ref().expect("--demo has a secret");
    let ttl = limits::DEMO_TOKEN_TTL_SECS;
    let token = auth::mint(secret, "role", user, Role::Reader, ttl, &serde_json::Map::new());
    let body = serde_json::json!({"token": token, "sub": user, "role": "reader", "expires_in": ttl});
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// GET /demo/simulator: the traffic simulator's rate.
pub(super) async fn simulator_status(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, .. } = call;
    let demo = state.demo.as_ref().expect("checked above");
    Ok(json_response(200, demo.status_json().to_string().into_bytes()))
}

/// POST /demo/simulator (admin): sets the simulator's rate.
pub(super) async fn set_simulator_rate(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    require_admin(&*caller(state, token, path)?, "changing the simulator's rate")?;
    let demo = state.demo.as_ref().expect("checked above");
    demo.refuse_when_followed("no simulator runs; the messages come from PostgreSQL")?;
    let body = read_body(request).await?;
    let rate = crate::demo::parse_rate_request(&body)?;
    demo.simulator.set_rate(rate);
    Ok(json_response(200, serde_json::json!({ "rate": rate }).to_string().into_bytes()))
}

/// POST /demo/send: the signed-in user's message to one of its rooms, written
/// by the demo's backend (the message, the room, the sender's read mark).
pub(super) async fn send(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    let identity = caller(state, token, path)?;
    let demo = state.demo.as_ref().expect("checked above");
    let body = read_body(request).await?;
    let seq = demo.send(&identity.sub, &body).await?;
    Ok(json_response(200, serde_json::json!({ "seq": seq }).to_string().into_bytes()))
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
