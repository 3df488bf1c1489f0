//! `GET /v1/ws`: the WebSocket upgrade; the connection continues in `ws`.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;

use super::request::percent_decode;
use super::{Body, Call};
use crate::error::ApiError;
use crate::http_state::ConnectionSlot;
use crate::ws;

/// The WebSocket upgrade. The WebSocket takes over the TCP connection, and with
/// it the connection's `slot` under the cap (so WebSockets need no cap of their
/// own). A token may come in the `Authorization` header or the `access_token`
/// query parameter (browsers cannot set headers; the `auth` message is the
/// better way for them, as it keeps the token out of URLs and logs).
pub(super) fn upgrade(call: Call<'_>, slot: Arc<ConnectionSlot>) -> Result<Response<Body>, ApiError> {
    let Call { state, mut request, token, .. } = call;
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
    state.websockets.spawn(async move {
        let _slot = slot;
        if let Ok(ws) = upgrade.await {
            ws::serve_connection(ws, context, identity_slot).await;
        }
    });
    let (parts, _) = response.into_parts();
    Ok(Response::from_parts(parts, Full::new(Bytes::new())))
}
