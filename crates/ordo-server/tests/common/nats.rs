//! Real `nats-server` processes on loopback for the cluster tests: each with
//! JetStream on, its own temporary store directory and free ports, clustered
//! through routes when there are several. The binary comes from
//! `$ORDO_NATS_SERVER`, else `<repo>/.tools/bin/nats-server` (`make nats-server`
//! installs it); without either the tests fail, never skip.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a node (or the whole cluster) has to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The `nats-server` binary the tests run.
pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ORDO_NATS_SERVER") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "ORDO_NATS_SERVER={} is not a file", path.display());
        return path;
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = repo.join(".tools/bin/nats-server");
    assert!(
        path.is_file(),
        "no nats-server at {}: run `make nats-server` (or set ORDO_NATS_SERVER to a nats-server binary)",
        path.display()
    );
    path
}

/// A free loopback port (bound, then released: the server binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node {
    name: String,
    client_port: u16,
    cluster_port: u16,
    monitor_port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

/// `n` nats-server processes; dropping it kills them all.
pub struct NatsCluster {
    nodes: Vec<Node>,
    binary: PathBuf,
}

impl NatsCluster {
    /// Starts `n` nodes and waits until JetStream is ready on each (for `n > 1`,
    /// until the meta group has a leader, so a stream can be created).
    pub fn start(n: usize) -> NatsCluster {
        assert!(n >= 1);
        let binary = nats_server_binary();
        let nodes = (0..n)
            .map(|index| Node {
                name: format!("nats-{index}"),
                client_port: free_port(),
                cluster_port: free_port(),
                monitor_port: free_port(),
                store: tempfile::tempdir().unwrap(),
                child: None,
            })
            .collect();
        let mut cluster = NatsCluster { nodes, binary };
        for index in 0..n {
            cluster.spawn(index);
        }
        for index in 0..n {
            cluster.wait_ready(index);
        }
        cluster
    }

    fn spawn(&mut self, index: usize) {
        let routes: Vec<String> =
            self.nodes.iter().map(|node| format!("nats://127.0.0.1:{}", node.cluster_port)).collect();
        let node = &mut self.nodes[index];
        let mut command = Command::new(&self.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &node.client_port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["-n", &node.name, "-js", "-sd"])
            .arg(node.store.path())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("ORDO_NATS_LOG").is_some() { Stdio::inherit() } else { Stdio::null() });
        if routes.len() > 1 {
            command
                .args(["--cluster_name", "ordo-test"])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", node.cluster_port)])
                .args(["--routes", &routes.join(",")]);
        }
        node.child = Some(command.spawn().expect("starting nats-server"));
    }

    /// Waits until `/healthz` says the node is healthy (JetStream included) and,
    /// in a cluster, until `/jsz` names a meta leader.
    fn wait_ready(&self, index: usize) {
        let node = &self.nodes[index];
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let healthy = monitor_get(node.monitor_port, "/healthz").is_some_and(|(status, _)| status == 200);
            let has_leader = self.nodes.len() == 1
                || monitor_get(node.monitor_port, "/jsz").is_some_and(|(_, body)| {
                    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                    body["meta_cluster"]["leader"].as_str().is_some_and(|leader| !leader.is_empty())
                });
            if healthy && has_leader {
                return;
            }
            assert!(Instant::now() < deadline, "nats-server {} not ready within {READY_TIMEOUT:?}", node.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every live node is ready (after a restart or a `cont`).
    pub fn wait_all_ready(&self) {
        for (index, node) in self.nodes.iter().enumerate() {
            if node.child.is_some() {
                self.wait_ready(index);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The client URL of node `index`.
    pub fn url(&self, index: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[index].client_port)
    }

    /// Every node's client URL, comma-separated (what `--cluster` takes).
    pub fn urls(&self) -> String {
        (0..self.nodes.len()).map(|index| self.url(index)).collect::<Vec<_>>().join(",")
    }

    fn signal(&self, index: usize, signal: i32) {
        let child = self.nodes[index].child.as_ref().expect("the node runs");
        // SAFETY: `kill` with a pid this harness spawned and a valid signal number.
        unsafe { libc::kill(child.id() as i32, signal) };
    }

    /// SIGKILL: the node dies without a word (its store stays for `restart`).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the node freezes (a long pause, a stuck disk).
    pub fn stop(&self, index: usize) {
        self.signal(index, libc::SIGSTOP);
    }

    /// SIGCONT: the frozen node goes on.
    pub fn cont(&self, index: usize) {
        self.signal(index, libc::SIGCONT);
    }

    /// Kills the node if it runs, then starts it again on the same ports and
    /// store directory, and waits until it is ready.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
        self.wait_ready(index);
    }
}

/// The JetStream API as the monitoring port shows it: which node leads what.
impl NatsCluster {
    /// `GET path` on node `index`'s monitoring port, the body as JSON; None when
    /// the node is down or does not answer.
    pub fn monitor(&self, index: usize, path: &str) -> Option<(u16, serde_json::Value)> {
        self.nodes[index].child.as_ref()?;
        let (status, body) = monitor_get(self.nodes[index].monitor_port, path)?;
        Some((status, serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body))))
    }

    /// The indexes of the JetStream meta leader and of `stream`'s leader, as the
    /// first node that answers reports them (None while there is none).
    pub fn leaders(&self, stream: &str) -> (Option<usize>, Option<usize>) {
        // A node's index is the number its server name ends with.
        let index = |name: &serde_json::Value| -> Option<usize> {
            let name = name.as_str()?;
            name[name.trim_end_matches(|c: char| c.is_ascii_digit()).len()..].parse().ok()
        };
        for node in 0..self.nodes.len() {
            let Some((200, jsz)) = self.monitor(node, "/jsz?accounts=true&streams=true") else { continue };
            let meta = index(&jsz["meta_cluster"]["leader"]);
            let stream_leader = stream_details(&jsz)
                .find(|detail| detail["name"] == stream)
                .and_then(|detail| index(&detail["cluster"]["leader"]));
            if meta.is_some() {
                return (meta, stream_leader);
            }
        }
        (None, None)
    }

    /// Waits until `stream` has a leader and every other node is a current
    /// replica (after a restart, so that the next fault does not take away a
    /// quorum the restarted node has not rejoined yet).
    pub fn wait_stream_settled(&self, stream: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for node in 0..self.nodes.len() {
                let Some((200, jsz)) = self.monitor(node, "/jsz?accounts=true&streams=true") else { continue };
                let settled = stream_details(&jsz).any(|detail| {
                    let replicas = detail["cluster"]["replicas"].as_array().cloned().unwrap_or_default();
                    detail["name"] == stream
                        && detail["cluster"]["leader"].as_str().is_some()
                        && replicas.len() + 1 == self.nodes.len()
                        && replicas.iter().all(|replica| replica["current"] == true && replica["offline"] != true)
                });
                if settled {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

/// Every stream's detail in a `/jsz?accounts=true&streams=true` answer.
fn stream_details(jsz: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    jsz["account_details"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten())
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            if self.nodes[index].child.is_some() {
                // A stopped process dies of SIGKILL too; SIGCONT is not needed.
                self.kill(index);
            }
        }
    }
}

/// A blocking GET on a monitoring port: `(status, body)`, or `None` when the
/// node does not answer (yet).
fn monitor_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
    Some((status, body))
}
