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
