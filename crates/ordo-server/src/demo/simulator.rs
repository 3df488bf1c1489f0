//! The traffic simulator: members of the chat write messages into rooms picked
//! by a Zipf law (a few rooms are very busy, most are quiet), through the demo's
//! backend like any app server, so subscribers see ordinary diffs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::watch;

use super::chat::{Chat, NAMED_USERS};
use super::Demo;
use crate::demo_data;
use crate::error::ApiError;
use crate::limits;
use crate::rng::Rng;

/// Zipf's exponent: rank 1 gets about 2.1 times the messages of rank 2.
pub const ZIPF_EXPONENT: f64 = 1.1;
/// How often the simulator writes; each tick's messages go in one write.
const TICK: Duration = Duration::from_millis(50);
const SIMULATOR_SEED: u64 = 0x0dd5_eed5;

/// A Zipf(s) sampler over ranks `0..n`: rank `k` has weight `1 / (k + 1)^s`.
/// The cumulative table is computed once; a sample is one binary search.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// `n` is at least 1.
    pub fn new(n: usize, exponent: f64) -> Zipf {
        assert!(n >= 1, "a Zipf law needs at least one rank");
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|rank| {
                total += ((rank + 1) as f64).powf(-exponent);
                total
            })
            .collect();
        for value in &mut cdf {
            *value /= total;
        }
        Zipf { cdf }
    }

    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The rank for `unit`, a uniform number in [0, 1).
    pub fn sample(&self, unit: f64) -> usize {
        // Rounding can leave the last entry a hair under 1.0: clamp to the last rank.
        self.cdf.partition_point(|&cumulative| cumulative <= unit).min(self.cdf.len() - 1)
    }
}

/// The simulator's controls, shared with the HTTP handlers.
#[derive(Debug)]
pub struct Simulator {
    rate: AtomicU32,
    sent: AtomicU64,
}

impl Simulator {
    pub fn new(rate: u32) -> Result<Simulator, ApiError> {
        check_rate(rate.into())?;
        Ok(Simulator { rate: AtomicU32::new(rate), sent: AtomicU64::new(0) })
    }

    pub fn rate(&self) -> u32 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Messages written (acknowledged) since start.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, rate: u32) {
        self.rate.store(rate, Ordering::Relaxed);
    }

    /// `GET /demo/simulator`
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::json!({"rate": self.rate(), "sent": self.sent()})
    }
}

fn check_rate(rate: u64) -> Result<u32, ApiError> {
    if rate > u64::from(limits::MAX_DEMO_MESSAGES_PER_SECOND) {
        return Err(ApiError::bad_request(format!(
            "the simulator's rate is {rate} messages/s; it is 0..={}",
            limits::MAX_DEMO_MESSAGES_PER_SECOND
        )));
    }
    Ok(rate as u32)
}

/// The body of `POST /demo/simulator`: `{"rate": N}`, N in 0..=MAX_DEMO_MESSAGES_PER_SECOND.
pub fn parse_rate_request(body: &[u8]) -> Result<u32, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RateRequest {
        rate: u64,
    }
    let request: RateRequest = crate::strict_json::parse(body, "the body")?;
    check_rate(request.rate)
}

/// Rank -> room index: the rooms of the users one can sign in as first, then
/// the others, each part in a seeded shuffle. So the lists people look at on
/// the page move every few seconds even at the default rate (the head of a
/// Zipf law takes most messages), while the generated users' rooms stay quiet.
fn rooms_by_rank(chat: &Chat, rng: &mut Rng) -> Vec<usize> {
    let named = |room: &&usize| chat.rooms[**room].members.iter().any(|&member| (member as usize) < NAMED_USERS.len());
    let all: Vec<usize> = (0..chat.rooms.len()).collect();
    let (mut seen, mut quiet): (Vec<usize>, Vec<usize>) = all.iter().partition(named);
    for part in [&mut seen, &mut quiet] {
        for index in (1..part.len()).rev() {
            part.swap(index, rng.below(index as u64 + 1) as usize);
        }
    }
    seen.extend(quiet);
    seen
}

/// Writes `--demo-rate` messages per second until shutdown.
pub async fn run(demo: Arc<Demo>, mut shutdown: watch::Receiver<bool>) {
    let n_rooms = demo.chat.rooms.len();
    if n_rooms == 0 {
        return;
    }
    let mut rng = Rng::new(SIMULATOR_SEED);
    let zipf = Zipf::new(n_rooms, ZIPF_EXPONENT);
    let by_rank = rooms_by_rank(&demo.chat, &mut rng);
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = Instant::now();
    let mut credit = 0.0f64;
    let mut last_error_printed: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        let now = Instant::now();
        // A stall (a slow commit) must not turn into a burst afterwards.
        let elapsed = now.duration_since(last_tick).min(Duration::from_secs(1));
        last_tick = now;
        let rate = demo.simulator.rate();
        if rate == 0 {
            credit = 0.0;
            continue;
        }
        credit = (credit + f64::from(rate) * elapsed.as_secs_f64()).min(limits::MAX_DEMO_MESSAGES_PER_TICK as f64);
        let n_messages = credit as usize;
        if n_messages == 0 {
            continue;
        }
        credit -= n_messages as f64;
        let messages: Vec<(usize, &str, &str)> = (0..n_messages)
            .map(|_| {
                let room = by_rank[zipf.sample(rng.unit())];
                let members = &demo.chat.rooms[room].members;
                let author = &demo.chat.users[members[rng.index(members.len())] as usize];
                (room, author.as_str(), demo_data::demo_text(&mut rng))
            })
            .collect();
        match demo.write_messages(&messages).await {
            Ok(_) => {
                demo.simulator.sent.fetch_add(n_messages as u64, Ordering::Relaxed);
            }
            Err(error) => {
                // The simulator is the one writer not answered over HTTP: its refusals count here.
                crate::metrics::add(&crate::metrics::METRICS.batches_refused, 1);
                // A full store refuses every write: say so now and then, not 20 times a second.
                if last_error_printed.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(code = error.code.as_str(), "the demo simulator's write was refused: {error}");
                    last_error_printed = Some(Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_stays_in_range_and_favours_the_head() {
        let n = 10_000;
        let zipf = Zipf::new(n, ZIPF_EXPONENT);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; n];
        for _ in 0..200_000 {
            let rank = zipf.sample(rng.unit());
            assert!(rank < n);
            counts[rank] += 1;
        }
        // The first 10 ranks together get far more than the last 1 000.
        let head: u32 = counts[..10].iter().sum();
        let tail: u32 = counts[n - 1_000..].iter().sum();
        assert!(head > 10 * tail, "head {head}, tail {tail}");
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{:?}", &counts[..10]);
        // Rank 1 over rank 2 should be near 2^1.1 ≈ 2.14.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.8..2.5).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn zipf_edges() {
        let one = Zipf::new(1, ZIPF_EXPONENT);
        assert_eq!(one.sample(0.0), 0);
        assert_eq!(one.sample(0.999_999_999), 0);
        let zipf = Zipf::new(100, ZIPF_EXPONENT);
        assert_eq!(zipf.sample(0.0), 0);
        assert_eq!(zipf.sample(1.0 - f64::EPSILON), 99);
        assert_eq!(zipf.sample(1.0), 99, "clamped even past the table");
    }

    #[test]
    fn the_rate_is_checked_at_its_limit() {
        assert_eq!(parse_rate_request(br#"{"rate":0}"#), Ok(0));
        assert_eq!(parse_rate_request(br#"{"rate":5000}"#), Ok(limits::MAX_DEMO_MESSAGES_PER_SECOND));
        for bad in
            [r#"{"rate":5001}"#, r#"{"rate":-1}"#, r#"{"rate":1.5}"#, r#"{"rate":"5"}"#, r#"{}"#, r#"{"rate":1,"x":2}"#]
        {
            let error = parse_rate_request(bad.as_bytes()).unwrap_err();
            assert_eq!(error.code, crate::error::ErrorCode::BadRequest, "{bad}: {error}");
        }
        assert_eq!(parse_rate_request(b"{").unwrap_err().code, crate::error::ErrorCode::BadJson);
        assert!(Simulator::new(limits::MAX_DEMO_MESSAGES_PER_SECOND + 1).is_err());
    }

    #[test]
    fn the_ranks_are_a_permutation_with_the_rooms_people_see_first() {
        let chat = Chat::generate(1_000);
        let by_rank = rooms_by_rank(&chat, &mut Rng::new(1));
        let has_named =
            |room: usize| chat.rooms[room].members.iter().any(|&member| (member as usize) < NAMED_USERS.len());
        let first_quiet = by_rank.iter().position(|&room| !has_named(room)).unwrap();
        assert!(first_quiet > 100 && by_rank[first_quiet..].iter().all(|&room| !has_named(room)));
        let mut sorted = by_rank.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1_000).collect::<Vec<_>>());
    }
}
