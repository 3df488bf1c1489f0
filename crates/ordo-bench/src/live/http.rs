//! A keep-alive HTTP/1.1 client and a pool of its connections.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Result;

pub struct HttpReply {
    pub status: u16,
    pub body: Bytes,
}

impl HttpReply {
    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// One keep-alive connection; one request at a time.
pub struct HttpConnection {
    pub authority: String,
    pub sender: SendRequest<Full<Bytes>>,
}

impl HttpConnection {
    pub async fn connect(authority: &str) -> Result<HttpConnection> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Its end shows in the next request's error.
            let _ = connection.await;
        });
        Ok(HttpConnection { authority: authority.to_string(), sender })
    }

    /// `token`: sent as `Authorization: Bearer`.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> Result<HttpReply> {
        let mut request = Request::builder().method(method).uri(path).header(HOST, &self.authority);
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Full::new(Bytes::from(body)))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(HttpReply { status, body })
    }
}

/// A fixed set of connections; a request takes an idle one and gives it back.
pub struct HttpPool {
    pub idle_tx: mpsc::UnboundedSender<HttpConnection>,
    pub idle_rx: mpsc::UnboundedReceiver<HttpConnection>,
    pub size: usize,
    /// With `--auth`: the admin token of `request` and `run_requests` (set-up,
    /// `/metrics`, checks). The live writes bring their own.
    pub token: Option<Arc<str>>,
}

impl HttpPool {
    pub async fn connect(authority: &str, size: usize, token: Option<Arc<str>>) -> Result<HttpPool> {
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        for _ in 0..size {
            idle_tx.send(HttpConnection::connect(authority).await?).map_err(|_| "pool channel closed")?;
        }
        Ok(HttpPool { idle_tx, idle_rx, size, token })
    }

    /// `per_authority` connections to each of `authorities`, interleaved: an
    /// idle connection goes back to the end of the queue, so requests taken
    /// with [`HttpPool::try_acquire`] go round the servers in turn (a cluster's
    /// writes spread evenly over its nodes).
    pub async fn connect_spread(
        authorities: &[String],
        per_authority: usize,
        token: Option<Arc<str>>,
    ) -> Result<HttpPool> {
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        for _ in 0..per_authority {
            for authority in authorities {
                idle_tx.send(HttpConnection::connect(authority).await?).map_err(|_| "pool channel closed")?;
            }
        }
        Ok(HttpPool { idle_tx, idle_rx, size: per_authority * authorities.len(), token })
    }

    pub async fn acquire(&mut self) -> HttpConnection {
        // The pool holds a sender itself, so the channel never closes.
        self.idle_rx.recv().await.expect("the pool keeps its channel open")
    }

    pub fn try_acquire(&mut self) -> Option<HttpConnection> {
        self.idle_rx.try_recv().ok()
    }

    pub fn releaser(&self) -> mpsc::UnboundedSender<HttpConnection> {
        self.idle_tx.clone()
    }

    pub async fn request(&mut self, method: Method, path: &str, body: Vec<u8>) -> Result<HttpReply> {
        let mut connection = self.acquire().await;
        let reply = connection.request(method, path, body, self.token.as_deref()).await;
        let _ = self.idle_tx.send(connection);
        reply
    }

    /// Sends `n_requests` requests made by `make_request`, as many at once as
    /// the pool has connections; fails on the first status other than 200/201.
    /// Returns the reply bodies in request order. `progress` names the phase
    /// for a line at every tenth of the requests.
    pub async fn run_requests(
        &mut self,
        n_requests: usize,
        mut make_request: impl FnMut(usize) -> (Method, String, Vec<u8>),
        progress: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        let started = Instant::now();
        let mut replies = vec![Bytes::new(); n_requests];
        let mut in_flight = JoinSet::new();
        let mut n_done = 0;
        let mut on_done = |joined: std::result::Result<(usize, Result<Bytes>), tokio::task::JoinError>,
                           replies: &mut Vec<Bytes>|
         -> Result<()> {
            let (index, reply) = joined?;
            replies[index] = reply?;
            n_done += 1;
            if let Some(phase) = progress {
                if n_done * 10 / n_requests != (n_done - 1) * 10 / n_requests {
                    println!(
                        "  {phase}: {:>3}% ({n_done}/{n_requests} requests) {:.1} s",
                        n_done * 100 / n_requests,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Ok(())
        };
        for index in 0..n_requests {
            while in_flight.len() >= self.size {
                let joined = in_flight.join_next().await.expect("the set is not empty");
                on_done(joined, &mut replies)?;
            }
            let (method, path, body) = make_request(index);
            let mut connection = self.acquire().await;
            let release = self.releaser();
            let token = self.token.clone();
            in_flight.spawn(async move {
                let reply = connection.request(method, &path, body, token.as_deref()).await;
                let _ = release.send(connection);
                let reply = reply.and_then(|reply| {
                    if reply.status == 200 || reply.status == 201 {
                        Ok(reply.body)
                    } else {
                        Err(format!("{path}: HTTP {}: {}", reply.status, reply.text()).into())
                    }
                });
                (index, reply)
            });
        }
        while let Some(joined) = in_flight.join_next().await {
            on_done(joined, &mut replies)?;
        }
        Ok(replies)
    }
}

/// `GET /metrics`, the Prometheus text format: `name{labels} value` lines.
pub async fn fetch_metrics(pool: &mut HttpPool) -> Option<Vec<(String, f64)>> {
    let reply = pool.request(Method::GET, "/metrics", Vec::new()).await.ok()?;
    if reply.status != 200 {
        return None;
    }
    let text = reply.text();
    let metrics = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect();
    Some(metrics)
}

pub fn metric(metrics: &Option<Vec<(String, f64)>>, name: &str) -> Option<f64> {
    metrics.as_ref()?.iter().find(|(metric_name, _)| metric_name == name).map(|(_, value)| *value)
}
