//! A real `ordo serve` on loopback, a tiny HTTP client and a WebSocket client
//! that applies diff frames to a local list, checking `seq` on every frame.

#![allow(dead_code)]

pub mod cluster;
pub mod nats;
pub mod ports;
pub mod postgres;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream as AsyncTcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    /// Sent as `Authorization: Bearer` by `http`, `ok` and `metric` when set.
    pub token: Option<String>,
    /// What the server wrote to stderr, line by line, when the test asked to capture it.
    stderr: Option<Arc<Mutex<Vec<String>>>>,
}

/// The `ordo` binary the tests run: this build's, or `$ORDO_TEST_BIN` (a long
/// fault run keeps its own copy, so that a rebuild meanwhile does not change it).
pub fn ordo_binary() -> PathBuf {
    std::env::var_os("ORDO_TEST_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ordo")), PathBuf::from)
}

/// A 32-byte HS256 secret in `dir/secret`, for `--auth-secret-file`.
pub fn write_secret(dir: &Path) -> PathBuf {
    let path = dir.join("secret");
    std::fs::write(&path, "test-secret-0123456789abcdef0123456789\n").unwrap();
    path
}

/// A token minted by `ordo token` with the secret in `secret_file`.
pub fn mint(secret_file: &Path, sub: &str, role: &str, extra: &[&str]) -> String {
    let output = Command::new(ordo_binary())
        .args(["token", "--sub", sub, "--role", role, "--secret-file"])
        .arg(secret_file)
        .args(extra)
        .output()
        .expect("running ordo token");
    assert!(output.status.success(), "ordo token: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// How long `ordo serve` may take to print its address (a debug build on a busy
/// machine opening its data directory).
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start a server, beyond its command-line arguments.
#[derive(Default, Clone, Copy)]
pub struct StartOptions {
    /// The server's descriptor limit (soft and hard `RLIMIT_NOFILE`), set in the child before it starts.
    pub nofile: Option<u64>,
    /// Keep the server's stderr (see `Server::stderr_lines`) instead of passing it through.
    pub capture_stderr: bool,
    /// Environment variables set for the server (`ORDO_*` options, `RUST_LOG`).
    pub env: &'static [(&'static str, &'static str)],
}

impl Server {
    pub fn start(dir: &Path, extra_args: &[&str]) -> Server {
        Server::start_with(dir, extra_args, StartOptions::default())
    }

    pub fn start_with(dir: &Path, extra_args: &[&str], options: StartOptions) -> Server {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(ordo_binary());
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra_args)
            .stdout(Stdio::piped())
            .stderr(if options.capture_stderr { Stdio::piped() } else { Stdio::inherit() })
            .envs(options.env.iter().copied());
        if let Some(nofile) = options.nofile {
            let limit = libc::rlimit { rlim_cur: nofile as libc::rlim_t, rlim_max: nofile as libc::rlim_t };
            // SAFETY: runs in the forked child before exec; `setrlimit` is
            // async-signal-safe and reads only `limit`, a copy on this stack.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("starting ordo");
        let stderr = child.stderr.take().map(|pipe| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("{line}");
                    sink.lock().unwrap().push(line);
                }
            });
            lines
        });
        let authority =
            ordo_test_kit::server::wait_for_address(&mut child, SERVER_START_TIMEOUT, |_| {}).expect("starting ordo");
        let port = ordo_test_kit::server::port_of(&authority);
        Server { child, port, dir: dir.to_owned(), token: None, stderr }
    }

    /// With `--demo`: an admin token signed with the demo's secret, used from now on.
    pub fn signed_in_as_demo_admin(mut self) -> Server {
        self.token = Some(mint(&self.dir.join("demo-secret"), "ops", "admin", &[]));
        self
    }

    /// The server's stderr so far (empty unless started with `capture_stderr`).
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.as_ref().map_or_else(Vec::new, |lines| lines.lock().unwrap().clone())
    }

    /// The stderr lines once one satisfies `is_wanted` (within 10 s): the reader
    /// thread sees a line some time after the request that caused it was answered.
    pub fn wait_for_stderr_line(&self, is_wanted: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let lines = self.stderr_lines();
            if lines.iter().any(|line| is_wanted(line)) {
                return lines;
            }
            assert!(std::time::Instant::now() < deadline, "no such line in the log: {lines:#?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The server process's id (for reading `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit (after a signal sent by the test).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("waiting for ordo")
    }

    /// Waits at most `timeout` for the process to exit by itself: its status, or None.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for ordo") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGINT, then wait: the graceful path.
    pub fn stop(mut self) {
        // SAFETY: `kill` with a pid we own and a valid signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("waiting for ordo");
        assert!(status.success(), "ordo exited with {status}");
    }

    pub fn http(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let body = body.map(|body| body.to_string());
        let (status, bytes) = self.http_raw(method, path, body.as_deref().map(str::as_bytes));
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    pub fn http_raw(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
        let auth = self.token.as_ref().map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
        self.http_with(method, path, &auth, body)
    }

    /// `http` as the holder of `token` (or without one), whatever `self.token` is.
    pub fn http_as(&self, token: Option<&str>, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
        let body = body.map(|body| body.to_string());
        let (status, bytes) = self.http_with(method, path, &auth, body.as_deref().map(str::as_bytes));
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    /// A request with extra header lines (each ending in `\r\n`).
    pub fn http_with(&self, method: &str, path: &str, extra_headers: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        let body = body.unwrap_or(b"");
        let host = if extra_headers.to_ascii_lowercase().contains("host:") { "" } else { "Host: localhost\r\n" };
        let head = format!(
            "{method} {path} HTTP/1.1\r\n{host}{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        // The server may answer (413) before reading a huge body: ignore a broken pipe.
        let _ = stream.write_all(body);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let text_end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a full response head");
        let head = std::str::from_utf8(&response[..text_end]).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let mut body = response[text_end + 4..].to_vec();
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        (status, body)
    }

    pub fn ok(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, answer) = self.http(method, path, Some(&body));
        assert!((200..300).contains(&status), "{method} {path} {body}: {status} {answer}");
        answer
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.http_raw("GET", "/metrics", None);
        let text = String::from_utf8(text).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("metric {name} missing"))
            .parse()
            .unwrap()
    }

    pub async fn connect(&self) -> Client {
        let token = self.token.clone();
        self.connect_as(token.as_deref()).await
    }

    /// A WebSocket that authenticates with `token` (an `auth` message after the
    /// `welcome`, as a browser would) and waits for `authed`.
    pub async fn connect_as(&self, token: Option<&str>) -> Client {
        let url = format!("ws://127.0.0.1:{}/v1/ws", self.port);
        let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("WebSocket connect");
        let mut client = Client {
            socket,
            session: String::new(),
            lists: Default::default(),
            frames: Vec::new(),
            diffs_seen: Vec::new(),
        };
        let welcome = client.next_json(Duration::from_secs(5)).await.expect("welcome");
        assert_eq!(welcome["type"], "welcome", "{welcome}");
        assert_eq!(welcome["protocol"], 1);
        client.session = welcome["session"].as_str().unwrap().to_owned();
        if let Some(token) = token {
            client.send(json!({"op": "auth", "token": token})).await;
            let authed = client.next_json(Duration::from_secs(5)).await.expect("authed");
            assert_eq!(authed["type"], "authed", "{authed}");
        }
        client
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[line_end + 2..line_end + 2 + size]);
        body = &body[line_end + 4 + size..];
    }
}

/// A subscription's local copy: what a client application would hold.
#[derive(Default, Debug, Clone)]
pub struct LocalList {
    pub items: Vec<Value>,
    pub seq: u64,
    pub n_resets: usize,
    /// Frames whose `digest` matched the list after applying them.
    pub n_digests_checked: usize,
}

pub struct Client {
    pub socket: WebSocketStream<MaybeTlsStream<AsyncTcpStream>>,
    pub session: String,
    pub lists: std::collections::BTreeMap<String, LocalList>,
    /// Every non-diff frame received (errors, unsubscribed, resumed), in order.
    pub frames: Vec<Value>,
    /// Every diff frame received since the test last took them.
    pub diffs_seen: Vec<Value>,
}

impl Client {
    pub async fn send(&mut self, message: Value) {
        self.socket.send(Message::text(message.to_string())).await.expect("send");
    }

    pub async fn send_raw(&mut self, message: Message) {
        let _ = self.socket.send(message).await;
    }

    /// The next frame as JSON (diff frames are applied and also returned).
    pub async fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(timeout, self.socket.next()).await.ok()??.ok()?;
            let text = match message {
                Message::Text(text) => text,
                Message::Close(frame) => {
                    let close = json!({"type": "close", "code": frame.map(|f| u16::from(f.code))});
                    self.frames.push(close.clone());
                    return Some(close);
                }
                _ => continue,
            };
            let value: Value = serde_json::from_str(&text).expect("server frames are JSON");
            if value["type"] == "diffs" {
                self.apply(&value);
                self.diffs_seen.push(value.clone());
            } else {
                self.frames.push(value.clone());
            }
            return Some(value);
        }
    }

    /// Applies one diff frame to its subscription's list, as a client library does.
    pub fn apply(&mut self, frame: &Value) {
        let sub = frame["sub"].as_str().unwrap().to_owned();
        apply_frame(self.lists.entry(sub).or_default(), frame);
    }

    /// Reads frames until `until` holds or `timeout` passes; returns whether it held.
    pub async fn read_until(&mut self, timeout: Duration, mut until: impl FnMut(&Client) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while !until(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.next_json(left).await.is_none() {
                return until(self);
            }
        }
        true
    }

    /// Waits for an error frame and returns it.
    pub async fn expect_error(&mut self) -> Value {
        let n_before = self.frames.len();
        let found = self
            .read_until(Duration::from_secs(5), |client| {
                client.frames[n_before..].iter().any(|frame| frame["type"] == "error")
            })
            .await;
        assert!(found, "no error frame came; frames: {:?}", &self.frames[n_before..]);
        self.frames[n_before..].iter().find(|frame| frame["type"] == "error").unwrap().clone()
    }
}

/// Applies one diff frame to a list, checking that its `seq` is the next one
/// and, when it carries a `digest`, that the list's digest after it is that one.
pub fn apply_frame(list: &mut LocalList, frame: &Value) {
    apply_diffs(list, frame);
    // Every integration test checks the window digest of every frame that has one.
    if let Some(digest) = frame.get("digest") {
        let sub = frame["sub"].as_str().unwrap();
        assert_eq!(
            digest.as_str(),
            Some(list_digest(&list.items).as_str()),
            "subscription {sub}: the digest after seq {} (list of {} items)",
            frame["seq"],
            list.items.len()
        );
        list.n_digests_checked += 1;
    }
}

/// Applies one diff frame's diffs to a list, checking that its `seq` is the
/// next one, but not its digest.
pub fn apply_diffs(list: &mut LocalList, frame: &Value) {
    let sub = frame["sub"].as_str().unwrap();
    let seq = frame["seq"].as_u64().unwrap();
    assert_eq!(seq, list.seq + 1, "subscription {sub}: seq {seq} after {}", list.seq);
    list.seq = seq;
    for diff in frame["diffs"].as_array().unwrap() {
        let (kind, body) = diff.as_object().unwrap().iter().next().unwrap();
        let items = &mut list.items;
        let index = || body["index"].as_u64().unwrap() as usize;
        match kind.as_str() {
            "Append" => items.extend(body["values"].as_array().unwrap().iter().cloned()),
            "Clear" => items.clear(),
            "PushFront" => items.insert(0, body["value"].clone()),
            "PushBack" => items.push(body["value"].clone()),
            "PopFront" => {
                items.remove(0);
            }
            "PopBack" => {
                items.pop().expect("PopBack on an empty list");
            }
            "Insert" => items.insert(index(), body["value"].clone()),
            "Set" => items[index()] = body["value"].clone(),
            "Remove" => {
                items.remove(index());
            }
            "Truncate" => {
                let length = body["length"].as_u64().unwrap() as usize;
                assert!(length <= items.len());
                items.truncate(length);
            }
            "Reset" => {
                *items = body["values"].as_array().unwrap().clone();
                list.n_resets += 1;
            }
            other => panic!("unknown diff {other}"),
        }
    }
}

/// A one-shot query's items, which a subscription shows exactly as they are
/// (items carry their `version` in both, `docs/PROTOCOL.md`).
pub fn query_items(items: &Value) -> Vec<Value> {
    let items = items.as_array().expect("an array of items").clone();
    for item in &items {
        assert!(item["version"].is_u64(), "a query item without a version: {item}");
    }
    items
}

/// The window digest of a list (docs/PROTOCOL.md, "Window digest"), written
/// here from the specification, apart from the server's code: 64-bit FNV-1a over
/// each row's position (u32 LE), id length (u32 LE), id bytes and version (u64 LE).
pub fn list_digest(items: &[Value]) -> String {
    let mut bytes = Vec::new();
    for (position, item) in items.iter().enumerate() {
        let id = item["id"].as_str().expect("an item id");
        let version = item["version"].as_u64().unwrap_or_else(|| panic!("an item without a version: {item}"));
        bytes.extend_from_slice(&(position as u32).to_le_bytes());
        bytes.extend_from_slice(&(id.len() as u32).to_le_bytes());
        bytes.extend_from_slice(id.as_bytes());
        bytes.extend_from_slice(&version.to_le_bytes());
    }
    let hash = bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

pub fn room_schema() -> Value {
    json!({"fields": [
        {"name": "name", "type": "string"},
        {"name": "recency", "type": "u64"},
        {"name": "unread", "type": "u64"},
        {"name": "dm", "type": "bool"},
        {"name": "score", "type": "f64"},
    ]})
}

/// The crate's seeded generator, so a failing seed can be replayed. (Not every
/// test file that includes this module uses it.)
#[allow(unused_imports)]
pub use ordo_server::rng::Rng;

/// The reference-field tests' layout: shared `rooms` and `members` with a
/// `ref` to them (`ref_views`, `ref_view_model`).
pub fn create_rooms_and_members(server: &Server) {
    server.ok(
        "PUT",
        "/v1/collections/rooms",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"},
                          {"name": "preview", "type": "string"}, {"name": "muted", "type": "bool"}]}),
    );
    server.ok(
        "PUT",
        "/v1/collections/members",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"},
                          {"name": "unread", "type": "u64"}]}),
    );
}
