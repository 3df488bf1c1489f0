//! What a request sent, read and checked: its headers (each read one sent once),
//! its bearer token, its body (bounded, and parsed for one meaning only) and its
//! path's segments.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::Request;

use crate::auth;
use crate::error::ApiError;
use crate::limits;

/// Headers the server reads, each of which a request may send once: with two
/// copies, the check (the `Host` and `Origin` gate, authentication) and what a
/// proxy, a log or the next reader takes could be different copies.
const SINGLE_HEADERS: [hyper::header::HeaderName; 4] =
    [hyper::header::HOST, hyper::header::ORIGIN, hyper::header::AUTHORIZATION, hyper::header::SEC_WEBSOCKET_KEY];

/// Refuses (`bad_request`) a request repeating a header of `SINGLE_HEADERS`, or
/// naming two different hosts (an HTTP/2 `:authority` and a `Host`, or an
/// HTTP/1.1 absolute URI and a `Host`).
pub(super) fn check_single_headers(request: &Request<Incoming>) -> Result<(), ApiError> {
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
pub(super) fn host_of(request: &Request<Incoming>) -> Option<String> {
    match request.headers().get(hyper::header::HOST).and_then(|value| value.to_str().ok()) {
        Some(host) => Some(host.to_owned()),
        None => request.uri().authority().map(|authority| authority.as_str().to_owned()),
    }
}

/// The bearer token of the request's `Authorization` header.
pub(super) fn bearer_token(request: &Request<Incoming>) -> Option<String> {
    let header = request.headers().get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    auth::bearer(header).map(str::to_owned)
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
pub(super) async fn read_body(request: Request<Incoming>) -> Result<Bytes, ApiError> {
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

pub(super) fn percent_decode(segment: &str) -> Result<String, ApiError> {
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
