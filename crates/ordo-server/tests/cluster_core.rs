//! Cluster mode over real `nats-server` processes on loopback (see
//! `common/nats.rs`): three Ordo nodes over a three-node NATS cluster with an R3
//! stream, writes on every node, and what the nodes must agree on afterwards;
//! a restarted node resumes exactly; a duplicate publish is applied once.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::nats::NatsCluster;
use common::Server;
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"fields": [{"name": "n", "type": "u64"}, {"name": "owner", "type": "string"}]})
}

fn node(dir: &Path, nats: &str, name: &str, replicas: usize) -> Server {
    let replicas = replicas.to_string();
    Server::start(dir, &["--cluster", nats, "--node-name", name, "--stream-replicas", &replicas])
}

fn health(server: &Server) -> Value {
    let (status, body) = server.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    body
}

fn applied_seq(server: &Server) -> u64 {
    health(server)["cluster"]["applied_seq"].as_u64().expect("cluster.applied_seq")
}

/// Waits until every node has applied `seq` (at most 20 s).
fn wait_applied(servers: &[&Server], seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for server in servers {
        while applied_seq(server) < seq {
            assert!(Instant::now() < deadline, "a node did not apply seq {seq}: {}", health(server));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Every item of `things` with its fields and version, in id order.
fn items(server: &Server, min_seq: u64) -> Value {
    let query = json!({"sort": [{"field": "n"}], "limit": 1000, "min_seq": min_seq, "payload": true});
    let answer = server.ok("POST", "/v1/collections/things/query", query);
    let mut items = answer["items"].as_array().unwrap().clone();
    items.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Value::Array(items)
}

fn increment(server: &Server, id: &str) -> u64 {
    let batch = json!({"ops": [{"op": "upsert", "id": id, "increment": {"n": 1}}]});
    server.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap()
}

fn counter(server: &Server, id: &str, min_seq: u64) -> u64 {
    let items = items(server, min_seq);
    let item = items.as_array().unwrap().iter().find(|item| item["id"] == id).expect("the counter exists");
    item["fields"]["n"].as_u64().unwrap()
}

#[test]
fn three_nodes_take_writes_and_agree_on_items_versions_and_seqs() {
    let nats = NatsCluster::start(3);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<Server> =
        (0..3).map(|index| node(dirs[index].path(), &nats.urls(), &format!("ordo-{index}"), 3)).collect();
    let [a, b, c] = [&nodes[0], &nodes[1], &nodes[2]];
    assert_eq!(health(a)["cluster"]["node"], "ordo-0");

    // Creation through any node; a second identical one is a no-op (200, not 201).
    let (status, _) = a.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let (status, _) = b.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 200);

    // Writes through every node, in turn; each answer's seq is one stream entry.
    let mut seqs = Vec::new();
    for round in 0..10u64 {
        for (index, server) in nodes.iter().enumerate() {
            let id = format!("i{}", (round * 3 + index as u64) % 7);
            let batch = json!({"ops": [
                {"op": "upsert", "id": id, "fields": {"owner": format!("ordo-{index}")}, "increment": {"n": 1},
                 "payload": {"round": round}}
            ]});
            let seq = server.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap();
            // Read-your-writes on the node that answered, without min_seq.
            let (status, item) = server.http("GET", &format!("/v1/collections/things/items/{id}"), None);
            assert_eq!(status, 200);
            assert_eq!(item["version"].as_u64(), Some(seq), "the answering node shows its own write at once");
            seqs.push(seq);
        }
    }
    let mut sorted = seqs.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), seqs.len(), "every write has its own seq");
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "sequential writes get increasing seqs: {seqs:?}");

    // A multi-part write: one entry per part, each its own seq.
    let multi = json!({"writes": [
        {"collection": "things", "ops": [{"op": "upsert", "id": "m1", "fields": {"n": 100}}]},
        {"collection": "things", "ops": [{"op": "upsert", "id": "m2", "fields": {"n": 200}}]},
    ]});
    let (status, answer) = c.http("POST", "/v1/batch", Some(&multi));
    assert_eq!(status, 200, "{answer}");
    let part_seqs: Vec<u64> =
        answer["results"].as_array().unwrap().iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(part_seqs.len(), 2);
    assert!(part_seqs[0] < part_seqs[1]);

    // Another node with min_seq sees the write at once.
    let last = part_seqs[1];
    let on_a = items(a, last);
    assert!(on_a.as_array().unwrap().iter().any(|item| item["id"] == "m2" && item["version"] == last));

    // A precondition conflict: 409 on the node that published it, nothing changed
    // anywhere, and its seq is used (the next write takes the one after).
    let before = items(b, last);
    let conflict = json!({"ops": [{"op": "upsert", "id": "i1", "fields": {"n": 0}, "if": {"exists": false}}]});
    let (status, error) = b.http("POST", "/v1/collections/things/batch", Some(&conflict));
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["error"]["code"], "conflict", "{error}");
    let next = increment(a, "after-conflict");
    wait_applied(&[a, b, c], next);
    let conflict_seq = next - 1;
    assert!(conflict_seq > last, "the conflict used a seq of its own");
    for server in [a, b, c] {
        let now = items(server, next);
        let unchanged: Vec<&Value> =
            now.as_array().unwrap().iter().filter(|item| item["id"] != "after-conflict").collect();
        assert_eq!(unchanged, before.as_array().unwrap().iter().collect::<Vec<_>>(), "the conflict changed nothing");
    }

    // Every node converged to the same items, versions and seq.
    let reference = items(a, next);
    for server in [b, c] {
        assert_eq!(items(server, next), reference);
        assert_eq!(applied_seq(server), next);
    }
    let total: u64 = reference
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["id"].as_str().unwrap().starts_with('i'))
        .map(|item| item["fields"]["n"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 30, "every increment applied exactly once");
    for server in [a, b, c] {
        let cluster = &health(server)["cluster"];
        assert_eq!(cluster["lag_entries"], 0, "{cluster}");
        assert_eq!(cluster["lagging"], false, "{cluster}");
        assert_eq!(server.metric("ordo_cluster_applied_seq"), next as f64);
    }

    // Schema changes and drops are entries too: every node follows.
    let add = json!({"name": "extra", "type": "u64", "default": 7});
    let changed = b.ok("POST", "/v1/collections/things/fields", add);
    let seq = changed["seq"].as_u64().unwrap();
    wait_applied(&[a, b, c], seq);
    for server in [a, b, c] {
        let (_, collection) = server.http("GET", "/v1/collections/things", None);
        assert!(collection["fields"].as_array().unwrap().iter().any(|field| field["name"] == "extra"), "{collection}");
    }
    let dropped = c.ok("DELETE", "/v1/collections/things", json!(null));
    wait_applied(&[a, b, c], dropped["seq"].as_u64().unwrap());
    for server in [a, b, c] {
        let (status, _) = server.http("GET", "/v1/collections/things", None);
        assert_eq!(status, 404);
    }
}

#[test]
fn a_restarted_node_resumes_at_the_next_entry_and_applies_nothing_twice() {
    let nats = NatsCluster::start(1);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(dir_a.path(), &nats.urls(), "a", 1);
    let mut b = node(dir_b.path(), &nats.urls(), "b", 1);
    let (status, _) = a.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let mut expected = 0;
    for _ in 0..20 {
        increment(&a, "counter");
        increment(&b, "counter");
        expected += 2;
    }
    // A refused entry at the tail: its seq must be used on restart too.
    let conflict = json!({"ops": [{"op": "upsert", "id": "counter", "if": {"exists": false}}]});
    assert_eq!(b.http("POST", "/v1/collections/things/batch", Some(&conflict)).0, 409);
    let seq_before = applied_seq(&b);

    // A crash: SIGKILL, no checkpoint. The others keep writing meanwhile.
    // SAFETY: `kill` with the pid of a child this test owns and a valid signal number.
    unsafe { libc::kill(b.pid() as i32, libc::SIGKILL) };
    b.wait();
    drop(b);
    for _ in 0..15 {
        increment(&a, "counter");
        expected += 1;
    }
    let b = node(dir_b.path(), &nats.urls(), "b", 1);
    let last = increment(&a, "counter");
    expected += 1;
    wait_applied(&[&b], last);
    assert_eq!(counter(&b, "counter", last), expected, "no increment lost or applied twice on the restarted node");
    assert_eq!(counter(&a, "counter", last), expected);
    assert!(applied_seq(&b) > seq_before);

    // A clean stop and start at the head: nothing to apply again.
    b.stop();
    let b = node(dir_b.path(), &nats.urls(), "b", 1);
    assert_eq!(applied_seq(&b), last, "the store's last seq is the last entry applied");
    let next = increment(&b, "counter");
    assert_eq!(next, common::cluster::next_message_seq(last));
    assert_eq!(counter(&a, "counter", next), expected + 1);
}

#[test]
fn a_duplicate_publish_is_applied_once() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &nats.urls(), "solo", 1);
    let (status, _) = server.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let entry = json!({
        "kind": "write", "collection": "things",
        "ops": [{"op": "upsert", "id": "dup", "increment": {"n": 1}}],
        "caller": {"sub": "test", "role": "admin"},
    })
    .to_string();
    // The same request twice (a retry after a timeout), then a new one.
    let payload = bytes::Bytes::from(entry.into_bytes());
    let messages = ["test/retry/1", "test/retry/1", "test/retry/2"].map(|id| (id, payload.clone()));
    let acks = runtime.block_on(publish_with_ids(&nats, &messages));
    assert!(!acks[0].1 && acks[1].1 && !acks[2].1, "{acks:?}");
    assert_eq!(acks[0].0, acks[1].0, "a duplicate is acknowledged with the original's seq");
    let last = common::cluster::seq_of_message(acks[2].0);
    assert_eq!(counter(&server, "dup", last), 2, "two distinct entries, the retry dropped");
    assert_eq!(applied_seq(&server), last);
}

/// Publishes each payload to the log under its message id, as a node would;
/// each one's stream seq and whether JetStream took it as a duplicate.
async fn publish_with_ids(nats: &NatsCluster, messages: &[(&str, bytes::Bytes)]) -> Vec<(u64, bool)> {
    let client = async_nats::connect(nats.url(0)).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut acks = Vec::new();
    for (id, payload) in messages {
        let publish = async_nats::jetstream::context::Publish::build().message_id(*id).payload(payload.clone());
        let ack = js.send_publish("ordo.log", publish).await.unwrap().await.unwrap();
        acks.push((ack.sequence, ack.duplicate));
    }
    acks
}

/// A pack (several entries in one stream message) published again under its
/// message id is stored once, and each of its entries applied once.
#[test]
fn a_duplicate_publish_of_a_pack_is_applied_once() {
    const N_PACKED: usize = 3;
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &nats.urls(), "solo", 1);
    let (status, _) = server.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let entry = |id: &str| {
        let entry = json!({
            "kind": "write", "collection": "things",
            "ops": [{"op": "upsert", "id": id, "increment": {"n": 1}}],
            "caller": {"sub": "test", "role": "admin"},
        });
        bytes::Bytes::from(entry.to_string().into_bytes())
    };
    let packed: Vec<(String, bytes::Bytes)> =
        (0..N_PACKED).map(|index| (format!("test/pack/entry{index}"), entry("dup"))).collect();
    let mut pack = bytes::BytesMut::new();
    ordo_server::cluster::pack::encode(&packed, &mut pack);
    let pack = pack.freeze();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The same pack twice (a retry after a timeout), then one entry alone.
    let messages = [("test/pack/1", pack.clone()), ("test/pack/1", pack), ("test/single/2", entry("dup"))];
    let acks = runtime.block_on(publish_with_ids(&nats, &messages));
    assert!(!acks[0].1 && acks[1].1 && !acks[2].1, "{acks:?}");
    assert_eq!(acks[0].0, acks[1].0, "a duplicate is acknowledged with the original's seq");
    let last = common::cluster::seq_of_message(acks[2].0);
    let expected = N_PACKED as u64 + 1;
    assert_eq!(
        counter(&server, "dup", last),
        expected,
        "each packed entry once, the retry dropped, then the single one"
    );
    assert_eq!(applied_seq(&server), last);
}

/// A node that keeps up with the live log gets it in runs of one entry. What
/// applying a run needs besides the entry's own batch (its group of pending
/// writes) is kept from one run to the next, so following a write allocates
/// next to nothing on the writer thread: a group made for each run allocated
/// its two lists, two allocations per followed entry.
#[test]
fn a_node_following_single_writes_allocates_next_to_nothing_per_entry() {
    const WARM_UP_WRITES: u64 = 200;
    const MEASURED_WRITES: u64 = 400;
    const WRITER_ALLOCATIONS: &str = "ordo_thread_allocations_total{thread=\"writer\"}";
    let nats = NatsCluster::start(1);
    let (taker_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let taker = node(taker_dir.path(), &nats.urls(), "taker", 1);
    let follower = node(follower_dir.path(), &nats.urls(), "follower", 1);
    let (status, _) = taker.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    // One write at a time: each is its own stream message, and the follower's own run.
    let write = |index: u64| {
        let op = json!({"op": "upsert", "id": format!("t{}", index % 50), "fields": {"n": index, "owner": "o"}});
        taker.ok("POST", "/v1/collections/things/batch", json!({"ops": [op]}))["seq"].as_u64().unwrap()
    };
    let write_all = |indices: std::ops::Range<u64>| indices.fold(0, |_, index| write(index));
    wait_applied(&[&follower], write_all(0..WARM_UP_WRITES));
    let before = follower.metric(WRITER_ALLOCATIONS);
    wait_applied(&[&follower], write_all(WARM_UP_WRITES..WARM_UP_WRITES + MEASURED_WRITES));
    let per_entry = (follower.metric(WRITER_ALLOCATIONS) - before) / MEASURED_WRITES as f64;
    println!("the follower's writer thread: {per_entry:.2} allocations per followed entry");
    assert!(per_entry < 0.5, "{per_entry:.2} allocations per followed entry on the follower's writer thread");
}

#[test]
fn single_node_mode_has_no_cluster_fields() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let body = health(&server);
    assert!(body.get("cluster").is_none(), "{body}");
    let (status, _) = server.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    assert_eq!(increment(&server, "c"), 1);
    assert_eq!(increment(&server, "c"), 2);
    let (_, metrics) = server.http_raw("GET", "/metrics", None);
    assert!(!String::from_utf8_lossy(&metrics).contains("ordo_cluster_"));
}

/// An increment through `server`, retried while the cluster answers 503 (a NATS
/// node just died and the stream elects a leader): `None` if never accepted.
fn increment_retrying(server: &Server, id: &str, attempts: &mut u64) -> Option<u64> {
    let batch = json!({"ops": [{"op": "upsert", "id": id, "increment": {"n": 1}}]});
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        *attempts += 1;
        let (status, answer) = server.http("POST", "/v1/collections/things/batch", Some(&batch));
        if status == 200 {
            return answer["seq"].as_u64();
        }
        assert_eq!(status, 503, "{answer}");
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `n` increments alternating over `servers`, each retried on 503; what came of them.
struct Tally {
    acknowledged: u64,
    attempts: u64,
    last: u64,
}

fn write_some(servers: &[&Server], n: usize, tally: &mut Tally) {
    for index in 0..n {
        if let Some(seq) = increment_retrying(servers[index % servers.len()], "counter", &mut tally.attempts) {
            tally.acknowledged += 1;
            tally.last = tally.last.max(seq);
        }
    }
}

/// Every acknowledged increment is applied on every node, none twice unless
/// its request was retried after a 503 (a retry is a new request).
fn check_tally(servers: &[&Server], tally: &Tally, expected_acks: u64) {
    wait_applied(servers, tally.last);
    assert_eq!(tally.acknowledged, expected_acks, "with a quorum left, every write is acknowledged (after retries)");
    let on_first = counter(servers[0], "counter", tally.last);
    assert!(
        (expected_acks..=tally.attempts).contains(&on_first),
        "{on_first} increments, {tally:?}",
        tally = (tally.acknowledged, tally.attempts)
    );
    for server in servers {
        assert_eq!(counter(server, "counter", tally.last), on_first);
    }
}

/// The harness's kill and restart, as the fault tests use them: a NATS node
/// killed, then restarted on its ports and store. The R3 stream keeps a quorum
/// throughout, so writes go on; every acknowledged one is applied once.
#[test]
fn writes_go_on_while_one_nats_node_is_killed_and_restarted() {
    let mut nats = NatsCluster::start(3);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = node(dirs[0].path(), &nats.urls(), "a", 3);
    let b = node(dirs[1].path(), &nats.urls(), "b", 3);
    assert_eq!(a.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let mut tally = Tally { acknowledged: 0, attempts: 0, last: 0 };
    write_some(&[&a, &b], 10, &mut tally);
    nats.kill(0);
    write_some(&[&a, &b], 10, &mut tally);
    nats.restart(0);
    write_some(&[&a, &b], 10, &mut tally);
    check_tally(&[&a, &b], &tally, 30);
}

/// The NATS server (index) a client named `name` is connected to, as the
/// servers' `/connz` say (a frozen server does not answer: not it, or unknown).
fn connected_server(nats: &NatsCluster, name: &str) -> Option<usize> {
    (0..nats.len()).find(|&index| {
        nats.monitor(index, "/connz").is_some_and(|(_, connz)| {
            connz["connections"].as_array().into_iter().flatten().any(|connection| connection["name"] == name)
        })
    })
}

/// While the NATS server a node is connected to is frozen (SIGSTOP), its TCP
/// connection stays open and async-nats' pings never fire (each command sent
/// postpones them, nats-io/nats.rs#1593), and async-nats' own reconnection
/// could wait forever for the frozen server's handshake (nats-io/nats.rs#1526):
/// writes on that node went unacknowledged for minutes. A timed-out publish
/// now makes the node open a new connection with a bounded handshake and
/// consume again on it; every write is answered within a bound (acknowledged,
/// or `503 cluster_unavailable` after the publish attempts, retried here).
/// (The former version of this test froze server 1 whoever the nodes used.)
#[test]
fn writes_go_on_while_the_nats_server_a_node_uses_is_frozen() {
    let nats = NatsCluster::start(3);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = node(dirs[0].path(), &nats.urls(), "a", 3);
    let b = node(dirs[1].path(), &nats.urls(), "b", 3);
    assert_eq!(a.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let mut tally = Tally { acknowledged: 0, attempts: 0, last: 0 };
    write_some(&[&a, &b], 4, &mut tally);
    let frozen = connected_server(&nats, "ordo a").expect("node a is connected to a NATS server");
    nats.stop(frozen);
    let batch = json!({"ops": [{"op": "upsert", "id": "counter", "increment": {"n": 1}}]});
    let started = Instant::now();
    let mut n_unavailable = 0;
    while tally.acknowledged < 10 {
        tally.attempts += 1;
        let asked = Instant::now();
        let answer = common::cluster::request(
            a.port,
            "POST",
            "/v1/collections/things/batch",
            Some(&batch),
            Duration::from_secs(60),
        );
        let (status, body) = answer.expect("node a answers");
        // Publish attempts (3 × (send + acknowledgement), 5 s each) and the
        // wait for its own apply (30 s) bound every answer.
        assert!(asked.elapsed() < Duration::from_secs(61), "a write took {:?}", asked.elapsed());
        match status {
            200 => {
                tally.acknowledged += 1;
                tally.last = tally.last.max(body["seq"].as_u64().unwrap());
            }
            503 => {
                assert_eq!(body["error"]["code"], "cluster_unavailable", "{body}");
                n_unavailable += 1;
            }
            _ => panic!("{status} {body}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node a took no write in 60 s with its NATS server frozen"
        );
    }
    eprintln!("10 writes on a in {:?} with its server frozen ({n_unavailable} answered 503 first)", started.elapsed());
    let now = connected_server(&nats, "ordo a");
    assert!(now.is_some_and(|index| index != frozen), "node a is on server {now:?}, the frozen one is {frozen}");
    write_some(&[&b], 2, &mut tally);
    nats.cont(frozen);
    nats.wait_all_ready();
    write_some(&[&a, &b], 4, &mut tally);
    check_tally(&[&a, &b], &tally, 16);
}

/// A node that catches up applies the stream in runs (one group commit for
/// consecutive writes, `cluster::apply::apply_run`); a node that applied the
/// same entries live, as they came, applied them one by one. A run mixing
/// accepted writes, precondition conflicts (409 at apply time, each a seq
/// marker), a multi-part batch and a schema change must give every entry
/// exactly its seq and outcome: the same items with the same versions on both,
/// and each item's version the seq its write was answered with.
#[test]
fn a_node_catching_up_in_runs_gets_the_seqs_and_outcomes_of_one_by_one() {
    let nats = NatsCluster::start(1);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(dir_a.path(), &nats.urls(), "a", 1);
    let (status, _) = a.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    // (item id, seq answered) of every accepted write; the seqs of the refused ones.
    let mut written: Vec<(String, u64)> = Vec::new();
    let mut refused: Vec<u64> = Vec::new();
    let mut last = 0;
    for round in 0..60u64 {
        let id = format!("w{round}");
        let batch = json!({"ops": [{"op": "upsert", "id": id, "fields": {"n": round}}]});
        let seq = a.ok("POST", "/v1/collections/things/batch", batch)["seq"].as_u64().unwrap();
        written.push((id.clone(), seq));
        if round % 7 == 3 {
            // Refused when applied: the item exists. Its seq must not shift the next writes'.
            let conflict = json!({"ops": [{"op": "upsert", "id": id, "if": {"exists": false}}]});
            let (status, body) = a.http("POST", "/v1/collections/things/batch", Some(&conflict));
            assert_eq!(status, 409, "{body}");
            refused.push(common::cluster::next_message_seq(seq));
        }
        if round % 11 == 5 {
            // Two parts: two entries, back to back, in one run on the catching-up node.
            let parts = json!({"writes": [
                {"collection": "things", "ops": [{"op": "upsert", "id": format!("p{round}"), "fields": {"n": 1}}]},
                {"collection": "things", "ops": [{"op": "upsert", "id": id, "if": {"version": seq}, "increment": {"n": 1}}]},
            ]});
            let answer = a.ok("POST", "/v1/batch", parts);
            let results = answer["results"].as_array().unwrap_or_else(|| panic!("{answer}"));
            for (result, item) in results.iter().zip([format!("p{round}"), id.clone()]) {
                let seq = result["seq"].as_u64().unwrap_or_else(|| panic!("{answer}"));
                written.retain(|(written_id, _)| *written_id != item);
                written.push((item, seq));
            }
        }
        if round == 30 {
            // A schema change in the middle ends a run's group: the writes after it use the new field.
            let field = json!({"name": "extra", "type": "u64", "default": 7});
            let (status, body) = a.http("POST", "/v1/collections/things/fields", Some(&field));
            assert!(status == 200 || status == 201, "{status} {body}");
        }
        last = applied_seq(&a);
    }
    // A conflict on a version the item no longer has, at the very end.
    let stale = json!({"ops": [{"op": "upsert", "id": "w0", "if": {"version": 1}}]});
    assert_eq!(a.http("POST", "/v1/collections/things/batch", Some(&stale)).0, 409);
    let tail = common::cluster::next_message_seq(last);
    refused.push(tail);
    let last = increment(&a, "counter");
    written.push(("counter".to_owned(), last));
    assert_eq!(last, common::cluster::next_message_seq(tail), "the refused entry used its own seq");

    // A new node: the whole stream is there at once, so its consumer hands it runs.
    let b = node(dir_b.path(), &nats.urls(), "b", 1);
    wait_applied(&[&b], last);
    assert_eq!(applied_seq(&b), last);
    let (on_a, on_b) = (items(&a, last), items(&b, last));
    assert_eq!(on_a, on_b, "the same items, fields and versions on the live and the catching-up node");
    let versions: std::collections::BTreeMap<&str, u64> = on_b
        .as_array()
        .unwrap()
        .iter()
        .map(|item| (item["id"].as_str().unwrap(), item["version"].as_u64().unwrap()))
        .collect();
    for (id, seq) in &written {
        assert_eq!(versions.get(id.as_str()), Some(seq), "item `{id}` has the seq its write was answered with");
    }
    assert!(
        !refused.iter().any(|seq| versions.values().any(|version| version == seq)),
        "refused entries wrote nothing"
    );
    // After the run, a write on the caught-up node gets the next seq.
    assert_eq!(increment(&b, "counter"), common::cluster::next_message_seq(last));
}

/// The rules are checked where an entry applies, not only by the node that
/// published it: entries put on the stream directly (a node of an older
/// version, a bug, anyone with access to NATS) carrying a writer's or a
/// reader's identity cannot change the schema, drop or write past the rules.
#[test]
fn entries_are_checked_against_the_callers_rules_where_they_apply() {
    let nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &nats.urls(), "solo", 1);
    let (status, _) = server.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let entries = [
        json!({"kind": "add_field", "collection": "things", "field": {"name": "extra", "type": "u64"},
               "caller": {"sub": "w", "role": "writer"}}),
        json!({"kind": "remove_field", "collection": "things", "field": "owner",
               "caller": {"sub": "w", "role": "writer"}}),
        json!({"kind": "drop_collection", "collection": "things", "caller": {"sub": "w", "role": "writer"}}),
        json!({"kind": "write", "collection": "things", "ops": [{"op": "upsert", "id": "r", "fields": {"n": 1}}],
               "caller": {"sub": "r", "role": "reader"}}),
        // The last one is allowed: it tells when the others have been applied.
        json!({"kind": "write", "collection": "things", "ops": [{"op": "upsert", "id": "ok", "fields": {"n": 2}}],
               "caller": {"sub": "a", "role": "admin"}}),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let last = runtime.block_on(async {
        let client = async_nats::connect(nats.url(0)).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut last = 0;
        for (index, entry) in entries.iter().enumerate() {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(format!("test/rules/{index}"))
                .payload(entry.to_string().into_bytes().into());
            last = common::cluster::seq_of_message(
                js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence,
            );
        }
        last
    });
    wait_applied(&[&server], last);
    let ids: Vec<Value> = items(&server, last).as_array().unwrap().iter().map(|item| item["id"].clone()).collect();
    assert_eq!(ids, vec![json!("ok")], "only the admin's write applied");
    let (status, collection) = server.http("GET", "/v1/collections/things", None);
    assert_eq!(status, 200, "the writer's drop was refused: {collection}");
    let names: Vec<&str> =
        collection["fields"].as_array().unwrap().iter().map(|field| field["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n", "owner"], "the writer's schema changes were refused");
}

/// A write under a filtered write rule (`owner == $sub`) is checked against the
/// items as the entries before it left them, so inside a catch-up run it must
/// see the writes of the same run before it: the guard of each such entry
/// decides on the same state whether the node applies the stream live, one
/// entry at a time, or in runs. Each guarded write here is refused or accepted
/// only because of the admin's write just before it.
#[test]
fn a_guarded_write_in_a_catch_up_run_gets_the_outcome_it_gets_alone() {
    let nats = NatsCluster::start(1);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(dir_a.path(), &nats.urls(), "a", 1);
    let (status, _) = a.http("PUT", "/v1/collections/things", Some(&schema()));
    assert_eq!(status, 201);
    let admin = json!({"sub": "ops", "role": "admin"});
    let writer = json!({"sub": "w", "role": "writer"});
    let write = |caller: &Value, id: &str, fields: Value| {
        json!({"kind": "write", "collection": "things", "ops": [{"op": "upsert", "id": id, "fields": fields}],
               "caller": caller})
    };
    let rules = json!({"rules": [{"collection": "things", "roles": ["writer"], "read": true,
                                  "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]});
    // (entry, whether it must be accepted).
    let mut entries = vec![(json!({"kind": "set_rules", "rules": rules, "caller": admin}), true)];
    for round in 0..5 {
        let (mine, given, theirs) = (format!("mine{round}"), format!("given{round}"), format!("theirs{round}"));
        entries.extend([
            // The writer's own new item: inside the grant.
            (write(&writer, &mine, json!({"owner": "w", "n": 1})), true),
            // The admin hands it to someone else...
            (write(&admin, &mine, json!({"owner": "z"})), true),
            // ...so the writer may no longer touch it: refused only if the guard sees the write before.
            (write(&writer, &mine, json!({"n": 2})), false),
            // The admin gives the writer an item...
            (write(&admin, &given, json!({"owner": "w", "n": 5})), true),
            // ...which it may then change: accepted only if the guard sees the write before.
            (write(&writer, &given, json!({"n": 6})), true),
            // Someone else's new item: outside the grant.
            (write(&writer, &theirs, json!({"owner": "z", "n": 7})), false),
        ]);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let js = runtime.block_on(async { async_nats::jetstream::new(async_nats::connect(nats.url(0)).await.unwrap()) });
    // Published one at a time, each applied by node a before the next: a applies them alone.
    let mut seqs = Vec::new();
    for (index, (entry, _)) in entries.iter().enumerate() {
        let seq = runtime.block_on(async {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(format!("test/guarded/{index}"))
                .payload(entry.to_string().into_bytes().into());
            common::cluster::seq_of_message(js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence)
        });
        wait_applied(&[&a], seq);
        seqs.push(seq);
    }
    let last = *seqs.last().unwrap();
    // Applied alone, each item is at the seq of its last accepted write, with its fields.
    let mut expected = std::collections::BTreeMap::new();
    for ((entry, accepted), seq) in entries.iter().zip(&seqs).skip(1) {
        if *accepted {
            expected.insert(entry["ops"][0]["id"].as_str().unwrap().to_owned(), *seq);
        }
    }
    let on_a = items(&a, last);
    let versions: std::collections::BTreeMap<String, u64> = on_a
        .as_array()
        .unwrap()
        .iter()
        .map(|item| (item["id"].as_str().unwrap().to_owned(), item["version"].as_u64().unwrap()))
        .collect();
    assert_eq!(versions, expected, "applied alone, exactly the accepted writes are there: {on_a}");
    for item in on_a.as_array().unwrap() {
        let (owner, n) = if item["id"].as_str().unwrap().starts_with("mine") { ("z", 1) } else { ("w", 6) };
        assert_eq!(item["fields"], json!({"owner": owner, "n": n}), "{item}");
    }

    // A new node gets the whole stream at once: its consumer hands it runs.
    let b = node(dir_b.path(), &nats.urls(), "b", 1);
    wait_applied(&[&b], last);
    assert_eq!(applied_seq(&b), last);
    assert_eq!(items(&b, last), on_a, "the same outcome for every guarded write in runs as applied alone");
}

/// After a stream leader kill a node's poll of the stream's state got no
/// answer, and its lag read 0 while it waited for entries it had not heard of.
/// A node that cannot read the stream keeps the last seq it knew, says how old
/// that is, never reports "0 s behind", and after `STALE_LAGGING_AFTER` counts
/// as lagging (refuses new subscribers); once the stream answers again, all is
/// fresh. Here the only NATS server is killed, then restarted.
#[test]
fn a_node_that_cannot_read_the_stream_says_so_and_never_reads_caught_up() {
    let mut nats = NatsCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), &nats.urls(), "a", 1);
    assert_eq!(a.http("PUT", "/v1/collections/things", Some(&schema())).0, 201);
    let seq = increment(&a, "c");
    let cluster = &health(&a)["cluster"];
    assert_eq!(cluster["stream_state_stale"], false, "{cluster}");
    assert_eq!(cluster["lag_seconds"], 0.0, "{cluster}");
    assert_eq!(cluster["fatal"], Value::Null, "{cluster}");

    nats.kill(0);
    let wait_for = |what: &str, is_it: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let cluster = health(&a)["cluster"].clone();
            if is_it(&cluster) {
                return cluster;
            }
            assert!(Instant::now() < deadline, "not {what} within 20 s: {cluster}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let stale = wait_for("stale", &|cluster| cluster["stream_state_stale"] == true);
    assert_eq!(stale["stream_last_seq"], common::cluster::message_of(seq), "the last known seq is kept: {stale}");
    assert!(stale["lag_seconds"].as_f64().unwrap() > 3.0, "a node that cannot tell is not 0 s behind: {stale}");
    assert_eq!(stale["lagging"], false, "{stale}");
    let lagging = wait_for("lagging", &|cluster| cluster["lagging"] == true);
    assert!(lagging["stream_state_age_seconds"].as_f64().unwrap() > 10.0, "{lagging}");
    assert!(a.metric("ordo_cluster_stream_state_age_seconds") > 10.0);

    nats.restart(0);
    let fresh = wait_for("fresh", &|cluster| cluster["stream_state_stale"] == false && cluster["lagging"] == false);
    assert_eq!(fresh["lag_seconds"], 0.0, "{fresh}");
    assert_eq!(increment(&a, "c"), common::cluster::next_message_seq(seq));
}

/// A `through` read rule travels as any rules document does (one `set_rules`
/// entry) and every node compiles it with the same checks: put on one node, a
/// member reads its rooms through its memberships on another, the rooms stay
/// closed to it there, and an unsafe rules document is refused both by the node
/// it is put on (nothing published) and by every node applying it from the
/// stream (the rules in force stay).
#[test]
fn a_through_rule_travels_as_set_rules_and_every_node_checks_it() {
    let nats = NatsCluster::start(1);
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = common::write_secret(secret_dir.path());
    let admin = common::mint(&secret, "ops", "admin", &[]);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let start = |dir: &Path, name: &str| {
        let args = ["--cluster", &nats.urls(), "--node-name", name, "--stream-replicas", "1", "--auth-secret-file"];
        let mut args: Vec<&str> = args.to_vec();
        args.push(secret.to_str().unwrap());
        let mut server = Server::start(dir, &args);
        server.token = Some(admin.clone());
        server
    };
    let (a, b) = (start(dir_a.path(), "a"), start(dir_b.path(), "b"));
    a.ok("PUT", "/v1/collections/rooms", json!({"fields": [{"name": "name", "type": "string"}]}));
    let members =
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"}]});
    a.ok("PUT", "/v1/collections/members", members);
    let rooms = json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"name": "Alpha"}},
        {"op": "upsert", "id": "r2", "fields": {"name": "Secret"}}]});
    a.ok("POST", "/v1/collections/rooms/batch", rooms);
    let membership = json!({"ops": [{"op": "upsert", "id": "alice/r1", "fields": {"owner": "alice", "room": "r1"}}]});
    a.ok("POST", "/v1/collections/members/batch", membership);
    let safe = json!({"rules": [
        {"collection": "members", "roles": ["reader"], "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}},
        {"collection": "rooms", "roles": ["reader"], "read": {"through": "members.room"}}]});
    let seq = a.ok("PUT", "/v1/rules", safe.clone())["seq"].as_u64().unwrap();
    wait_applied(&[&a, &b], seq);

    let alice = common::mint(&secret, "alice", "reader", &[]);
    let query = json!({"fields": ["room.name"], "limit": 10});
    let (status, answer) = b.http_as(Some(&alice), "POST", "/v1/collections/members/query", Some(&query));
    assert_eq!(status, 200, "{answer}");
    let names: Vec<&Value> =
        answer["items"].as_array().unwrap().iter().map(|item| &item["fields"]["room.name"]).collect();
    assert_eq!(names, [&json!("Alpha")], "{answer}");
    let (status, answer) = b.http_as(Some(&alice), "GET", "/v1/collections/rooms/items/r2", None);
    assert_eq!((status, answer["error"]["message"].as_str()), (403, Some("this identity may not read `rooms`")));

    // Readers who may write their memberships could point them at any room.
    let mut unsafe_rules = safe.clone();
    unsafe_rules["rules"]
        .as_array_mut()
        .unwrap()
        .push(json!({"collection": "members", "roles": ["reader"], "write": true}));
    let (status, answer) = a.http("PUT", "/v1/rules", Some(&unsafe_rules));
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_rules")), "{answer}");
    assert_eq!(applied_seq(&a), seq, "a refused document is not published");

    // The same document put on the stream directly: every node refuses it as it applies it.
    let entries = [
        json!({"kind": "set_rules", "rules": unsafe_rules, "caller": {"sub": "ops", "role": "admin"}}),
        json!({"kind": "write", "collection": "rooms", "ops": [{"op": "upsert", "id": "r3", "fields": {"name": "Marker"}}],
               "caller": {"sub": "ops", "role": "admin"}}),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let last = runtime.block_on(async {
        let client = async_nats::connect(nats.url(0)).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut last = 0;
        for (index, entry) in entries.iter().enumerate() {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(format!("test/through/{index}"))
                .payload(entry.to_string().into_bytes().into());
            last = common::cluster::seq_of_message(
                js.send_publish("ordo.log", publish).await.unwrap().await.unwrap().sequence,
            );
        }
        last
    });
    wait_applied(&[&a, &b], last);
    for node in [&a, &b] {
        let mut in_force = node.ok("GET", "/v1/rules", Value::Null);
        in_force.as_object_mut().unwrap().remove("seq");
        assert_eq!(in_force, safe, "the rules in force stay");
    }
}
