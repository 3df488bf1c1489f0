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
//!
//! This file holds the settings, the faults and the tests; `bench` runs a
//! cluster through trials and checks it, `writers` are the writer threads,
//! `clients` the subscribers that fail over.

mod bench;
mod clients;
#[path = "../common/mod.rs"]
mod common;
mod leader_waits;
mod writers;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bench::Bench;
use common::cluster::{all_items, env_number, request, OrdoCluster};
use common::Rng;
use serde_json::json;

/// One cluster at a time in this binary: the machine has two cores, and six
/// processes per cluster are plenty.
static SERIAL: Mutex<()> = Mutex::new(());

pub(crate) const COLLECTION: &str = "w";
pub(crate) const STREAM: &str = "ORDO";
pub(crate) const N_WRITERS: u64 = 3;
pub(crate) const N_CLIENTS: usize = 4;
/// A request that takes longer is given up on (and retried elsewhere): its
/// outcome is unknown.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a writer keeps retrying one write.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(30);
pub(crate) const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// The first write of a fresh cluster (creating the collection, before any
/// fault): on a loaded machine the new R3 stream may still be electing its
/// leader and the node's first consumer may still be setting up, so it may
/// wait up to the node's own apply timeout (30 s); only then is it a failure.
/// CI once saw it take over 3 s.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(40);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
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

/// Writers that wait as long as a node holds a write see no `503` while the
/// stream's leader is killed or frozen (`ORDO_CLUSTER_LEADER_FAULTS` rounds, 2 by default).
#[test]
fn writes_wait_out_the_election_after_a_stream_leader_kill_or_freeze() {
    let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    leader_waits::run(env_number("ORDO_CLUSTER_LEADER_FAULTS", 2) as usize);
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
    assert_eq!(
        count_everywhere(&cluster, common::cluster::seq_of_message(first.sequence)),
        vec![Some(1); 3],
        "a duplicate publish was applied twice"
    );

    // The retry goes to the leader elected after the old one died: the
    // dedupe window is replicated with the stream.
    let second = publish("test/boot-1/2");
    let (_, leader) = cluster.nats.leaders(STREAM);
    cluster.nats.kill(leader.expect("a stream leader"));
    let again = publish("test/boot-1/2");
    assert!(again.duplicate && again.sequence == second.sequence, "{second:?} {again:?}");
    cluster.nats.restart(leader.unwrap());
    assert_eq!(
        count_everywhere(&cluster, common::cluster::seq_of_message(second.sequence)),
        vec![Some(2); 3],
        "a duplicate publish across a leader change"
    );

    // A new id is a new entry: applied.
    let third = publish("test/boot-1/3");
    assert_eq!(count_everywhere(&cluster, common::cluster::seq_of_message(third.sequence)), vec![Some(3); 3]);
}
