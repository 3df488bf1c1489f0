//! The HTTP helpers: schemas, writes, one-shot queries, items.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::TokenSource;
use crate::wire::{
    Collection, DeleteResult, Dropped, Field, NewField, Op, QueryResult, SchemaChange, View, WriteResult,
};
use crate::Error;

/// HTTP access to a server (`http://host:port`), or to the nodes of one cluster. Cheap
/// to clone (clones share the node in use); connections are pooled.
///
/// With several nodes, a request that cannot reach its node (`Error::Transport`: the
/// connection failed, or no answer in time) moves every clone to the next node; a
/// request that changes nothing (GET, HEAD, a query) is then sent again there, once per
/// node, and so is one a node answers `503` (lagging, or behind a `min_seq`). Writes are
/// never sent again: the node may have applied one before the connection broke, so the
/// error is returned and the caller decides (read the item back, say).
#[derive(Clone)]
pub struct Http {
    bases: Arc<[String]>,
    index: Arc<AtomicUsize>,
    client: Client<HttpConnector, Full<Bytes>>,
    tokens: Arc<TokenSource>,
    timeout: Duration,
}

/// Percent-encodes one path segment (collection names and item ids may hold `/`, `:`, `!`, ...).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A request that changes nothing, so that sending it again (to another node) is safe:
/// GET and HEAD, and the one-shot query (a POST that only reads).
pub fn is_idempotent(method: &Method, path: &str) -> bool {
    if method == Method::GET || method == Method::HEAD {
        return true;
    }
    let path = path.split('?').next().unwrap_or(path);
    method == Method::POST
        && path
            .strip_prefix("/v1/collections/")
            .and_then(|rest| rest.strip_suffix("/query"))
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    op: Option<u64>,
}

impl Http {
    pub(crate) fn new(bases: &[String], tokens: Arc<TokenSource>, timeout: Duration) -> Http {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let bases = bases.iter().map(|base| base.trim_end_matches('/').to_owned()).collect();
        Http { bases, index: Arc::new(AtomicUsize::new(0)), client, tokens, timeout }
    }

    /// The base URL requests go to now.
    pub fn current_url(&self) -> &str {
        &self.bases[self.index.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// The node at `index` failed: the next request goes to the one after it (unless
    /// another request moved on already).
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.bases.len();
        let _ = self.index.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// `PUT /v1/collections/{name}`: creates the collection (or finds it with this very schema).
    pub async fn create_collection(&self, name: &str, fields: &[Field]) -> Result<Collection, Error> {
        self.call(Method::PUT, &format!("/v1/collections/{}", segment(name)), Some(json!({ "fields": fields }))).await
    }

    /// `GET /v1/collections/{name}`.
    pub async fn collection(&self, name: &str) -> Result<Collection, Error> {
        self.call(Method::GET, &format!("/v1/collections/{}", segment(name)), None).await
    }

    /// `POST /v1/collections/{name}/fields` (admin): appends a field; every existing item
    /// gets its `default`. Live subscriptions that did not name their fields get a Reset with it.
    pub async fn add_field(&self, collection: &str, field: &NewField) -> Result<SchemaChange, Error> {
        let body = serde_json::to_value(field).map_err(|error| Error::Decode(error.to_string()))?;
        self.call(Method::POST, &format!("/v1/collections/{}/fields", segment(collection)), Some(body)).await
    }

    /// `DELETE /v1/collections/{name}/fields/{field}` (admin): subscriptions whose filter or
    /// sort reads the field end (`ended`, reason `field_removed`).
    pub async fn remove_field(&self, collection: &str, field: &str) -> Result<SchemaChange, Error> {
        let path = format!("/v1/collections/{}/fields/{}", segment(collection), segment(field));
        self.call(Method::DELETE, &path, None).await
    }

    /// `DELETE /v1/collections/{name}` (admin): its subscriptions end (`ended`, reason
    /// `collection_dropped`).
    pub async fn drop_collection(&self, collection: &str) -> Result<Dropped, Error> {
        self.call(Method::DELETE, &format!("/v1/collections/{}", segment(collection)), None).await
    }

    /// `POST /v1/collections/{name}/batch`: applied whole or not at all; `Ok` once durable.
    pub async fn write(&self, collection: &str, ops: &[Op]) -> Result<WriteResult, Error> {
        self.write_once(collection, ops, None).await
    }

    /// [`OrdoHttp::write`] with an `Idempotency-Key` (1 to 128 of `[A-Za-z0-9_.:-]`, a
    /// UUID say), when given: called again with the same key and ops after an answer was
    /// lost, it returns the first answer without writing again (on the same node, within
    /// 24 h: docs/PROTOCOL.md, "Idempotency keys"). The client never sends a write again itself.
    pub async fn write_once(
        &self,
        collection: &str,
        ops: &[Op],
        idempotency_key: Option<&str>,
    ) -> Result<WriteResult, Error> {
        let body = json!({ "ops": ops });
        let path = format!("/v1/collections/{}/batch", segment(collection));
        self.call_with_key(Method::POST, &path, Some(body), idempotency_key).await
    }

    /// `POST /v1/collections/{name}/query`: one window of a view, with the view's `total`.
    pub async fn query<T: DeserializeOwned>(&self, collection: &str, view: &View) -> Result<QueryResult<T>, Error> {
        let body = serde_json::to_value(view).map_err(|error| Error::Decode(error.to_string()))?;
        self.call(Method::POST, &format!("/v1/collections/{}/query", segment(collection)), Some(body)).await
    }

    /// `GET /v1/collections/{name}/items/{id}`: `None` when there is no such item
    /// (a missing collection is an error).
    pub async fn get_item<T: DeserializeOwned>(&self, collection: &str, id: &str) -> Result<Option<T>, Error> {
        let path = format!("/v1/collections/{}/items/{}", segment(collection), segment(id));
        match self.call(Method::GET, &path, None).await {
            Ok(item) => Ok(Some(item)),
            Err(Error::Api { code, .. }) if code == "not_found" => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `DELETE /v1/collections/{name}/items/{id}`.
    pub async fn delete_item(&self, collection: &str, id: &str) -> Result<DeleteResult, Error> {
        self.delete_item_once(collection, id, None).await
    }

    /// [`OrdoHttp::delete_item`] with an `Idempotency-Key`, as [`OrdoHttp::write_once`].
    pub async fn delete_item_once(
        &self,
        collection: &str,
        id: &str,
        idempotency_key: Option<&str>,
    ) -> Result<DeleteResult, Error> {
        let path = format!("/v1/collections/{}/items/{}", segment(collection), segment(id));
        self.call_with_key(Method::DELETE, &path, None, idempotency_key).await
    }

    /// Any request: `body` as JSON, the answer decoded as `T`. A `401` with a token provider
    /// is retried once with a fresh token.
    pub async fn call<T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<Value>) -> Result<T, Error> {
        self.call_with_key(method, path, body, None).await
    }

    async fn call_with_key<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        idempotency_key: Option<&str>,
    ) -> Result<T, Error> {
        let body = body.map(|body| Bytes::from(body.to_string())).unwrap_or_default();
        let mut token = self.tokens.current().await?;
        let mut retried = false;
        let again = is_idempotent(&method, path);
        let mut tries = 0;
        loop {
            tries += 1;
            let index = self.index.load(Ordering::Relaxed) % self.bases.len();
            let (status, bytes) =
                match self.send(index, method.clone(), path, (token.as_deref(), idempotency_key), body.clone()).await {
                    Ok(answer) => answer,
                    Err(error @ Error::Transport(_)) => {
                        self.move_on(index);
                        if again && tries < self.bases.len() {
                            continue;
                        }
                        return Err(error);
                    }
                    Err(error) => return Err(error),
                };
            if status == StatusCode::UNAUTHORIZED && self.tokens.can_refresh() && !retried {
                retried = true;
                token = self.tokens.refresh().await?;
                tries -= 1;
                continue;
            }
            if status == StatusCode::SERVICE_UNAVAILABLE && again && tries < self.bases.len() {
                self.move_on(index);
                continue;
            }
            if !status.is_success() {
                return Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                    Ok(ErrorBody { error }) => {
                        Error::Api { status: status.as_u16(), code: error.code, message: error.message, op: error.op }
                    }
                    Err(_) => Error::Api {
                        status: status.as_u16(),
                        code: "unknown".to_owned(),
                        message: String::from_utf8_lossy(&bytes).into_owned(),
                        op: None,
                    },
                });
            }
            return serde_json::from_slice(&bytes).map_err(|error| Error::Decode(format!("{method} {path}: {error}")));
        }
    }

    async fn send(
        &self,
        index: usize,
        method: Method,
        path: &str,
        (token, idempotency_key): (Option<&str>, Option<&str>),
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), Error> {
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.bases[index]));
        if !body.is_empty() {
            request = request.header("content-type", "application/json");
        }
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Full::new(body)).map_err(|error| Error::Transport(error.to_string()))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|error| Error::Transport(error.to_string()))?;
            let status = response.status();
            let body = response.into_body().collect().await.map_err(|error| Error::Transport(error.to_string()))?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Error::Transport(format!("no answer within {:?}", self.timeout)))?
    }
}
