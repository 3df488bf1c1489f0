//! HTTP/2 without TLS ("h2c", prior knowledge) on the same port as HTTP/1.1.

mod common;

use common::{room_schema, Server};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_over_h2c() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.expect("h2c handshake");
    tokio::spawn(connection);
    let body = r#"{"ops":[{"op":"upsert","id":"!a","fields":{"recency":5}}]}"#;
    let request = hyper::Request::post(format!("http://127.0.0.1:{}/v1/collections/rooms/batch", server.port))
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.expect("an HTTP/2 response");
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(answer["seq"], 1, "{answer}");
    server.stop();
}

/// A body past 16 MiB over HTTP/2 gets the answer HTTP/1.1 gets: `413
/// limit_exceeded`, whether it declares its length or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_over_h2c_is_answered_413() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let url = format!("http://127.0.0.1:{}/v1/collections/rooms/batch", server.port);
    for declared in [true, false] {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        let chunks = (0..17).map(|_| {
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(bytes::Bytes::from(vec![b' '; 1 << 20])))
        });
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let mut request = hyper::Request::post(&url);
        if declared {
            request = request.header("content-length", 17usize << 20);
        }
        let response = sender.send_request(request.body(body).unwrap()).await;
        let response = response.unwrap_or_else(|error| panic!("declared length {declared}: {error:?}"));
        assert_eq!(response.status(), 413, "declared length {declared}");
        let answer: serde_json::Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(answer["error"]["code"], "limit_exceeded", "{answer}");
    }
    server.stop();
}
