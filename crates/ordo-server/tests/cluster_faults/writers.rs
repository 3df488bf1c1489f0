//! The writer threads: each sends batches (and plain increments) to random
//! live nodes, retries a batch elsewhere on any error or timeout, and records
//! what it learnt of each write for the checks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::Shared;
use crate::common::cluster::request;
use crate::common::Rng;
use crate::{COLLECTION, REQUEST_TIMEOUT, RETRY_FOR};

/// What one writer knows of its writes.
#[derive(Default)]
pub(crate) struct WriterLog {
    /// Write `k` → the `seq` its answer gave.
    pub(crate) acked: BTreeMap<u64, u64>,
    /// Writes a retry found applied (409 on op 0) after an earlier attempt got no answer.
    pub(crate) applied_unacked: BTreeSet<u64>,
    /// Writes that never got an answer within `RETRY_FOR`: either outcome.
    pub(crate) gave_up: BTreeSet<u64>,
    pub(crate) next_k: u64,
    pub(crate) plain_acked: u64,
    pub(crate) plain_unknown: u64,
    /// Attempts that failed, by what they got (`timeout`, `refused`, `503 code`...).
    pub(crate) failures: BTreeMap<String, u64>,
    /// Answers that break the rules (checked at the end of the trial).
    pub(crate) violations: Vec<String>,
    /// How long each write took from its first attempt to its outcome, retries included.
    pub(crate) latencies: Vec<Duration>,
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

pub(crate) fn run_writer(writer: u64, seed: u64, shared: &Shared, log: &mut WriterLog) {
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
