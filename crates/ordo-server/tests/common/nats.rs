//! Real `nats-server` processes on loopback for the cluster tests: a JetStream
//! cluster of `n` nodes, each with its own temp dir and ports, that a test can
//! kill (SIGKILL), stop and continue (SIGSTOP / SIGCONT) and restart.
//!
//! The binary is `$ORDO_NATS_SERVER`, else `<repo>/.tools/bin/nats-server`
//! (`make nats-server` installs it); without either the test fails saying so.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `nats-server` binary the tests run.
pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ORDO_NATS_SERVER") {
        let path = PathBuf::from(path);
        assert!(path.exists(), "ORDO_NATS_SERVER={} does not exist", path.display());
        return path;
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = repo.join(".tools/bin/nats-server");
    assert!(
        path.exists(),
        "no nats-server: run `make nats-server` (installs {}) or set ORDO_NATS_SERVER",
        path.display()
    );
    path
}

/// A port nobody listens on right now (the OS's choice; the listener is closed
/// at once, and nats-server binds it with SO_REUSEADDR).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node {
    child: Option<Child>,
    config: PathBuf,
    client_port: u16,
    monitor_port: u16,
    stopped: bool,
}

pub struct NatsCluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// `n` nodes (1: a lone JetStream server), each ready to serve JetStream.
    pub fn start(n: usize) -> NatsCluster {
        let binary = nats_server_binary();
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16, u16)> = (0..n).map(|_| (free_port(), free_port(), free_port())).collect();
        let mut nodes = Vec::new();
        for (i, &(client_port, cluster_port, monitor_port)) in ports.iter().enumerate() {
            let store = dir.path().join(format!("n{i}"));
            std::fs::create_dir_all(&store).unwrap();
            let mut config = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{client_port}\nhttp: 127.0.0.1:{monitor_port}\n\
                 jetstream {{ store_dir: \"{}\" }}\n",
                store.display()
            );
            if n > 1 {
                let routes: Vec<String> =
                    ports.iter().map(|&(_, cluster_port, _)| format!("nats://127.0.0.1:{cluster_port}")).collect();
                config += &format!(
                    "cluster {{ name: ordo-test, listen: 127.0.0.1:{cluster_port}, routes: [{}] }}\n",
                    routes.join(", ")
                );
            }
            let config_path = dir.path().join(format!("n{i}.conf"));
            std::fs::write(&config_path, config).unwrap();
            nodes.push(Node { child: None, config: config_path, client_port, monitor_port, stopped: false });
        }
        let _ = binary;
        let mut cluster = NatsCluster { dir, nodes };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_healthy(i, Duration::from_secs(30));
        }
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let quiet = std::env::var_os("ORDO_NATS_LOG").is_none();
        let child = Command::new(nats_server_binary())
            .arg("-c")
            .arg(&node.config)
            .stdout(Stdio::null())
            .stderr(if quiet { Stdio::null() } else { Stdio::inherit() })
            .spawn()
            .expect("starting nats-server");
        node.child = Some(child);
        node.stopped = false;
    }

    /// Waits until node `i` says it is healthy with JetStream (in a cluster,
    /// that needs a meta leader).
    pub fn wait_healthy(&self, i: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((200, _)) = self.monitor(i, "/healthz?js-enabled-only=true") {
                if let Some((200, _)) = self.monitor(i, "/healthz") {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "nats node {i} not healthy within {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node's client URL, comma-separated (for `ordo serve --cluster`).
    pub fn urls(&self) -> String {
        (0..self.nodes.len()).map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some() && !self.nodes[i].stopped
    }

    fn signal(&self, i: usize, signal: i32) {
        let child = self.nodes[i].child.as_ref().expect("node is running");
        // SAFETY: `kill` with the pid of a child we own (not yet waited for) and a valid signal.
        unsafe { libc::kill(child.id() as i32, signal) };
    }

    /// `kill -9` of node `i` (its files stay for `restart`).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.nodes[i].stopped = false;
    }

    /// SIGSTOP: the process is frozen, its sockets stay open.
    pub fn stop(&mut self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.nodes[i].stopped = true;
    }

    /// SIGCONT after `stop`.
    pub fn cont(&mut self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.nodes[i].stopped = false;
    }

    /// Starts node `i` again with its config and store dir (killing it first if
    /// it runs), and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        if self.nodes[i].stopped {
            self.cont(i);
        }
        self.kill(i);
        self.spawn(i);
        self.wait_healthy(i, Duration::from_secs(30));
    }

    /// `GET path` on node `i`'s monitoring port: status and JSON body, or None
    /// when the node does not answer.
    pub fn monitor(&self, i: usize, path: &str) -> Option<(u16, Value)> {
        if self.nodes[i].child.is_none() || self.nodes[i].stopped {
            return None;
        }
        let mut stream = TcpStream::connect(("127.0.0.1", self.nodes[i].monitor_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_owned()
        };
        Some((status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
    }

    /// The server name (`n<i>`) of the JetStream meta leader and of `stream`'s
    /// leader, as a running node reports them (None while there is none).
    pub fn leaders(&self, stream: &str) -> (Option<usize>, Option<usize>) {
        for i in 0..self.nodes.len() {
            let Some((200, jsz)) = self.monitor(i, "/jsz?accounts=true&streams=true") else { continue };
            // A node's index is the number its server name ends with.
            let index = |name: &Value| {
                let name = name.as_str()?;
                name[name.trim_end_matches(|c: char| c.is_ascii_digit()).len()..].parse().ok()
            };
            let meta = index(&jsz["meta_cluster"]["leader"]);
            let mut stream_leader = None;
            for account in jsz["account_details"].as_array().into_iter().flatten() {
                for detail in account["stream_detail"].as_array().into_iter().flatten() {
                    if detail["name"] == stream {
                        stream_leader = index(&detail["cluster"]["leader"]);
                    }
                }
            }
            if meta.is_some() {
                return (meta, stream_leader);
            }
        }
        (None, None)
    }

    /// Waits until `stream` has a leader and every replica is current (after a
    /// restart, so that the next fault does not take away a quorum).
    pub fn wait_stream_settled(&self, stream: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for i in 0..self.nodes.len() {
                let Some((200, jsz)) = self.monitor(i, "/jsz?accounts=true&streams=true") else { continue };
                for account in jsz["account_details"].as_array().into_iter().flatten() {
                    for detail in account["stream_detail"].as_array().into_iter().flatten() {
                        if detail["name"] != stream || detail["cluster"]["leader"].as_str().is_none() {
                            continue;
                        }
                        let replicas = detail["cluster"]["replicas"].as_array().cloned().unwrap_or_default();
                        let settled = replicas.len() + 1 == self.nodes.len()
                            && replicas.iter().all(|replica| replica["current"] == true && replica["offline"] != true);
                        if settled {
                            return true;
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].stopped {
                self.cont(i);
            }
            self.kill(i);
        }
    }
}
