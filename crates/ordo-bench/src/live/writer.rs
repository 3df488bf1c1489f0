//! Writers: the paced write loop, its requests and its counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::Method;

use super::http::{HttpPool, HttpReply};
use super::stats::{Clock, Histogram};
use super::subscriber::preview;
use super::wire::{MultiBatchReply, SingleBatchReply};
use super::MAX_OPS_PER_REQUEST;

/// One write request: its body, and how many updates of which collection each
/// part carries (to count acknowledged updates per collection).
pub struct WriteRequest {
    /// The source's number for this request, to match its commit `seq` with it.
    pub id: u64,
    pub path: &'static str,
    pub body: Vec<u8>,
    pub parts: Vec<WritePart>,
    /// `POST /v1/batch` (a result per part) rather than one collection's batch.
    pub multi_collection: bool,
    /// What the request counts toward the writer's rate, when not the sum of
    /// its parts' updates (a fan-out message is one message, however many copies).
    pub paced_updates: Option<u64>,
}

pub struct WritePart {
    pub collection: u32,
    pub n_updates: u64,
}

/// Makes the updates due in one tick; `now_us` is their send time.
pub trait UpdateSource {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest;
}

/// The writer's counters, shared with its request tasks.
pub struct WriteStats {
    pub acked_per_collection: Vec<AtomicU64>,
    pub acked: AtomicU64,
    pub refused: AtomicU64,
    pub requests: AtomicU64,
    pub failed_requests: AtomicU64,
    pub ack_latency_us: Histogram,
    pub first_failure: Mutex<Option<String>>,
    /// `(seq, request id)` of every acknowledged single-collection request.
    pub commit_order: Mutex<Vec<(u64, u64)>>,
}

impl WriteStats {
    pub fn new(n_collections: usize) -> WriteStats {
        WriteStats {
            acked_per_collection: (0..n_collections).map(|_| AtomicU64::new(0)).collect(),
            acked: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            ack_latency_us: Histogram::new(),
            first_failure: Mutex::new(None),
            commit_order: Mutex::new(Vec::new()),
        }
    }

    pub fn fail(&self, message: String) {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_failure.lock().expect("no panics while holding it");
        if first.is_none() {
            *first = Some(message);
        }
    }

    pub fn ack(&self, part: &WritePart) {
        self.acked_per_collection[part.collection as usize].fetch_add(part.n_updates, Ordering::Relaxed);
        self.acked.fetch_add(part.n_updates, Ordering::Relaxed);
    }

    pub fn account(&self, request: &WriteRequest, reply: HttpReply) {
        let (request_path, parts) = (request.path, &request.parts);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let n_updates: u64 = parts.iter().map(|part| part.n_updates).sum();
        if !request.multi_collection {
            let seq = serde_json::from_slice::<SingleBatchReply>(&reply.body).map(|parsed| parsed.seq);
            if let (200, Ok(seq)) = (reply.status, seq) {
                parts.iter().for_each(|part| self.ack(part));
                self.commit_order.lock().expect("no panics while holding it").push((seq, request.id));
            } else {
                self.refused.fetch_add(n_updates, Ordering::Relaxed);
                self.fail(format!("POST {request_path}: HTTP {}: {}", reply.status, reply.text()));
            }
            return;
        }
        // `POST /v1/batch` answers 200, or 422 with the same body when some part was refused.
        let results = match serde_json::from_slice::<MultiBatchReply>(&reply.body) {
            Ok(parsed) if (reply.status == 200 || reply.status == 422) && parsed.results.len() == parts.len() => {
                parsed.results
            }
            _ => {
                self.refused.fetch_add(n_updates, Ordering::Relaxed);
                self.fail(format!("POST {request_path}: HTTP {}: {}", reply.status, preview(&reply.body)));
                return;
            }
        };
        for (part, result) in parts.iter().zip(&results) {
            match (&result.seq, &result.error) {
                (Some(_), None) => self.ack(part),
                _ => {
                    self.refused.fetch_add(part.n_updates, Ordering::Relaxed);
                    self.fail(format!("POST {request_path}: part refused: {:?}", result.error));
                }
            }
        }
    }
}

/// How fast and how long the writer writes.
pub struct WritePace {
    pub rate: f64,
    pub duration: Duration,
    pub tick: Duration,
}

pub struct WriteSummary {
    pub generated: u64,
    pub stalled_ticks: u64,
    pub write_seconds: f64,
}

/// Sends `rate` updates per second for `duration`: at each tick, what is due
/// since the start goes out as one request on an idle connection. When none is
/// idle the updates wait for the next tick (and are stamped then), so a server
/// that cannot keep up shows as a lower achieved rate, not as writer-side delay.
pub async fn run_write_loop(
    pool: &mut HttpPool,
    source: &mut dyn UpdateSource,
    pace: WritePace,
    clock: Clock,
    stats: &Arc<WriteStats>,
    write_token: Option<Arc<str>>,
) -> WriteSummary {
    let WritePace { rate, duration, tick } = pace;
    let started = Instant::now();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut generated = 0u64;
    let mut stalled_ticks = 0u64;
    loop {
        interval.tick().await;
        let elapsed = started.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * rate) as u64;
        if due <= generated {
            continue;
        }
        let Some(mut connection) = pool.try_acquire() else {
            stalled_ticks += 1;
            continue;
        };
        let n_updates = ((due - generated) as usize).min(MAX_OPS_PER_REQUEST);
        let request = source.build_request(n_updates, clock.now_us());
        generated += request.paced_updates.unwrap_or_else(|| request.parts.iter().map(|part| part.n_updates).sum());
        let release = pool.releaser();
        let stats = Arc::clone(stats);
        let token = write_token.clone();
        tokio::spawn(async move {
            let mut request = request;
            let body = std::mem::take(&mut request.body);
            let sent = Instant::now();
            let reply = connection.request(Method::POST, request.path, body, token.as_deref()).await;
            let _ = release.send(connection);
            stats.ack_latency_us.record(sent.elapsed().as_micros() as u64);
            match reply {
                Ok(reply) => stats.account(&request, reply),
                Err(error) => {
                    let n_updates: u64 = request.parts.iter().map(|part| part.n_updates).sum();
                    stats.refused.fetch_add(n_updates, Ordering::Relaxed);
                    stats.fail(format!("POST {}: {error}", request.path));
                }
            }
        });
    }
    let write_seconds = started.elapsed().as_secs_f64();
    // Every request in flight is answered before anything is counted.
    let mut idle = Vec::with_capacity(pool.size);
    for _ in 0..pool.size {
        idle.push(pool.acquire().await);
    }
    for connection in idle {
        let _ = pool.releaser().send(connection);
    }
    WriteSummary { generated, stalled_ticks, write_seconds }
}

/// Update numbers a subscriber can see at most: everything the writer can send.
pub fn max_update_number(rate: f64, seconds: f64) -> u64 {
    (rate * (seconds + 1.0)) as u64 + MAX_OPS_PER_REQUEST as u64
}
