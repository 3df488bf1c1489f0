//! The HTTP side's transport: one accept loop, HTTP/1.1 and h2c on the same
//! port. Every accepted socket holds a place under the connection cap and must
//! send a request head within the header timeout; `accept` failures back off.
//! Requests go through `tower-http`'s CORS layer to `api::handle`. Each TCP
//! connection has its own request budget (token bucket).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::api::handle;
use crate::error::{ApiError, ErrorCode};
use crate::http_state::{ConnectionSlot, HttpState};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::rate_limit::TokenBucket;
use crate::silent_sockets::SilentSockets;

/// Accepts connections until `shutdown` turns true, then waits (at most
/// `grace`) for the requests in flight and the WebSockets' closing.
///
/// Every accepted socket holds a `ConnectionSlot` under the cap
/// (`state.max_connections`, below the descriptor limit), so a flood of idle
/// sockets meets a `503` instead of exhausting descriptors; and every one must
/// send a request head within `state.header_timeout`, so idle and half-sent
/// ones are closed instead of held. Until it sends one, a socket is among the
/// `SilentSockets`, which hold only a share of the cap.
pub async fn serve(listener: TcpListener, state: Arc<HttpState>, mut shutdown: watch::Receiver<bool>, grace: Duration) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let cors = cors_layer(state.gate.allowed_origins());
    let refusal = Bytes::from(refusal_response(state.max_connections));
    let silent = Arc::new(SilentSockets::new(limits::unauthenticated_cap(state.max_connections)));
    let mut accept_errors = AcceptErrors::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                accept_errors.n_in_a_row = 0;
                accepted
            }
            Err(error) => {
                let wait = accept_errors.on_error(&error);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    _ = shutdown.wait_for(|stopping| *stopping) => break,
                }
            }
        };
        // Only this loop adds to the count, so the check and the add cannot race.
        if METRICS.tcp_connections.load(Ordering::Relaxed) as usize >= state.max_connections {
            tracing::debug!(%peer, code = "limit_exceeded", "connection refused: at the connection cap");
            refuse(stream, refusal.clone());
            continue;
        }
        let slot = ConnectionSlot::take();
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let watcher = graceful.watcher();
        let mut stopping = shutdown.clone();
        let cors = cors.clone();
        let silent = silent.clone();
        tokio::spawn(async move {
            // Connections come and go by the thousand: their lines are `debug`.
            tracing::debug!(%peer, "connection opened");
            let header_timeout = state.header_timeout;
            // Silent until its first request head is whole: the service drops this then.
            let (silent, mut eviction) = silent.enter();
            let silent = Arc::new(Mutex::new(Some(silent)));
            let started = tokio::select! {
                started = tokio::time::timeout(header_timeout, wait_for_request_start(&stream)) => match started {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("closed by the client before a request"),
                    Err(_) => Err("no request within the header timeout"),
                },
                _ = eviction.wait() => Err(EVICTED),
                _ = stopping.wait_for(|stopping| *stopping) => Err("server stopping"),
            };
            if let Err(reason) = started {
                tracing::debug!(%peer, reason, "connection closed");
                // Dropping the stream and the slot closes the connection and frees its place.
                return;
            }
            let bucket =
                Arc::new(Mutex::new(TokenBucket::new(state.http_requests_per_second, limits::HTTP_REQUEST_BURST)));
            let service = tower::ServiceBuilder::new().layer(cors).service_fn(move |request| {
                silent.lock().expect("silent socket lock").take();
                let state = state.clone();
                let bucket = bucket.clone();
                let slot = slot.clone();
                async move { Ok::<_, Infallible>(handle(request, state, bucket, slot).await) }
            });
            let service = hyper_util::service::TowerToHyperService::new(service);
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // The head of each HTTP/1.1 request (the first, and the next on a kept-alive
            // connection) must arrive within the timeout; hyper measures it with this timer.
            builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
            tokio::select! {
                served = watcher.watch(connection) => match served {
                    Ok(()) => tracing::debug!(%peer, reason = "done", "connection closed"),
                    Err(error) => tracing::debug!(%peer, reason = %error, "connection closed"),
                },
                // Dropping the connection closes it.
                _ = eviction.wait() => tracing::debug!(%peer, reason = EVICTED, "connection closed"),
            }
        });
    }
    drop(listener);
    // The requests in flight, then the WebSockets' close frames: each connection
    // task saw `shutdown` and closes with 1001, and the runtime's end would
    // otherwise drop those it has not run yet, closing their sockets bare.
    let websockets = state.websockets.clone();
    websockets.close();
    let _ = tokio::time::timeout(grace, async {
        graceful.shutdown().await;
        websockets.wait().await;
    })
    .await;
}

/// Why a socket that sent no whole request head yet was closed.
const EVICTED: &str = "no whole request yet, and newer sockets needed the room";

/// CORS for the allowed origins (`--allow-origin`): preflights answered, the
/// API's methods and the `Authorization`, `Content-Type` and `X-Request-Id`
/// headers allowed, `X-Request-Id` readable. With none listed, no
/// origin but the server's own can read an answer; `Gate::check_origin` refuses
/// the request itself (CORS only hides answers).
fn cors_layer(origins: &[String]) -> tower_http::cors::CorsLayer {
    use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = origins.iter().filter_map(|origin| HeaderValue::from_str(origin).ok()).collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            AUTHORIZATION,
            CONTENT_TYPE,
            HeaderName::from_static(crate::api::X_REQUEST_ID),
            HeaderName::from_static(crate::api::IDEMPOTENCY_KEY),
        ])
        // Without this a page on another origin could not read the echoed id.
        .expose_headers([
            HeaderName::from_static(crate::api::X_REQUEST_ID),
            HeaderName::from_static(crate::api::IDEMPOTENT_REPLAYED),
        ])
        .max_age(Duration::from_secs(600))
}

/// Waits until the client has sent enough to tell an HTTP/1.1 request from the
/// HTTP/2 preface; false when it closed first. hyper's version detection (the
/// `auto` builder) has no deadline of its own, so a socket that never sends a
/// byte, or stops inside the preface, would be held forever without this.
async fn wait_for_request_start(stream: &TcpStream) -> bool {
    const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut peeked = [0u8; H2_PREFACE.len()];
    loop {
        let n_peeked = match stream.peek(&mut peeked).await {
            Ok(n_peeked) => n_peeked,
            Err(_) => return false,
        };
        if n_peeked == 0 {
            return false;
        }
        if n_peeked == H2_PREFACE.len() || peeked[..n_peeked] != H2_PREFACE[..n_peeked] {
            return true;
        }
        // Part of the preface: `peek` would return the same bytes at once, so
        // wait a little for the rest (only an HTTP/2 client mid-preface gets here).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Connections past the cap answering their `503` now.
static N_REFUSING: AtomicUsize = AtomicUsize::new(0);

/// The whole answer to a connection past the cap: an HTTP/1.1 `503` with the
/// usual error body, written before hyper sees the socket.
fn refusal_response(max_connections: usize) -> Vec<u8> {
    let error = ApiError::limit(format!(
        "the server holds {max_connections} connections already (max_connections); retry later"
    ));
    let body = error.to_json_body();
    let mut response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    response
}

/// Answers a connection past the cap with `503` and closes it. It reads what
/// the client sent for a moment first: closing a socket with unread input sends
/// a reset, which can discard the answer. At most `MAX_REFUSING_CONNECTIONS` do
/// this at once (each holds a descriptor); others are closed unanswered.
fn refuse(stream: TcpStream, response: Bytes) {
    metrics::add(&METRICS.connections_refused, 1);
    metrics::count_error(ErrorCode::LimitExceeded);
    if N_REFUSING.fetch_add(1, Ordering::Relaxed) >= limits::MAX_REFUSING_CONNECTIONS {
        N_REFUSING.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    tokio::spawn(async move {
        let mut stream = stream;
        let linger = Duration::from_millis(limits::REFUSAL_LINGER_MS);
        let _ = tokio::time::timeout(linger, async {
            stream.write_all(&response).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
        drop(stream);
        N_REFUSING.fetch_sub(1, Ordering::Relaxed);
    });
}

/// `accept` failures in a row, and the log's rate limit.
#[derive(Default)]
struct AcceptErrors {
    n_in_a_row: u32,
    n_unlogged: u64,
    last_logged: Option<Instant>,
}

impl AcceptErrors {
    /// Logs the failure (at most one line per `ACCEPT_ERROR_LOG_INTERVAL_MS`,
    /// with the count since the last) and returns how long to wait before the
    /// next `accept`. Out of descriptors or memory, the wait doubles with each
    /// failure in a row: retrying at once would fail again, spin a core and,
    /// before this, wrote hundreds of log lines a second.
    fn on_error(&mut self, error: &std::io::Error) -> Duration {
        self.n_in_a_row = self.n_in_a_row.saturating_add(1);
        self.n_unlogged += 1;
        let now = Instant::now();
        let interval = Duration::from_millis(limits::ACCEPT_ERROR_LOG_INTERVAL_MS);
        if self.last_logged.is_none_or(|last| now.duration_since(last) >= interval) {
            tracing::error!(times = self.n_unlogged, %error, "accept failed ({} times since the last report)", self.n_unlogged);
            self.n_unlogged = 0;
            self.last_logged = Some(now);
        }
        let out_of_resources =
            matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
        if !out_of_resources {
            // A failure of one connection (aborted before it was accepted, say): the next may succeed.
            return Duration::ZERO;
        }
        let doublings = (self.n_in_a_row - 1).min(16);
        Duration::from_millis((limits::ACCEPT_BACKOFF_FIRST_MS << doublings).min(limits::ACCEPT_BACKOFF_MAX_MS))
    }
}
