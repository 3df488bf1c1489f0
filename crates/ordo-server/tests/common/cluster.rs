//! A whole cluster on loopback for the cluster model and fault tests: a NATS
//! JetStream cluster and `ordo serve --cluster` nodes on it, each with its own
//! data dir, that a test can kill, freeze and restart; and an HTTP client with
//! timeouts (a frozen node must not hang the test).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::nats::NatsCluster;
use super::{Server, StartOptions};

pub struct OrdoCluster {
    pub nats: NatsCluster,
    /// None while the node is down.
    nodes: Vec<Option<Server>>,
    dirs: Vec<tempfile::TempDir>,
    replicas: usize,
    /// More `ordo serve` arguments for every node.
    extra_args: Vec<String>,
    /// More `ordo serve` arguments for one node each (`start_each`).
    node_args: Vec<Vec<String>>,
}

impl OrdoCluster {
    /// `n_nats` NATS nodes (the stream gets `min(3, n_nats)` replicas) and
    /// `n_ordo` Ordo nodes named `o0`, `o1`, ...
    pub fn start(n_nats: usize, n_ordo: usize) -> OrdoCluster {
        OrdoCluster::start_with(n_nats, n_ordo, &[])
    }

    /// `start`, with `extra_args` for every `ordo serve`.
    pub fn start_with(n_nats: usize, n_ordo: usize, extra_args: &[&str]) -> OrdoCluster {
        OrdoCluster::start_each_with(n_nats, extra_args, &vec![&[][..]; n_ordo])
    }

    /// `start`, node `i` with `node_args[i]` (so nodes may differ in how they publish, say).
    pub fn start_each(n_nats: usize, node_args: &[&[&str]]) -> OrdoCluster {
        OrdoCluster::start_each_with(n_nats, &[], node_args)
    }

    /// `start`, with `extra_args` for every node and `node_args[i]` for node `i` besides.
    pub fn start_each_with(n_nats: usize, extra_args: &[&str], node_args: &[&[&str]]) -> OrdoCluster {
        let nats = NatsCluster::start(n_nats);
        let n_ordo = node_args.len();
        let dirs = (0..n_ordo).map(|_| tempfile::tempdir().unwrap()).collect();
        let owned = |args: &[&str]| args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>();
        let node_args = node_args.iter().map(|args| owned(args)).collect();
        let (replicas, extra_args) = (n_nats.min(3), owned(extra_args));
        let mut cluster = OrdoCluster { nats, nodes: Vec::new(), dirs, replicas, extra_args, node_args };
        for i in 0..n_ordo {
            let server = cluster.spawn(i);
            cluster.nodes.push(Some(server));
        }
        cluster
    }

    fn spawn(&self, i: usize) -> Server {
        let urls = self.nats.urls();
        let name = format!("o{i}");
        let replicas = self.replicas.to_string();
        let mut args = vec!["--cluster", &urls, "--node-name", &name, "--stream-replicas", &replicas];
        args.extend(self.extra_args.iter().map(String::as_str));
        args.extend(self.node_args[i].iter().map(String::as_str));
        // Their logs go to the test's captured output (shown when it fails).
        Server::start_with(self.dirs[i].path(), &args, StartOptions { capture_stderr: true, ..Default::default() })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i` (panics while it is down).
    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().unwrap_or_else(|| panic!("ordo node o{i} is down"))
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    /// The HTTP port of every node, None for a node that is down.
    pub fn ports(&self) -> Vec<Option<u16>> {
        self.nodes.iter().map(|node| node.as_ref().map(|server| server.port)).collect()
    }

    /// `kill -9` of node `i`; its data dir stays for `restart`.
    pub fn kill(&mut self, i: usize) {
        let mut server = self.nodes[i].take().expect("node is up");
        // SAFETY: `kill` with the pid of a child we own and a valid signal number.
        unsafe { libc::kill(server.pid() as i32, libc::SIGKILL) };
        server.wait();
    }

    /// Starts node `i` again on its data dir (on a new port).
    pub fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node o{i} is up");
        let server = self.spawn(i);
        self.nodes[i] = Some(server);
    }

    /// The `ordo serve` arguments besides the cluster's for every node started
    /// from now on (`restart`).
    pub fn set_extra_args(&mut self, extra_args: &[&str]) {
        self.extra_args = extra_args.iter().map(|arg| arg.to_string()).collect();
    }

    pub fn signal(&self, i: usize, signal: i32) {
        // SAFETY: `kill` with the pid of a child we own and a valid signal number.
        unsafe { libc::kill(self.node(i).pid() as i32, signal) };
    }

    /// Node `i`'s `cluster` section of `/v1/health` (None when it does not answer in time).
    pub fn health(&self, i: usize) -> Option<Value> {
        let port = self.nodes[i].as_ref()?.port;
        match request(port, "GET", "/v1/health", None, Duration::from_secs(2)) {
            Ok((200, health)) => Some(health["cluster"].clone()),
            _ => None,
        }
    }

    /// Waits until every node that is up has applied the whole stream as one
    /// of them sees it, and all say the same `applied_seq`: the state to check.
    pub fn wait_converged(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            last = (0..self.len()).filter(|&i| self.is_up(i)).map(|i| self.health(i)).collect::<Vec<_>>();
            let applied: Vec<Option<u64>> =
                last.iter().map(|health| health.as_ref().and_then(|h| h["applied_seq"].as_u64())).collect();
            let stream_last = last
                .iter()
                .filter_map(|health| health.as_ref().and_then(|h| h["stream_last_seq"].as_u64()))
                .max()
                .unwrap_or(0);
            if let Some(Some(first)) = applied.first() {
                if applied.iter().all(|seq| *seq == Some(*first)) && *first >= stream_last {
                    return *first;
                }
            }
            assert!(Instant::now() < deadline, "the nodes did not converge within {timeout:?}: {last:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OrdoCluster {
    fn drop(&mut self) {
        // The Ordo nodes die before the NATS servers, whose slot (`ports.rs`)
        // lets the next test start its cluster: by then this one is all gone.
        self.nodes.clear();
    }
}

/// One HTTP/1.1 request to `127.0.0.1:port` with `timeout` on connect, each
/// read and write: the status and the JSON body, or the I/O error (a node that
/// is down, frozen or dies meanwhile).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> std::io::Result<(u16, Value)> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let broken = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "a cut response");
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(broken)?;
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or_else(broken)?;
    let mut bytes = response[head_end + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        bytes = super::dechunk(&bytes);
    }
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)));
    Ok((status, value))
}

/// The node's `/metrics` text (None when it does not answer in time).
pub fn metrics_text(port: u16) -> Option<String> {
    match request(port, "GET", "/metrics", None, Duration::from_secs(2)) {
        Ok((200, Value::String(text))) => Some(text),
        _ => None,
    }
}

/// Every item of `collection` on the node at `port`, once it has applied
/// `min_seq`, in id order (paged by cursor), with versions.
pub fn all_items(port: u16, collection: &str, min_seq: u64) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut body = json!({"limit": 1000, "min_seq": min_seq});
        if let Some(after) = &after {
            body["after"] = json!(after);
        }
        let path = format!("/v1/collections/{collection}/query");
        // A node still catching up (after a fault) answers `seq_not_reached`
        // after 5 s: ask again, for a minute at most.
        let deadline = Instant::now() + Duration::from_secs(60);
        let (status, answer) = loop {
            let (status, answer) = request(port, "POST", &path, Some(&body), Duration::from_secs(10)).expect("query");
            if status != 503 || answer["error"]["code"] != "seq_not_reached" || Instant::now() > deadline {
                break (status, answer);
            }
        };
        assert_eq!(status, 200, "query on port {port}: {answer}");
        let page = answer["items"].as_array().unwrap();
        items.extend(page.iter().cloned());
        if page.len() < 1000 {
            return items;
        }
        after = Some(page.last().unwrap()["id"].as_str().unwrap().to_owned());
    }
}

/// Prints the seed of a failing run (when dropped while panicking), so it can be replayed.
pub struct SeedGuard {
    pub what: &'static str,
    pub seed: u64,
    pub replay: &'static str,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{} failed with seed {} (replay: {}={})", self.what, self.seed, self.replay, self.seed);
        }
    }
}

/// A number from the environment, or `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |value| value.parse().unwrap_or_else(|_| panic!("{name}={value}")))
}

/// The seq of the one entry of stream message `stream_seq` (a JSON entry
/// published alone, on a stream a node created: `SeqScheme::PACKED`).
pub fn seq_of_message(stream_seq: u64) -> u64 {
    ordo_server::cluster::pack::SeqScheme::PACKED.entry_seq(stream_seq, 1, 0)
}

/// The seq of the one entry of the stream message after the one holding `seq`
/// (the next write published alone).
pub fn next_message_seq(seq: u64) -> u64 {
    let scheme = ordo_server::cluster::pack::SeqScheme::PACKED;
    seq_of_message(scheme.applied_stream_seq(seq) + 1)
}

/// The stream message holding `seq` (applied whole once `seq` is the last of its entries).
pub fn message_of(seq: u64) -> u64 {
    ordo_server::cluster::pack::SeqScheme::PACKED.applied_stream_seq(seq)
}
