//! Real `nats-server` processes on loopback for the cluster tests: each with
//! JetStream on, its own temporary store directory and ports reserved for the
//! cluster's life (`ports.rs`), clustered through routes when there are
//! several. The binary comes from `$ORDO_NATS_SERVER`, else
//! `<repo>/.tools/bin/nats-server` (`make nats-server` installs it); without
//! either the tests fail, never skip.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ports::{ClusterSlot, ReservedPort};

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

/// A cluster name no other test's cluster has: should ports ever get crossed,
/// routes between two tests' clusters are refused instead of merging them.
fn unique_cluster_name() -> String {
    static CLUSTERS: AtomicUsize = AtomicUsize::new(0);
    format!("ordo-test-{}-{}", std::process::id(), CLUSTERS.fetch_add(1, Ordering::Relaxed))
}

struct Node {
    name: String,
    client_port: ReservedPort,
    cluster_port: ReservedPort,
    monitor_port: ReservedPort,
    store: tempfile::TempDir,
    /// The server's log (every run of it, appended) and the ports file each
    /// run writes once all its listeners are bound.
    files: tempfile::TempDir,
    /// None while the node is down; behind a lock so that a wait can notice,
    /// through `&self`, that the process exited.
    child: Mutex<Option<Child>>,
}

impl Node {
    fn log_path(&self) -> PathBuf {
        self.files.path().join("nats-server.log")
    }

    fn is_running(&self) -> bool {
        self.child.lock().unwrap().is_some()
    }

    fn pid(&self) -> u32 {
        self.child.lock().unwrap().as_ref().expect("the node runs").id()
    }

    /// The exit status if the process has ended (a failed bind, a crash).
    fn exited(&self) -> Option<ExitStatus> {
        self.child.lock().unwrap().as_mut()?.try_wait().expect("waiting for nats-server")
    }

    /// The ports the running process says it bound, from its ports file
    /// (written when its listeners are up): `(client, cluster, monitor)` URLs.
    fn bound_ports(&self) -> Option<serde_json::Value> {
        let file = self.files.path().join(format!("nats-server_{}.ports", self.pid()));
        serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()
    }

    /// Panics unless the ports file names the reserved ports.
    fn check_bound_ports(&self, ports: &serde_json::Value) {
        let expected = [
            ("nats", format!("nats://127.0.0.1:{}", self.client_port.port())),
            ("monitoring", format!("http://127.0.0.1:{}", self.monitor_port.port())),
        ];
        for (kind, url) in expected {
            assert!(
                ports[kind].as_array().is_some_and(|urls| urls.iter().any(|bound| bound == url.as_str())),
                "nats-server {} bound {ports} instead of {kind} {url}",
                self.name
            );
        }
    }

    /// The last lines of the server's log, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// `n` nats-server processes; dropping it kills them all.
pub struct NatsCluster {
    nodes: Vec<Node>,
    binary: PathBuf,
    cluster_name: String,
    /// Released last, once the servers are dead, for the next test's cluster.
    _slot: ClusterSlot,
}

impl NatsCluster {
    /// Starts `n` nodes and waits until JetStream is ready on each (for `n > 1`,
    /// until the meta group has a leader, so a stream can be created). Waits
    /// first while other tests of this binary run too many servers.
    pub fn start(n: usize) -> NatsCluster {
        assert!(n >= 1);
        let slot = ClusterSlot::acquire(n);
        let binary = nats_server_binary();
        let nodes = (0..n)
            .map(|index| Node {
                name: format!("nats-{index}"),
                client_port: ReservedPort::new(),
                cluster_port: ReservedPort::new(),
                monitor_port: ReservedPort::new(),
                store: tempfile::tempdir().unwrap(),
                files: tempfile::tempdir().unwrap(),
                child: Mutex::new(None),
            })
            .collect();
        let mut cluster = NatsCluster { nodes, binary, cluster_name: unique_cluster_name(), _slot: slot };
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
            self.nodes.iter().map(|node| format!("nats://127.0.0.1:{}", node.cluster_port.port())).collect();
        let node = &mut self.nodes[index];
        let mut command = Command::new(&self.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &node.client_port.port().to_string()])
            .args(["-m", &node.monitor_port.port().to_string()])
            .args(["-n", &node.name, "-js", "-sd"])
            .arg(node.store.path())
            .arg("--ports_file_dir")
            .arg(node.files.path())
            .stdout(Stdio::null())
            .stderr(log_destination(&node.log_path()));
        if routes.len() > 1 {
            command
                .args(["--cluster_name", &self.cluster_name])
                .args(["--cluster", &routes[index]])
                .args(["--routes", &routes.join(",")]);
        }
        *node.child.get_mut().unwrap() = Some(command.spawn().expect("starting nats-server"));
    }

    /// Waits until the node's listeners are bound (its ports file), `/healthz`
    /// says it is healthy (JetStream included) and, in a cluster, `/jsz` names
    /// a meta leader. A process that exits meanwhile (a port it could not bind)
    /// fails at once, with its log.
    fn wait_ready(&self, index: usize) {
        let node = &self.nodes[index];
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = node.exited() {
                panic!(
                    "nats-server {} exited ({status}) before it was ready; its log:\n{}",
                    node.name,
                    node.log_tail()
                );
            }
            let bound = node.bound_ports();
            if let Some(ports) = &bound {
                node.check_bound_ports(ports);
            }
            if bound.is_some() && self.serves(index) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} not ready within {READY_TIMEOUT:?}; its log:\n{}",
                node.name,
                node.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether node `index` is healthy and, in a cluster, knows a meta leader.
    fn serves(&self, index: usize) -> bool {
        let port = self.nodes[index].monitor_port.port();
        let healthy = monitor_get(port, "/healthz").is_some_and(|(status, _)| status == 200);
        healthy
            && (self.nodes.len() == 1
                || monitor_get(port, "/jsz").is_some_and(|(_, body)| {
                    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                    body["meta_cluster"]["leader"].as_str().is_some_and(|leader| !leader.is_empty())
                }))
    }

    /// Waits until every live node is ready (after a restart or a `cont`).
    pub fn wait_all_ready(&self) {
        for (index, node) in self.nodes.iter().enumerate() {
            if node.is_running() {
                self.wait_ready(index);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The client URL of node `index`.
    pub fn url(&self, index: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[index].client_port.port())
    }

    /// Every node's client URL, comma-separated (what `--cluster` takes).
    pub fn urls(&self) -> String {
        (0..self.nodes.len()).map(|index| self.url(index)).collect::<Vec<_>>().join(",")
    }

    fn signal(&self, index: usize, signal: i32) {
        let pid = self.nodes[index].pid();
        // SAFETY: `kill` with a pid this harness spawned and a valid signal number.
        unsafe { libc::kill(pid as i32, signal) };
    }

    /// SIGKILL: the node dies without a word (its store and ports stay for `restart`).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.get_mut().unwrap().take() {
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

    /// Kills the node if it runs, then starts it again on the same ports (still
    /// reserved, so no other process took them meanwhile) and store directory,
    /// and waits until it is ready.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
        self.wait_ready(index);
    }
}

/// Where a server's stderr goes: the terminal with `ORDO_NATS_LOG` set, else
/// its log file (appended, so it keeps every run), shown when it fails.
fn log_destination(log: &Path) -> Stdio {
    if std::env::var_os("ORDO_NATS_LOG").is_some() {
        return Stdio::inherit();
    }
    let file = File::options().create(true).append(true).open(log).expect("opening the nats-server log");
    Stdio::from(file)
}

/// The JetStream API as the monitoring port shows it: which node leads what.
impl NatsCluster {
    /// `GET path` on node `index`'s monitoring port, the body as JSON; None when
    /// the node is down or does not answer.
    pub fn monitor(&self, index: usize, path: &str) -> Option<(u16, serde_json::Value)> {
        if !self.nodes[index].is_running() {
            return None;
        }
        let (status, body) = monitor_get(self.nodes[index].monitor_port.port(), path)?;
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
            if self.nodes[index].is_running() {
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
