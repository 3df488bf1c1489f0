//! The processes a cluster bench starts (nats-server, `ordo serve`) and a
//! minimal blocking HTTP/1.1 client to talk to them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::live::Result;

/// A loopback port held for as long as this lives: a socket bound to it with
/// `SO_REUSEADDR` that never listens. Unlike a port found free and released,
/// no other process's bind of port 0 gets it meanwhile (Linux skips bound
/// ports), while a server told to listen there still can (Go listeners, so
/// nats-server's, set `SO_REUSEADDR`, and nothing listens on it yet).
pub struct ReservedPort {
    _socket: OwnedFd,
    pub port: u16,
}

impl ReservedPort {
    pub fn new() -> Result<ReservedPort> {
        let failed = |call: &str| format!("{call}: {}", std::io::Error::last_os_error());
        // SAFETY: plain socket calls on a descriptor this function owns; the
        // address structures live on this stack for the duration of each call.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(failed("socket").into());
            }
            let socket = OwnedFd::from_raw_fd(fd);
            let on: libc::c_int = 1;
            let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&on as *const libc::c_int).cast(), size) != 0
            {
                return Err(failed("SO_REUSEADDR").into());
            }
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(fd, (&address as *const libc::sockaddr_in).cast(), length) != 0 {
                return Err(failed("binding 127.0.0.1:0").into());
            }
            if libc::getsockname(fd, (&mut address as *mut libc::sockaddr_in).cast(), &mut length) != 0 {
                return Err(failed("getsockname").into());
            }
            Ok(ReservedPort { _socket: socket, port: u16::from_be(address.sin_port) })
        }
    }
}

/// `n` reserved ports.
pub fn reserve_ports(n: usize) -> Result<Vec<ReservedPort>> {
    (0..n).map(|_| ReservedPort::new()).collect()
}

/// The numbers of `ports`.
pub fn numbers(ports: &[ReservedPort]) -> Vec<u16> {
    ports.iter().map(|reserved| reserved.port).collect()
}

pub fn temp_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    std::env::temp_dir().join(format!("ordo-cluster-bench-{}-{what}-{nanos}", std::process::id()))
}

/// A process of ours, stopped (SIGINT, then SIGKILL) and its directory removed on drop.
pub struct Process {
    child: Child,
    dir: PathBuf,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill sends a signal to our own child's pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A JetStream cluster of 1 or 3 `nats-server`s on loopback.
pub struct Nats {
    /// Held so that they stop (and their directories go) when the cluster is dropped.
    servers: Vec<Process>,
    pub urls: Vec<String>,
    /// The servers' ports, held until they are dead (declared after `servers`, so dropped after them).
    _ports: Vec<ReservedPort>,
}

/// When a nats-server fsyncs its stream and Raft files (`jetstream { sync_interval }`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sync {
    /// No `sync_interval` line: every 2 minutes, relying on replication.
    Default,
    /// `sync_interval: always`, what `make cluster` and the tests run.
    Always,
}

impl Sync {
    pub fn name(self) -> &'static str {
        match self {
            Sync::Default => "default (2 min)",
            Sync::Always => "always",
        }
    }
}

impl Nats {
    pub fn start(binary: &Path, n: usize, sync: Sync) -> Result<Nats> {
        let reserved = reserve_ports(3 * n)?;
        let ports = numbers(&reserved);
        let (client_ports, rest) = ports.split_at(n);
        let (route_ports, monitor_ports) = rest.split_at(n);
        let mut servers = Vec::new();
        for i in 0..n {
            let dir = temp_dir(&format!("nats{i}"));
            std::fs::create_dir_all(&dir)?;
            let mut config = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\njetstream {{ store_dir: \"{}\"{} }}\n",
                client_ports[i],
                monitor_ports[i],
                dir.join("js").display(),
                if sync == Sync::Always { ", sync_interval: always" } else { "" }
            );
            if n > 1 {
                let routes: Vec<String> =
                    (0..n).filter(|&j| j != i).map(|j| format!("\"nats://127.0.0.1:{}\"", route_ports[j])).collect();
                config += &format!(
                    "cluster {{ name: ordo-bench, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                    route_ports[i],
                    routes.join(", ")
                );
            }
            let config_path = dir.join("nats.conf");
            std::fs::write(&config_path, config)?;
            let child = Command::new(binary)
                .arg("-c")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
            servers.push(Process { child, dir });
        }
        // JetStream is ready (a meta leader elected) when every /healthz says so.
        let deadline = Instant::now() + Duration::from_secs(30);
        for (server, &port) in servers.iter_mut().zip(monitor_ports) {
            loop {
                if let Ok((200, _)) = http_once(port, "GET", "/healthz", "") {
                    break;
                }
                // One that exited (a port it could not bind) will not get healthy: say so now.
                if let Some(status) = server.child.try_wait()? {
                    return Err(
                        format!("nats-server on monitor port {port} exited ({status}) before it was healthy").into()
                    );
                }
                if Instant::now() > deadline {
                    return Err(format!("nats-server on monitor port {port} not healthy within 30 s").into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let urls = client_ports.iter().map(|port| format!("nats://127.0.0.1:{port}")).collect();
        Ok(Nats { servers, urls, _ports: reserved })
    }

    /// The servers' pids, for their CPU time.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().map(Process::pid).collect()
    }
}

/// An `ordo serve` process; `port` is where it listens.
pub struct Ordo {
    pub process: Process,
    pub port: u16,
}

impl Ordo {
    /// `cluster`: the NATS URLs and the stream's replicas, or single-node mode.
    pub fn start(binary: &Path, name: &str, cluster: Option<(&Nats, usize)>, extra: &[String]) -> Result<Ordo> {
        Ordo::start_wrapped(&[], binary, name, cluster, extra)
    }

    /// `start`, run under `wrap` (a profiler's command line) when not empty.
    pub fn start_wrapped(
        wrap: &[String],
        binary: &Path,
        name: &str,
        cluster: Option<(&Nats, usize)>,
        extra: &[String],
    ) -> Result<Ordo> {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir)?;
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&dir).args(extra);
        if let Some((nats, replicas)) = cluster {
            command.args(["--cluster", &nats.urls.join(","), "--node-name", name]);
            command.args(["--stream-replicas", &replicas.to_string()]);
        }
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let child = command.spawn().map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let mut process = Process { child, dir };
        let authority = ordo_test_kit::server::wait_for_address(&mut process.child, Duration::from_secs(120), |_| {})
            .map_err(|error| format!("`ordo serve` ({name}): {error}"))?;
        let port = ordo_test_kit::server::port_of(&authority);
        Ok(Ordo { process, port })
    }

    pub fn health(&self) -> Result<serde_json::Value> {
        let (status, body) = http_once(self.port, "GET", "/v1/health", "")?;
        if status != 200 {
            return Err(format!("/v1/health answered {status}: {body}").into());
        }
        Ok(serde_json::from_str(&body)?)
    }

    pub fn applied_seq(&self) -> Result<u64> {
        let health = self.health()?;
        Ok(health["cluster"]["applied_seq"].as_u64().or(health["last_seq"].as_u64()).unwrap_or(0))
    }

    /// The value of one unlabelled counter or gauge of `/metrics` (0 when absent).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let (status, text) = http_once(self.port, "GET", "/metrics", "")?;
        if status != 200 {
            return Err(format!("/metrics answered {status}").into());
        }
        let prefix = format!("{name} ");
        Ok(text.lines().find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok()).unwrap_or(0.0))
    }

    /// The last stream message the node applied whole (a message may hold many entries).
    pub fn applied_stream_seq(&self) -> Result<u64> {
        let health = self.health()?;
        let cluster = &health["cluster"];
        Ok(cluster["applied_stream_seq"].as_u64().or(cluster["applied_seq"].as_u64()).unwrap_or(0))
    }
}

/// One keep-alive HTTP/1.1 connection (bodies with Content-Length only, as `ordo serve` sends them).
pub struct Http {
    pub stream: BufReader<TcpStream>,
}

impl Http {
    pub fn connect(port: u16) -> Result<Http> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Http { stream: BufReader::new(stream) })
    }

    pub fn request(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        let head =
            format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        self.stream.get_mut().write_all(head.as_bytes())?;
        let mut line = String::new();
        self.stream.read_line(&mut line)?;
        let status: u16 = line.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or("no HTTP status line")?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse()?;
                }
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body)?;
        Ok((status, String::from_utf8(body)?))
    }
}

pub fn http_once(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    Http::connect(port)?.request(method, path, body)
}

pub fn create_collection(port: u16) -> Result<()> {
    let schema = r#"{"fields":[{"name":"recency","type":"u64"},{"name":"name","type":"string"}]}"#;
    let (status, body) = http_once(port, "PUT", "/v1/collections/rooms", schema)?;
    if !matches!(status, 200 | 201) {
        return Err(format!("creating `rooms` answered {status}: {body}").into());
    }
    Ok(())
}

pub fn write_body(n: u64) -> String {
    format!(
        r#"{{"ops":[{{"op":"upsert","id":"r{}","fields":{{"recency":{n},"name":"room {}"}}}}]}}"#,
        n % 10_000,
        n % 10_000
    )
}
