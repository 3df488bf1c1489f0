//! `leaderboard`: one collection of rooms, every subscriber on the same top of
//! it by `score`; about one update in five enters that top. Every subscriber must
//! receive each update that was in the window right after its batch.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::time::Instant;

use hyper::Method;
use ordo_bench::live::http::{metric, HttpPool};
use ordo_bench::live::phase::LiveResult;
use ordo_bench::live::stats::XorShift64;
use ordo_bench::live::subscriber::{SubscriberAuth, SubscriberSpec, UpdateMarks};
use ordo_bench::live::verify::verify_lists;
use ordo_bench::live::writer::{UpdateSource, WritePart, WriteRequest};
use ordo_bench::live::{Result, MAX_OPS_PER_REQUEST};
use ordo_server::auth::Role;

use crate::auth::{expect_forbidden, LEADERBOARD_RULES};
use crate::options::Options;
use crate::report::count_failures;
use crate::runner::Scenario;
use crate::server::Target;

/// Leaderboard: about one update in five gives a room a score that enters the
/// window, the others a random score below it.
pub struct LeaderboardUpdates {
    rng: XorShift64,
    initial_scores: Vec<i64>,
    scores: Vec<i64>,
    /// Every room in the server's order (score descending, then id, which is
    /// the room number zero-padded): the writer's own view of the ranking, to
    /// know what score enters the window.
    ranking: BTreeSet<(Reverse<i64>, u32)>,
    window_limit: usize,
    last_number: u64,
    n_entering: u64,
    /// Every request's updates `(number, room, score)`, by request id, to replay
    /// them in commit order at the end.
    requests: Vec<Vec<(u64, u32, i64)>>,
    picked: HashSet<u32>,
}

const LEADERBOARD_ENTERING_ONE_IN: u64 = 5;
const LEADERBOARD_INITIAL_SCORE_BOUND: u64 = 1_000_000;

fn leaderboard_ranking(scores: &[i64]) -> BTreeSet<(Reverse<i64>, u32)> {
    scores.iter().enumerate().map(|(room, &score)| (Reverse(score), room as u32)).collect()
}

fn last_in_window(ranking: &BTreeSet<(Reverse<i64>, u32)>, window_limit: usize) -> (Reverse<i64>, u32) {
    *ranking.iter().nth(window_limit - 1).expect("more rooms than the window holds")
}

impl LeaderboardUpdates {
    fn new(seed: u64, initial_scores: Vec<i64>, window_limit: usize) -> LeaderboardUpdates {
        LeaderboardUpdates {
            rng: XorShift64::new(seed),
            ranking: leaderboard_ranking(&initial_scores),
            scores: initial_scores.clone(),
            initial_scores,
            window_limit,
            last_number: 0,
            n_entering: 0,
            requests: Vec::new(),
            picked: HashSet::new(),
        }
    }

    /// The updates that were in the window right after their batch, found by
    /// replaying the requests in the order the server committed them (its
    /// `seq`s): a subscriber must receive each of them. Concurrent requests may
    /// commit in another order than they were made, so the writer's own
    /// ranking cannot tell; and an update pushed out again by a later one of
    /// its own batch need not show, since the server sends one window change
    /// per batch.
    fn visible_numbers(&self, commit_order: &[(u64, u64)]) -> Vec<u64> {
        let mut commit_order = commit_order.to_vec();
        commit_order.sort_unstable();
        let mut scores = self.initial_scores.clone();
        let mut ranking = leaderboard_ranking(&scores);
        let mut visible = Vec::new();
        for &(_, request_id) in &commit_order {
            let updates = &self.requests[request_id as usize];
            for &(_, room, score) in updates {
                ranking.remove(&(Reverse(scores[room as usize]), room));
                ranking.insert((Reverse(score), room));
                scores[room as usize] = score;
            }
            let last = last_in_window(&ranking, self.window_limit);
            // Rooms are distinct within a request: each still has its update's score.
            visible.extend(
                updates.iter().filter(|&&(_, room, score)| (Reverse(score), room) <= last).map(|&(number, ..)| number),
            );
        }
        visible
    }
}

impl UpdateSource for LeaderboardUpdates {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest {
        let n_rooms = self.scores.len();
        let n_updates = n_updates.min(n_rooms / 2).max(1);
        self.picked.clear();
        let mut updates = Vec::with_capacity(n_updates);
        let mut body = String::with_capacity(16 + n_updates * 100);
        body.push_str(r#"{"ops":["#);
        for index in 0..n_updates {
            let room = loop {
                let room = self.rng.below(n_rooms as u64) as u32;
                if self.picked.insert(room) {
                    break room;
                }
            };
            let top = self.ranking.first().map_or(0, |&(Reverse(score), _)| score);
            let (Reverse(last_in_window), _) = last_in_window(&self.ranking, self.window_limit);
            let score = if self.rng.below(LEADERBOARD_ENTERING_ONE_IN) == 0 {
                self.n_entering += 1;
                let spread = (top - last_in_window).max(0) as u64 + 1_000;
                last_in_window + 1 + self.rng.below(spread) as i64
            } else {
                self.rng.below(last_in_window.max(1) as u64) as i64
            };
            self.ranking.remove(&(Reverse(self.scores[room as usize]), room));
            self.ranking.insert((Reverse(score), room));
            self.scores[room as usize] = score;
            self.last_number += 1;
            updates.push((self.last_number, room, score));
            if index > 0 {
                body.push(',');
            }
            write!(
                body,
                r#"{{"op":"upsert","id":"!r{room:06}:example.org","fields":{{"score":{score},"sent_at":{now_us},"update":{}}}}}"#,
                self.last_number
            )
            .expect("writing to a String");
        }
        body.push_str("]}");
        self.requests.push(updates);
        WriteRequest {
            id: self.requests.len() as u64 - 1,
            path: "/v1/collections/leaderboard/batch",
            body: body.into_bytes(),
            parts: vec![WritePart { collection: 0, n_updates: n_updates as u64 }],
            multi_collection: false,
            paced_updates: None,
        }
    }
}

fn leaderboard_viewer(index: usize) -> String {
    format!("viewer-{index:04}")
}

fn leaderboard_marks() -> UpdateMarks {
    UpdateMarks { number: |fields| fields.update, stamp_us: |fields| fields.sent_at }
}

const SCHEMA: &[u8] = br#"{"fields":[{"name":"name","type":"string"},{"name":"score","type":"i64"},{"name":"sent_at","type":"u64"},{"name":"update","type":"u64"}]}"#;

/// The leaderboard scenario of one run.
pub struct Leaderboard {
    n_rooms: usize,
    n_subscribers: usize,
    window_limit: usize,
    seed: u64,
    /// The scores `load` wrote, where the update stream starts.
    initial_scores: Vec<i64>,
}

impl Leaderboard {
    pub fn new(options: &Options) -> Result<Leaderboard> {
        let window_limit = options.window_limit;
        if options.leaderboard_rooms < 2 * window_limit {
            return Err(format!("--leaderboard-rooms must be at least twice --window ({window_limit})").into());
        }
        Ok(Leaderboard {
            n_rooms: options.leaderboard_rooms,
            n_subscribers: options.leaderboard_subscribers,
            window_limit,
            seed: options.seed,
            initial_scores: Vec::new(),
        })
    }
}

impl Scenario for Leaderboard {
    type Updates = LeaderboardUpdates;

    fn name(&self) -> &'static str {
        "leaderboard"
    }

    fn header(&self, options: &Options) -> String {
        let (n_rooms, n_subscribers, window_limit) = (self.n_rooms, self.n_subscribers, self.window_limit);
        format!(
            "== leaderboard: {n_rooms} rooms; {n_subscribers} subscribers on the same top {window_limit} by score desc; {:.0} updates/s (1 in {LEADERBOARD_ENTERING_ONE_IN} enters the top) for {:.1} s ==",
            options.leaderboard_rate, options.seconds
        )
    }

    fn rate(&self, options: &Options) -> f64 {
        options.leaderboard_rate
    }

    fn n_subscribers(&self) -> usize {
        self.n_subscribers
    }

    fn n_collections(&self) -> usize {
        1
    }

    fn rules(&self) -> &'static str {
        LEADERBOARD_RULES
    }

    fn auth_note(&self) -> String {
        format!(
            "{} subscribers, each with its own reader token (sub `viewer-NNNN`) sent as an `auth` message; live writes with a writer token; set-up and checks as admin",
            self.n_subscribers
        )
    }

    async fn load(&mut self, pool: &mut HttpPool) -> Result<()> {
        pool.run_requests(1, |_| (Method::PUT, "/v1/collections/leaderboard".to_string(), SCHEMA.to_vec()), None)
            .await?;
        let started = Instant::now();
        let n_rooms = self.n_rooms;
        let mut rng = XorShift64::new(self.seed ^ 0x5C0E);
        let scores: Vec<i64> = (0..n_rooms).map(|_| rng.below(LEADERBOARD_INITIAL_SCORE_BOUND) as i64).collect();
        pool.run_requests(
            n_rooms.div_ceil(MAX_OPS_PER_REQUEST),
            |request| load_request(&scores, request),
            Some("load"),
        )
        .await?;
        let load_seconds = started.elapsed().as_secs_f64();
        println!("  loaded {n_rooms} rooms in {load_seconds:.2} s ({:.0} items/s)", n_rooms as f64 / load_seconds);
        self.initial_scores = scores;
        Ok(())
    }

    async fn check_rules(&self, pool: &mut HttpPool, target: &Target) -> Result<()> {
        let write = r#"{"ops":[{"op":"remove","id":"!r000000:example.org"}]}"#;
        let what = format!("reader `{}` writing to leaderboard", leaderboard_viewer(0));
        let token = target.token(&leaderboard_viewer(0), Role::Reader);
        expect_forbidden(pool, token, &what, "/v1/collections/leaderboard/batch", write).await
    }

    fn subscriber(&self, index: usize, target: &Target, max_update_number: u64) -> SubscriberSpec {
        SubscriberSpec {
            authority: target.authority.clone(),
            collection: "leaderboard".to_string(),
            sort_field: "score",
            window_limit: self.window_limit,
            marks: leaderboard_marks(),
            max_update_number,
            filter: None,
            fields: None,
            auth: target
                .token(&leaderboard_viewer(index), Role::Reader)
                .map(|token| SubscriberAuth { sub: leaderboard_viewer(index), token }),
        }
    }

    fn updates(&mut self) -> LeaderboardUpdates {
        LeaderboardUpdates::new(self.seed, std::mem::take(&mut self.initial_scores), self.window_limit)
    }

    async fn verify(&self, pool: &mut HttpPool, live: &LiveResult) -> Result<(usize, Option<String>)> {
        verify_lists(pool, &live.outcomes, |_| "leaderboard".to_string(), "score", self.window_limit).await
    }

    fn report_deliveries(&self, live: &LiveResult, source: &LeaderboardUpdates) {
        let n_subscribers = self.n_subscribers;
        let commit_order = live.stats.commit_order.lock().expect("no panics while holding it").clone();
        let visible_numbers = source.visible_numbers(&commit_order);
        let received: u64 = live.outcomes.iter().map(|outcome| outcome.seen.n_seen).sum();
        println!(
            "  per subscriber: {:.0} frames/s, {:.1} kB/s; on average {:.0} distinct updates seen; {} updates gave a top score, {} were in the window after their batch",
            live.delivered.frames as f64 / live.write.write_seconds / n_subscribers as f64,
            live.delivered.bytes as f64 / live.write.write_seconds / n_subscribers as f64 / 1e3,
            received as f64 / n_subscribers as f64,
            source.n_entering,
            visible_numbers.len(),
        );
        // Losses: updates in the window after their batch that a subscriber never
        // received; counted apart for subscriptions that got a Reset after the first.
        let (mut lost, mut n_without_reset, mut missing_with_reset, mut resets) = (0u64, 0u64, 0u64, 0u64);
        for outcome in &live.outcomes {
            let missing = visible_numbers.iter().filter(|&&number| !outcome.seen.contains(number)).count() as u64;
            resets += outcome.resets_after_first;
            if outcome.resets_after_first == 0 {
                n_without_reset += 1;
                lost += missing;
            } else {
                missing_with_reset += missing;
            }
        }
        count_failures(lost);
        println!(
            "  losses: {lost} (over {n_without_reset} subscriptions without a reset); announced resets: {resets} in {} subscriptions ({missing_with_reset} updates never received there)",
            n_subscribers as u64 - n_without_reset
        );
    }

    fn metric_names(&self) -> &'static [&'static str] {
        &[
            "ordo_frames_encoded_total",
            "ordo_frames_sent_total",
            "ordo_bytes_sent_total",
            "ordo_resets_slow_total",
            "ordo_batches_total",
        ]
    }

    fn report_extra(&self, live: &LiveResult) {
        let delta = |name: &str| {
            metric(&live.metrics_after, name)
                .zip(metric(&live.metrics_before, name))
                .map(|(after, before)| after - before)
        };
        if let (Some(encoded), Some(sent)) = (delta("ordo_frames_encoded_total"), delta("ordo_frames_sent_total")) {
            if encoded > 0.0 {
                println!("  frames sent per frame encoded: {:.1} (the subscribers share one window)", sent / encoded);
            }
        }
    }
}

/// Load request `request`: rooms `request * MAX_OPS_PER_REQUEST..` with their initial scores.
fn load_request(scores: &[i64], request: usize) -> (Method, String, Vec<u8>) {
    let rooms = request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(scores.len());
    let mut body = String::with_capacity(rooms.len() * 100);
    body.push_str(r#"{"ops":["#);
    for room in rooms.clone() {
        if room > rooms.start {
            body.push(',');
        }
        write!(
            body,
            r#"{{"op":"upsert","id":"!r{room:06}:example.org","fields":{{"name":"Room {room}","score":{},"sent_at":0,"update":0}}}}"#,
            scores[room]
        )
        .expect("writing to a String");
    }
    body.push_str("]}");
    (Method::POST, "/v1/collections/leaderboard/batch".to_string(), body.into_bytes())
}
