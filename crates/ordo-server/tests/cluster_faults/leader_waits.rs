//! Writers that wait as long as a node may take (no client timeout shorter
//! than the node's own publish attempts) while the stream's leader is killed
//! or frozen: every write is answered with its outcome, none `503`, since a
//! node waits out the election on each attempt (docs/SCALING.md, failure
//! table), and each is applied exactly once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use std::time::Instant;

use serde_json::json;

use crate::common::cluster::{all_items, request, OrdoCluster};
use crate::common::Rng;
use crate::{COLLECTION, CONVERGE_TIMEOUT, SETUP_TIMEOUT, STREAM};

/// Longer than a node ever holds a write (its publish attempts, then its
/// apply): a write that gets no answer within it is a failure too.
const WRITE_TIMEOUT: Duration = Duration::from_secs(90);
const N_WRITERS: u64 = 4;

/// What one writer saw: writes answered 200, and every other answer.
#[derive(Default)]
struct Seen {
    acked: u64,
    other: Vec<String>,
}

fn write_until_stopped(writer: u64, ports: &[u16], stop: &AtomicBool, acked: &AtomicU64) -> Seen {
    let mut rng = Rng::new(0x5eed ^ writer);
    let mut seen = Seen::default();
    let path = format!("/v1/collections/{COLLECTION}/batch");
    let body = json!({"ops": [{"op": "upsert", "id": format!("c{writer}"), "increment": {"count": 1}}]});
    while !stop.load(Ordering::Relaxed) {
        let port = *rng.pick(ports);
        match request(port, "POST", &path, Some(&body), WRITE_TIMEOUT) {
            Ok((200, _)) => {
                seen.acked += 1;
                acked.fetch_add(1, Ordering::Relaxed);
            }
            Ok((status, answer)) => seen.other.push(format!("{status} {answer}")),
            Err(error) => seen.other.push(format!("no answer: {error}")),
        }
    }
    seen
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `faults` rounds, each a kill -9 of the stream's leader then a SIGSTOP of
/// the next leader, with `N_WRITERS` writers on every node.
pub(crate) fn run(faults: usize) {
    let mut cluster = OrdoCluster::start(3, 2);
    let fields = json!({"fields": [{"name": "count", "type": "u64"}]});
    let path = format!("/v1/collections/{COLLECTION}");
    let (status, answer) = request(cluster.node(0).port, "PUT", &path, Some(&fields), SETUP_TIMEOUT).unwrap();
    assert_eq!(status, 201, "{answer}");
    let ports: Vec<u16> = (0..cluster.len()).map(|node| cluster.node(node).port).collect();
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    let seen: Vec<Seen> = std::thread::scope(|scope| {
        // A failing check below stops the writers too (the scope waits for them).
        let _stop_writers = StopOnDrop(&stop);
        let (ports, stop, acked) = (&ports, &stop, &acked);
        let writers: Vec<_> =
            (0..N_WRITERS).map(|writer| scope.spawn(move || write_until_stopped(writer, ports, stop, acked))).collect();
        // One election at a time, as in production: each fault once writes flow again.
        let writes_flow = || {
            let (before, deadline) = (acked.load(Ordering::Relaxed), Instant::now() + CONVERGE_TIMEOUT);
            while acked.load(Ordering::Relaxed) < before + 2 * N_WRITERS {
                assert!(Instant::now() < deadline, "writes do not flow again");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        for round in 0..faults {
            writes_flow();
            let leader = cluster.nats.leaders(STREAM).1.expect("a stream leader");
            eprintln!("round {round}: kill -9 of the stream leader n{leader}");
            cluster.nats.kill(leader);
            std::thread::sleep(Duration::from_secs(3));
            cluster.nats.restart(leader);
            assert!(cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT), "the stream did not settle");
            let leader = cluster.nats.leaders(STREAM).1.expect("a stream leader");
            eprintln!("round {round}: SIGSTOP of the stream leader n{leader}");
            writes_flow();
            cluster.nats.stop(leader);
            std::thread::sleep(Duration::from_secs(6));
            cluster.nats.cont(leader);
            assert!(cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT), "the stream did not settle");
        }
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().map(|writer| writer.join().unwrap()).collect()
    });
    let other: Vec<&String> = seen.iter().flat_map(|seen| &seen.other).collect();
    assert!(other.is_empty(), "writes answered other than 200 ({} of them): {other:?}", other.len());
    let last = cluster.wait_converged(CONVERGE_TIMEOUT);
    for node in 0..cluster.len() {
        let items = all_items(cluster.node(node).port, COLLECTION, last);
        for (writer, seen) in seen.iter().enumerate() {
            let count =
                items.iter().find(|item| item["id"] == format!("c{writer}")).map(|item| &item["fields"]["count"]);
            assert_eq!(count, Some(&json!(seen.acked)), "node o{node}, writer {writer}: each write applied once");
        }
    }
}
