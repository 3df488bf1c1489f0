//! Faults during writes: three NATS nodes (an R3 stream) and three
//! `ordo serve --cluster` nodes while writers and subscribers run, and one
//! fault per trial:
//!
//! - `nats_kill`: `kill -9` of a NATS node that does not lead the stream (writes go on);
//! - `nats_leader_kill`: `kill -9` of the stream's leader (found through `/jsz`);
//! - `ordo_kill`: `kill -9` of an Ordo node: its clients fail over to another
//!   node and resume there; the node restarts on its data dir and catches up;
//! - `ordo_stop`: SIGSTOP of an Ordo node for a few seconds: it lags (health
//!   says so once it runs again), then catches up;
//! - `nats_stop`: SIGSTOP of a NATS node (sometimes the stream's leader) for
//!   3 to 4.5 s: its connections stay open and silent; the nodes using it
//!   reconnect elsewhere, writes go on once the stream has a leader.
//!
//! Writers send each write to a random node and retry it, on another node, on
//! any error or timeout. A write is a batch of three ops: a new item `a` with
//! `if: {exists: false}`, a new item `b`, and `increment` of the writer's
//! counter: so a retry of a write that was applied after all is refused (409
//! on op 0) instead of applied twice, and a partial batch would show. Plain
//! increments of a second counter are never retried: their outcome may stay
//! unknown. After every trial, once every node has applied the whole stream,
//! on every node: every acknowledged write is there with its `seq` as version,
//! every write the writers learnt was applied is there, `a` and `b` come
//! together, the counter equals the writes present (each applied exactly
//! once), the plain counter is between the acknowledged increments and those
//! plus the unknown ones, and every node holds exactly the same items
//! (versions included). Every client list, built from every frame (`seq` one
//! by one, `write_seq` never going back, across failovers), equals a one-shot
//! query of its view.
//!
//! Each test runs a few trials of its fault (`ORDO_CLUSTER_FAULT_TRIALS`);
//! `ORDO_CLUSTER_FAULTS=n` makes `faults_at_length` inject `n` faults of
//! random kinds on one cluster (hundreds: minutes). Seeds are printed on failure
//! (`ORDO_CLUSTER_FAULT_SEED` replays a trial's seed as the first).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{all_items, env_number, request, OrdoCluster, SeedGuard};
use common::{apply_frame, LocalList, Rng};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// One cluster at a time in this binary: the machine has two cores, and six
/// processes per cluster are plenty.
static SERIAL: Mutex<()> = Mutex::new(());

const COLLECTION: &str = "w";
const STREAM: &str = "ORDO";
const N_WRITERS: u64 = 3;
const N_CLIENTS: usize = 4;
/// A request that takes longer is given up on (and retried elsewhere): its
/// outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a writer keeps retrying one write.
const RETRY_FOR: Duration = Duration::from_secs(30);
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// The first write of a fresh cluster (creating the collection, before any
/// fault): on a loaded machine the new R3 stream may still be electing its
/// leader and the node's first consumer may still be setting up, so it may
/// wait up to the node's own apply timeout (30 s); only then is it a failure.
/// CI once saw it take over 3 s.
const SETUP_TIMEOUT: Duration = Duration::from_secs(40);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    NatsKill,
    NatsLeaderKill,
    OrdoKill,
    OrdoStop,
    /// `SIGSTOP` of one NATS node (the stream leader in some trials): its TCP
    /// connections stay open and say nothing, which async-nats does not notice
    /// by itself (nats-io/nats.rs#1593; `cluster/log.rs` reconnects).
    NatsStop,
}

const FAULTS: [Fault; 5] = [Fault::NatsKill, Fault::NatsLeaderKill, Fault::OrdoKill, Fault::OrdoStop, Fault::NatsStop];

/// State the test shares with its writer threads and client tasks.
struct Shared {
    /// Each Ordo node's HTTP port, None while it is down.
    ports: Mutex<Vec<Option<u16>>>,
    stop: AtomicBool,
    /// The Ordo node last killed and when: a client that loses that node
    /// measures its failover gap from this instant.
    killed: Mutex<Option<(usize, Instant)>>,
    gaps: Mutex<Vec<Duration>>,
}

/// Sets the flag when dropped, unwinding included.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Shared {
    fn live_ports(&self) -> Vec<u16> {
        self.ports.lock().unwrap().iter().flatten().copied().collect()
    }
}

/// What one writer knows of its writes.
#[derive(Default)]
struct WriterLog {
    /// Write `k` → the `seq` its answer gave.
    acked: BTreeMap<u64, u64>,
    /// Writes a retry found applied (409 on op 0) after an earlier attempt got no answer.
    applied_unacked: BTreeSet<u64>,
    /// Writes that never got an answer within `RETRY_FOR`: either outcome.
    gave_up: BTreeSet<u64>,
    next_k: u64,
    plain_acked: u64,
    plain_unknown: u64,
    /// Attempts that failed, by what they got (`timeout`, `refused`, `503 code`...).
    failures: BTreeMap<String, u64>,
    /// Answers that break the rules (checked at the end of the trial).
    violations: Vec<String>,
    /// How long each write took from its first attempt to its outcome, retries included.
    latencies: Vec<Duration>,
}

fn failure_kind(result: &std::io::Result<(u16, Value)>) -> String {
    match result {
        Ok((status, answer)) => format!("{status} {}", answer["error"]["code"].as_str().unwrap_or("")),
        Err(error) => format!("{:?}", error.kind()),
    }
}

fn batch_body(writer: u64, k: u64) -> Value {
    json!({"ops": [
        {"op": "upsert", "id": format!("b{writer}-{k}-a"), "if": {"exists": false},
         "fields": {"writer": writer, "k": k}},
        {"op": "upsert", "id": format!("b{writer}-{k}-b"), "fields": {"writer": writer, "k": k}},
        {"op": "upsert", "id": format!("c{writer}"), "fields": {"writer": writer}, "increment": {"count": 1}},
    ]})
}

/// Whether an answer is one to retry: the node could not do it now (it is
/// stopping, lags, lost its log quorum) or failed; the write may or may not
/// have been applied.
fn retryable(status: u16) -> bool {
    status == 429 || status >= 500
}

fn run_writer(writer: u64, seed: u64, shared: &Shared, log: &mut WriterLog) {
    let mut rng = Rng::new(seed ^ (writer + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let path = format!("/v1/collections/{COLLECTION}/batch");
    while !shared.stop.load(Ordering::Relaxed) {
        if rng.chance(80) {
            let k = log.next_k;
            log.next_k += 1;
            let body = batch_body(writer, k);
            let started = Instant::now();
            let mut attempt = 0;
            loop {
                let ports = shared.live_ports();
                if ports.is_empty() {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                let port = *rng.pick(&ports);
                let result = request(port, "POST", &path, Some(&body), REQUEST_TIMEOUT);
                match &result {
                    Ok((200, answer)) => {
                        log.acked.insert(k, answer["seq"].as_u64().expect("a seq"));
                        break;
                    }
                    Ok((409, answer)) if answer["error"]["code"] == "conflict" && answer["error"]["op"] == 0 => {
                        if attempt == 0 {
                            log.violations.push(format!("write {writer}/{k}: a first attempt conflicted: {answer}"));
                        } else {
                            log.applied_unacked.insert(k);
                        }
                        break;
                    }
                    Ok((status, _)) if retryable(*status) => {}
                    Ok((status, answer)) => {
                        log.violations.push(format!("write {writer}/{k}: answered {status} {answer}"));
                        break;
                    }
                    Err(_) => {}
                }
                *log.failures.entry(failure_kind(&result)).or_default() += 1;
                attempt += 1;
                if started.elapsed() > RETRY_FOR {
                    log.gave_up.insert(k);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20 + rng.below(80)));
            }
            log.latencies.push(started.elapsed());
        } else {
            let ports = shared.live_ports();
            let Some(&port) = ports.get(rng.index(ports.len().max(1))) else { continue };
            let body = json!({"ops": [{"op": "upsert", "id": format!("p{writer}"),
                                        "fields": {"writer": writer}, "increment": {"count": 1}}]});
            let result = request(port, "POST", &path, Some(&body), REQUEST_TIMEOUT);
            match &result {
                Ok((200, _)) => log.plain_acked += 1,
                Ok((status, answer)) if !retryable(*status) => {
                    log.violations.push(format!("plain increment {writer}: answered {status} {answer}"))
                }
                _ => {
                    log.plain_unknown += 1;
                    *log.failures.entry(failure_kind(&result)).or_default() += 1;
                }
            }
        }
    }
}

/// The views the clients hold: one every write changes (the counters), one
/// at the head of all writes, one of one writer's.
fn client_views() -> Vec<(&'static str, Value)> {
    vec![
        ("counters", json!({"filter": {"field": "count", "op": "ge", "value": 0}, "limit": 10})),
        ("latest", json!({"sort": [{"field": "k", "dir": "desc"}], "limit": 10})),
        (
            "writer1",
            json!({"filter": {"all": [{"field": "writer", "op": "eq", "value": 1}, {"field": "count", "is_null": true}]},
                   "sort": [{"field": "k", "dir": "desc"}], "offset": 2, "limit": 5}),
        ),
    ]
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A subscriber that, when its node goes away, moves to the next live node
/// (round robin) and resumes there with `last_seq` and `min_seq` = the highest
/// `write_seq` it applied: as the client libraries do.
struct FailoverClient {
    name: String,
    node: usize,
    socket: Option<Socket>,
    session: String,
    lists: BTreeMap<String, LocalList>,
    write_seqs: BTreeMap<String, u64>,
    /// When the connection was lost because its node was killed: the gap runs
    /// from the kill to the first frame from another node.
    gap_from: Option<Instant>,
    n_failovers: u64,
    n_replayed: u64,
    n_reset: u64,
}

async fn connect(port: u16) -> Option<(Socket, String)> {
    let url = format!("ws://127.0.0.1:{port}/v1/ws");
    let (mut socket, _) =
        tokio::time::timeout(REQUEST_TIMEOUT, tokio_tungstenite::connect_async(url)).await.ok()?.ok()?;
    let welcome = tokio::time::timeout(REQUEST_TIMEOUT, socket.next()).await.ok()??.ok()?;
    let welcome: Value = serde_json::from_str(welcome.to_text().ok()?).ok()?;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    Some((socket, welcome["session"].as_str()?.to_owned()))
}

impl FailoverClient {
    async fn start(name: String, node: usize, port: u16, min_seq: u64) -> FailoverClient {
        let (mut socket, session) = connect(port).await.expect("connecting a client");
        for (sub, view) in client_views() {
            let mut message = view.clone();
            let extra = json!({"op": "subscribe", "sub": sub, "collection": COLLECTION, "min_seq": min_seq});
            message.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            socket.send(Message::text(message.to_string())).await.unwrap();
        }
        let mut client = FailoverClient {
            name,
            node,
            socket: Some(socket),
            session,
            lists: BTreeMap::new(),
            write_seqs: BTreeMap::new(),
            gap_from: None,
            n_failovers: 0,
            n_replayed: 0,
            n_reset: 0,
        };
        let deadline = Instant::now() + REQUEST_TIMEOUT * 3;
        while client.lists.len() < client_views().len() {
            assert!(Instant::now() < deadline, "{}: no first frames", client.name);
            client.read_one(Duration::from_millis(200), None).await;
        }
        client
    }

    /// Reads and applies one frame (waiting at most `wait`); marks the socket
    /// lost when it closes.
    async fn read_one(&mut self, wait: Duration, shared: Option<&Shared>) {
        let Some(socket) = self.socket.as_mut() else { return };
        let message = match tokio::time::timeout(wait, socket.next()).await {
            Err(_) => return,
            Ok(Some(Ok(Message::Text(text)))) => text,
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => {
                self.socket = None;
                if let Some(shared) = shared {
                    if let Some((node, at)) = *shared.killed.lock().unwrap() {
                        if node == self.node {
                            self.gap_from = Some(at);
                        }
                    }
                }
                return;
            }
            Ok(Some(Ok(_))) => return,
        };
        let frame: Value = serde_json::from_str(&message).expect("frames are JSON");
        match frame["type"].as_str().unwrap() {
            "diffs" => {
                let sub = frame["sub"].as_str().unwrap().to_owned();
                let write_seq = frame["write_seq"].as_u64().expect("write_seq");
                let last = self.write_seqs.entry(sub.clone()).or_default();
                assert!(
                    write_seq >= *last,
                    "{} sub {sub}: write_seq {write_seq} after {last}: the list went back in time",
                    self.name
                );
                *last = write_seq;
                // The `seq` check: one more than the last frame applied, across failovers too.
                apply_frame(self.lists.entry(sub).or_default(), &frame);
                if let (Some(from), Some(shared)) = (self.gap_from.take(), shared) {
                    shared.gaps.lock().unwrap().push(from.elapsed());
                }
            }
            other => panic!("{}: unexpected frame {other}: {frame}", self.name),
        }
    }

    /// Connects to the next live node after its own and resumes there.
    async fn fail_over(&mut self, shared: &Shared) -> bool {
        let ports = shared.ports.lock().unwrap().clone();
        let n = ports.len();
        let Some((node, port)) =
            (1..=n).map(|step| (self.node + step) % n).find_map(|node| ports[node].map(|port| (node, port)))
        else {
            return false;
        };
        let Some((mut socket, _)) = connect(port).await else { return false };
        let subs: Vec<Value> = client_views()
            .into_iter()
            .map(|(sub, view)| {
                let mut entry = view;
                entry["sub"] = json!(sub);
                entry["collection"] = json!(COLLECTION);
                entry["last_seq"] = json!(self.lists[sub].seq);
                entry["min_seq"] = json!(self.write_seqs[sub]);
                entry
            })
            .collect();
        let resume = json!({"op": "resume", "session": self.session, "subs": subs});
        if socket.send(Message::text(resume.to_string())).await.is_err() {
            return false;
        }
        let resumed = loop {
            match tokio::time::timeout(REQUEST_TIMEOUT * 3, socket.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => break serde_json::from_str::<Value>(&text).unwrap(),
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) | Err(_) => return false,
                Ok(Some(Ok(_))) => {}
            }
        };
        if resumed["type"] == "error" && matches!(resumed["code"].as_str(), Some("lagging" | "seq_not_reached")) {
            // A node that lags refuses subscribers: try the next one.
            self.node = node;
            return false;
        }
        assert_eq!(resumed["type"], "resumed", "{}: {resumed}", self.name);
        for entry in resumed["subs"].as_array().unwrap() {
            if entry["replayed"].is_u64() {
                self.n_replayed += 1;
            } else if entry["reset"] == true {
                self.n_reset += 1;
            } else {
                // A node that lags (or has not reached min_seq) refuses: try the next one.
                let code = entry["error"]["code"].as_str().unwrap_or("");
                assert!(matches!(code, "lagging" | "seq_not_reached"), "{}: {resumed}", self.name);
                self.node = node;
                return false;
            }
        }
        self.session = resumed["session"].as_str().unwrap().to_owned();
        self.socket = Some(socket);
        self.node = node;
        self.n_failovers += 1;
        true
    }

    /// Runs until the test says stop: reads frames, fails over when the node goes.
    async fn run(mut self, shared: Arc<Shared>) -> FailoverClient {
        while !shared.stop.load(Ordering::Relaxed) {
            if self.socket.is_none() {
                if !self.fail_over(&shared).await {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
            self.read_one(Duration::from_millis(100), Some(&shared)).await;
        }
        self
    }

    /// After the trial: reads until every list equals a one-shot query of its
    /// view on the client's node (which has applied `min_seq`).
    async fn settle(&mut self, port: u16, min_seq: u64, context: &str) {
        let mut expected = BTreeMap::new();
        for (sub, view) in client_views() {
            let mut body = view;
            body["min_seq"] = json!(min_seq);
            let path = format!("/v1/collections/{COLLECTION}/query");
            let (status, answer) = request(port, "POST", &path, Some(&body), Duration::from_secs(10)).unwrap();
            assert_eq!(status, 200, "{context}: {answer}");
            expected.insert(sub.to_owned(), common::without_versions(&answer["items"]));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let equal = expected.iter().all(|(sub, items)| &self.lists[sub].items == items);
            if equal {
                return;
            }
            assert!(self.socket.is_some(), "{context}: {} lost its node after the trial", self.name);
            if Instant::now() > deadline {
                for (sub, items) in &expected {
                    assert_eq!(
                        &self.lists[sub].items, items,
                        "{context}: {} sub {sub} on o{}: the list is not the query's",
                        self.name, self.node
                    );
                }
            }
            self.read_one(Duration::from_millis(100), None).await;
        }
    }
}

/// One fault and what was seen of it.
#[derive(Default, Debug)]
struct Observed {
    /// For `ordo_stop`: the largest `lag_entries` health showed after SIGCONT,
    /// and whether it said `lagging`.
    lag_entries_max: u64,
    lagging_seen: bool,
    /// For `nats_leader_kill`: whether the stream leader was the meta leader too.
    was_meta_leader: bool,
    /// For `nats_stop`: whether the frozen node led the stream.
    was_stream_leader: bool,
    /// What was done, for the log.
    what: String,
}

struct Bench {
    cluster: OrdoCluster,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Runtime,
    logs: Vec<WriterLog>,
    clients: Vec<FailoverClient>,
    /// Per fault kind: trials run, and what they saw.
    tally: BTreeMap<Fault, (u64, Vec<Observed>)>,
    total_acked_before: usize,
}

impl Bench {
    fn start(seed: u64) -> Bench {
        let cluster = OrdoCluster::start_with(3, 3, &["--cluster-max-lag", "100"]);
        let fields = json!({"fields": [{"name": "writer", "type": "u64"}, {"name": "k", "type": "u64"},
                                       {"name": "count", "type": "u64"}]});
        let (status, answer) = request(
            cluster.node(0).port,
            "PUT",
            &format!("/v1/collections/{COLLECTION}"),
            Some(&fields),
            SETUP_TIMEOUT,
        )
        .unwrap();
        assert_eq!(status, 201, "{answer}");
        let seq = cluster.wait_converged(CONVERGE_TIMEOUT);
        let shared = Arc::new(Shared {
            ports: Mutex::new(cluster.ports()),
            stop: AtomicBool::new(false),
            killed: Mutex::new(None),
            gaps: Mutex::new(Vec::new()),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut rng = Rng::new(seed);
        let clients = (0..N_CLIENTS)
            .map(|i| {
                let node = rng.index(cluster.len());
                let port = cluster.node(node).port;
                runtime.block_on(FailoverClient::start(format!("client {i}"), node, port, seq))
            })
            .collect();
        let logs = (0..N_WRITERS).map(|_| WriterLog::default()).collect();
        Bench { cluster, shared, runtime, logs, clients, tally: BTreeMap::new(), total_acked_before: 0 }
    }

    /// One trial: writers and clients run, `fault` strikes, all stop; then the checks.
    fn trial(&mut self, fault: Fault, seed: u64) {
        let _guard = SeedGuard { what: "cluster fault trial", seed, replay: "ORDO_CLUSTER_FAULT_SEED" };
        let context = format!("seed {seed} fault {fault:?}");
        let mut rng = Rng::new(seed);
        self.shared.stop.store(false, Ordering::Relaxed);
        let tasks: Vec<_> = std::mem::take(&mut self.clients)
            .into_iter()
            .map(|client| self.runtime.spawn(client.run(self.shared.clone())))
            .collect();
        let shared = self.shared.clone();
        let mut logs = std::mem::take(&mut self.logs);
        let observed = std::thread::scope(|scope| {
            for (writer, log) in logs.iter_mut().enumerate() {
                let shared = &shared;
                scope.spawn(move || run_writer(writer as u64, seed, shared, log));
            }
            // A fault whose check panics must still stop the writers: the
            // scope waits for them, so the test would hang instead of failing.
            let stop_writers = StopOnDrop(&shared.stop);
            let started = Instant::now();
            std::thread::sleep(Duration::from_millis(500 + rng.below(500)));
            let observed = self.inject(fault, &mut rng);
            eprintln!("{context}: {} after {:?}", observed.what, started.elapsed());
            std::thread::sleep(Duration::from_millis(1000));
            drop(stop_writers);
            observed
        });
        let stopped = Instant::now();
        let healths: Vec<Option<Value>> = (0..self.cluster.len()).map(|node| self.cluster.health(node)).collect();
        // A node learns the stream's end from its deliveries and a poll once a
        // second: after that, "converged" covers every entry published so far.
        std::thread::sleep(Duration::from_millis(1100));
        self.logs = logs;
        self.clients = tasks.into_iter().map(|task| self.runtime.block_on(task).expect("a client task")).collect();

        // Every node applies the whole stream; then every node is checked.
        let acked_max = self.logs.iter().flat_map(|log| log.acked.values().copied()).max().unwrap_or(0);
        let seq = self.cluster.wait_converged(CONVERGE_TIMEOUT).max(acked_max);
        eprintln!("{context}: writers stopped; converged at seq {seq} {:?} later", stopped.elapsed());
        if stopped.elapsed() > Duration::from_secs(2) {
            eprintln!("{context}: the nodes' health when the writers stopped: {healths:?}");
        }
        self.check_items(seq, &context);
        for client in &mut self.clients {
            let port = self.cluster.node(client.node).port;
            self.runtime.block_on(client.settle(port, seq, &context));
        }
        *self.shared.killed.lock().unwrap() = None;
        let entry = self.tally.entry(fault).or_default();
        entry.0 += 1;
        entry.1.push(observed);
    }

    fn inject(&mut self, fault: Fault, rng: &mut Rng) -> Observed {
        let mut observed = Observed::default();
        match fault {
            Fault::NatsKill | Fault::NatsLeaderKill => {
                let (meta, leader) = self.cluster.nats.leaders(STREAM);
                let leader = leader.or(meta).expect("the stream has a leader");
                let victim = if fault == Fault::NatsLeaderKill {
                    observed.was_meta_leader = meta == Some(leader);
                    leader
                } else {
                    let others: Vec<usize> = (0..self.cluster.nats.len()).filter(|&i| i != leader).collect();
                    *rng.pick(&others)
                };
                observed.what = format!("killed nats node {victim} (stream leader {leader}, meta leader {meta:?})");
                self.cluster.nats.kill(victim);
                std::thread::sleep(Duration::from_millis(2000 + rng.below(1000)));
                self.cluster.nats.restart(victim);
                // The next fault must not take away a quorum the restarted node has not rejoined.
                assert!(
                    self.cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT),
                    "the stream did not settle after restarting n{victim}"
                );
            }
            Fault::NatsStop => {
                let (meta, leader) = self.cluster.nats.leaders(STREAM);
                let victim = rng.index(self.cluster.nats.len());
                observed.was_stream_leader = leader == Some(victim);
                observed.what = format!("froze nats node {victim} (stream leader {leader:?}, meta leader {meta:?})");
                self.cluster.nats.stop(victim);
                std::thread::sleep(Duration::from_millis(3000 + rng.below(1500)));
                self.cluster.nats.cont(victim);
                assert!(
                    self.cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT),
                    "the stream did not settle after n{victim} was thawed"
                );
            }
            Fault::OrdoKill => {
                let victim = rng.index(self.cluster.len());
                self.shared.ports.lock().unwrap()[victim] = None;
                *self.shared.killed.lock().unwrap() = Some((victim, Instant::now()));
                observed.what = format!("killed ordo node o{victim}");
                self.cluster.kill(victim);
                std::thread::sleep(Duration::from_millis(1500 + rng.below(1000)));
                self.cluster.restart(victim);
                self.shared.ports.lock().unwrap()[victim] = Some(self.cluster.node(victim).port);
            }
            Fault::OrdoStop => {
                let victim = rng.index(self.cluster.len());
                self.cluster.signal(victim, libc::SIGSTOP);
                observed.what = format!("froze ordo node o{victim}");
                std::thread::sleep(Duration::from_millis(2500 + rng.below(1000)));
                self.cluster.signal(victim, libc::SIGCONT);
                // It lags while it applies what it missed, then catches up.
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    if let Some(health) = self.cluster.health(victim) {
                        observed.lag_entries_max =
                            observed.lag_entries_max.max(health["lag_entries"].as_u64().unwrap_or(0));
                        observed.lagging_seen |= health["lagging"] == true;
                        if health["lag_entries"] == 0 {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        observed
    }

    /// The items every node holds against what the writers know.
    fn check_items(&self, seq: u64, context: &str) {
        for log in &self.logs {
            assert!(log.violations.is_empty(), "{context}: {:#?}", log.violations);
        }
        let mut reference: Option<(usize, Vec<Value>)> = None;
        for node in (0..self.cluster.len()).filter(|&node| self.cluster.is_up(node)) {
            let items = all_items(self.cluster.node(node).port, COLLECTION, seq);
            if let Some((first, first_items)) = &reference {
                assert!(
                    first_items == &items,
                    "{context}: o{node} and o{first} hold different items at seq {seq} ({} and {})",
                    items.len(),
                    first_items.len()
                );
                continue;
            }
            let by_id: BTreeMap<&str, &Value> = items.iter().map(|item| (item["id"].as_str().unwrap(), item)).collect();
            for (writer, log) in self.logs.iter().enumerate() {
                let present = |part: &str| -> BTreeSet<u64> {
                    by_id
                        .keys()
                        .filter_map(|id| id.strip_prefix(&format!("b{writer}-"))?.strip_suffix(part)?.parse().ok())
                        .collect()
                };
                let (with_a, with_b) = (present("-a"), present("-b"));
                assert_eq!(with_a, with_b, "{context}: o{node}: writer {writer}: a partial batch");
                for (k, acked_seq) in &log.acked {
                    for part in ["a", "b"] {
                        let item = by_id.get(format!("b{writer}-{k}-{part}").as_str()).copied();
                        assert_eq!(
                            item.map(|item| &item["version"]),
                            Some(&json!(acked_seq)),
                            "{context}: o{node}: acknowledged write {writer}/{k} (seq {acked_seq}) lost or changed"
                        );
                    }
                }
                for k in &log.applied_unacked {
                    assert!(
                        with_a.contains(k),
                        "{context}: o{node}: write {writer}/{k}, found applied by a retry, is gone"
                    );
                }
                for k in &with_a {
                    let known = log.acked.contains_key(k) || log.applied_unacked.contains(k) || log.gave_up.contains(k);
                    assert!(
                        known,
                        "{context}: o{node}: write {writer}/{k} applied, yet a retry succeeded or none was sent"
                    );
                }
                let count = |id: String| by_id.get(id.as_str()).and_then(|item| item["fields"]["count"].as_u64());
                assert_eq!(
                    count(format!("c{writer}")).unwrap_or(0),
                    with_a.len() as u64,
                    "{context}: o{node}: writer {writer}: the counter is not the number of writes applied (once each)"
                );
                let plain = count(format!("p{writer}")).unwrap_or(0);
                assert!(
                    (log.plain_acked..=log.plain_acked + log.plain_unknown).contains(&plain),
                    "{context}: o{node}: writer {writer}: plain counter {plain}, acknowledged {}, unknown {}",
                    log.plain_acked,
                    log.plain_unknown
                );
            }
            reference = Some((node, items));
        }
    }

    /// Prints what the run did: per fault kind, the trials and what was seen;
    /// the writes and their outcomes; the failover gaps.
    fn report(&self, what: &str) -> String {
        let mut out = format!("{what}:\n");
        for (fault, (n, observed)) in &self.tally {
            let detail = match fault {
                Fault::OrdoStop => format!(
                    ", lag seen after SIGCONT in {}/{n} (max {} entries), `lagging` in {}",
                    observed.iter().filter(|o| o.lag_entries_max > 0).count(),
                    observed.iter().map(|o| o.lag_entries_max).max().unwrap_or(0),
                    observed.iter().filter(|o| o.lagging_seen).count()
                ),
                Fault::NatsLeaderKill => {
                    format!(", also meta leader in {}", observed.iter().filter(|o| o.was_meta_leader).count())
                }
                Fault::NatsStop => {
                    format!(", the stream leader in {}", observed.iter().filter(|o| o.was_stream_leader).count())
                }
                _ => String::new(),
            };
            out += &format!("  {fault:?}: {n} trials, all checks passed{detail}\n");
        }
        let sum = |f: fn(&WriterLog) -> u64| self.logs.iter().map(f).sum::<u64>();
        out += &format!(
            "  writes: {} sent, {} acknowledged, {} found applied by a retry, {} never answered; plain increments {} acknowledged, {} unknown\n",
            sum(|log| log.next_k),
            sum(|log| log.acked.len() as u64),
            sum(|log| log.applied_unacked.len() as u64),
            sum(|log| log.gave_up.len() as u64),
            sum(|log| log.plain_acked),
            sum(|log| log.plain_unknown),
        );
        let mut failures: BTreeMap<&str, u64> = BTreeMap::new();
        for log in &self.logs {
            for (kind, n) in &log.failures {
                *failures.entry(kind).or_default() += n;
            }
        }
        out += &format!("  failed attempts (retried): {failures:?}\n");
        let mut latencies: Vec<Duration> = self.logs.iter().flat_map(|log| log.latencies.iter().copied()).collect();
        latencies.sort();
        if !latencies.is_empty() {
            let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
            out += &format!(
                "  write time to outcome, retries included: p50={:?} p99={:?} max={:?}\n",
                at(0.5),
                at(0.99),
                latencies.last().unwrap()
            );
        }
        let mut gaps = self.shared.gaps.lock().unwrap().clone();
        gaps.sort();
        if !gaps.is_empty() {
            let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q).round() as usize];
            out += &format!(
                "  failover gap (kill to first frame from another node): n={} p50={:?} p99={:?} max={:?}\n",
                gaps.len(),
                at(0.5),
                at(0.99),
                gaps.last().unwrap()
            );
        }
        let (failovers, replayed, reset) =
            self.clients.iter().fold((0, 0, 0), |(f, p, r), c| (f + c.n_failovers, p + c.n_replayed, r + c.n_reset));
        out += &format!("  client failovers: {failovers} (subscriptions replayed {replayed}, reset {reset})\n");
        let _ = self.total_acked_before;
        out
    }
}

fn run_trials(name: &str, faults: &[Fault], base_seed: u64) {
    let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let first = std::env::var("ORDO_CLUSTER_FAULT_SEED").ok().map(|seed| seed.parse().unwrap());
    let mut bench = Bench::start(first.unwrap_or(base_seed));
    for (index, fault) in faults.iter().enumerate() {
        let seed = first.map_or(base_seed + index as u64, |first: u64| first + index as u64);
        bench.trial(*fault, seed);
        // A long run leaves its figures so far, should it be stopped.
        if let Ok(path) = std::env::var("ORDO_CLUSTER_FAULTS_REPORT") {
            std::fs::write(path, bench.report(&format!("{name} ({} of {} faults)", index + 1, faults.len()))).unwrap();
        }
    }
    let report = bench.report(name);
    eprintln!("{report}");
}

fn trials(fault: Fault) -> Vec<Fault> {
    vec![fault; env_number("ORDO_CLUSTER_FAULT_TRIALS", 2) as usize]
}

#[test]
fn kill_9_of_a_nats_node_loses_no_acknowledged_write() {
    run_trials("nats_kill", &trials(Fault::NatsKill), 100);
}

#[test]
fn kill_9_of_the_stream_leader_loses_no_acknowledged_write() {
    run_trials("nats_leader_kill", &trials(Fault::NatsLeaderKill), 200);
}

#[test]
fn kill_9_of_an_ordo_node_its_clients_fail_over_and_it_catches_up() {
    run_trials("ordo_kill", &trials(Fault::OrdoKill), 300);
}

#[test]
fn a_frozen_ordo_node_lags_then_catches_up() {
    run_trials("ordo_stop", &trials(Fault::OrdoStop), 400);
}

#[test]
fn sigstop_of_a_nats_node_loses_no_acknowledged_write() {
    run_trials("nats_stop", &trials(Fault::NatsStop), 600);
}

/// One of each fault in a random order; `ORDO_CLUSTER_FAULTS=n`: `n` faults of random kinds.
#[test]
fn faults_at_length() {
    let mut rng = Rng::new(env_number("ORDO_CLUSTER_FAULT_SEED", 500));
    let faults: Vec<Fault> = match std::env::var("ORDO_CLUSTER_FAULTS") {
        Ok(n) => (0..n.parse::<usize>().unwrap()).map(|_| *rng.pick(&FAULTS)).collect(),
        Err(_) => {
            let mut faults = FAULTS.to_vec();
            for i in (1..faults.len()).rev() {
                faults.swap(i, rng.index(i + 1));
            }
            faults
        }
    };
    run_trials("faults_at_length", &faults, 500);
}

/// A log entry as a node publishes it (`cluster/entry.rs`): an admin's
/// increment of `dup`'s counter.
fn increment_entry() -> Vec<u8> {
    json!({"kind": "write", "collection": COLLECTION,
           "ops": [{"op": "upsert", "id": "dup", "increment": {"count": 1}}],
           "caller": {"sub": "test", "role": "admin", "claims": {}}})
    .to_string()
    .into_bytes()
}

/// The same entry published again with the same `Nats-Msg-Id` (what a node
/// does when a publish times out), also after the stream's leader was killed
/// between the two, is applied once on every node; under a new id it is
/// applied again (so the check can fail).
#[test]
fn a_publish_retried_with_the_same_msg_id_is_applied_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut cluster = OrdoCluster::start(3, 3);
    let fields = json!({"fields": [{"name": "writer", "type": "u64"}, {"name": "k", "type": "u64"},
                                   {"name": "count", "type": "u64"}]});
    let path = format!("/v1/collections/{COLLECTION}");
    let (status, answer) = request(cluster.node(0).port, "PUT", &path, Some(&fields), SETUP_TIMEOUT).unwrap();
    assert_eq!(status, 201, "{answer}");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let urls: Vec<async_nats::ServerAddr> = cluster.nats.urls().split(',').map(|url| url.parse().unwrap()).collect();
    let client = runtime.block_on(async_nats::connect(urls)).expect("connecting to NATS");
    let js = async_nats::jetstream::new(client);
    let publish = |id: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        let js = js.clone();
        runtime.block_on(async move {
            // Until the stream has a leader again (after the kill), a publish fails: retry it, as a node does.
            let deadline = Instant::now() + CONVERGE_TIMEOUT;
            loop {
                let ack = match js.publish_with_headers("ordo.log", headers.clone(), increment_entry().into()).await {
                    Ok(future) => future.await,
                    Err(error) => Err(error),
                };
                match ack {
                    Ok(ack) => return ack,
                    Err(error) if Instant::now() < deadline => {
                        eprintln!("publishing {}: {error}; again", headers.get("Nats-Msg-Id").unwrap());
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => panic!("publishing: {error}"),
                }
            }
        })
    };
    // Each node's counter once it has applied the entry at `seq` (a node's
    // view of the stream's end is refreshed once a second: no waiting on that).
    let count_everywhere = |cluster: &OrdoCluster, seq: u64| -> Vec<Option<u64>> {
        (0..cluster.len())
            .map(|node| {
                let items = all_items(cluster.node(node).port, COLLECTION, seq);
                items.iter().find(|item| item["id"] == "dup").and_then(|item| item["fields"]["count"].as_u64())
            })
            .collect()
    };

    let first = publish("test/boot-1/1");
    let again = publish("test/boot-1/1");
    assert!(!first.duplicate && again.duplicate, "{first:?} {again:?}");
    assert_eq!(first.sequence, again.sequence);
    assert_eq!(count_everywhere(&cluster, first.sequence), vec![Some(1); 3], "a duplicate publish was applied twice");

    // The retry goes to the leader elected after the old one died: the
    // dedupe window is replicated with the stream.
    let second = publish("test/boot-1/2");
    let (_, leader) = cluster.nats.leaders(STREAM);
    cluster.nats.kill(leader.expect("a stream leader"));
    let again = publish("test/boot-1/2");
    assert!(again.duplicate && again.sequence == second.sequence, "{second:?} {again:?}");
    cluster.nats.restart(leader.unwrap());
    assert_eq!(
        count_everywhere(&cluster, second.sequence),
        vec![Some(2); 3],
        "a duplicate publish across a leader change"
    );

    // A new id is a new entry: applied.
    let third = publish("test/boot-1/3");
    assert_eq!(count_everywhere(&cluster, third.sequence), vec![Some(3); 3]);
}
