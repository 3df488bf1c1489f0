//! The chat scenario: a collection per user (or one shared collection), each
//! user's subscriber on its top rooms by `recency`; the writer moves random
//! rooms of random users to the top of their lists.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hyper::Method;

use super::http::HttpPool;
use super::stats::XorShift64;
use super::subscriber::{SubscriberOutcome, UpdateMarks};
use super::writer::{UpdateSource, WritePart, WriteRequest, WriteStats};
use super::{Result, MAX_OPS_PER_REQUEST};

/// Chat: random rooms of random users move to the top of their user's list.
pub struct ChatUpdates {
    rng: XorShift64,
    n_rooms: usize,
    /// Per collection: the last update's number (sent as `unread`, which thus
    /// only grows) and its `recency`.
    last_number: Vec<u64>,
    last_recency_us: Vec<u64>,
    picked: HashSet<(u32, u32)>,
    updates: Vec<(u32, u32)>,
    layout: ChatLayout,
}

impl ChatUpdates {
    pub fn new(seed: u64, n_collections: usize, n_rooms: usize, layout: ChatLayout) -> ChatUpdates {
        ChatUpdates {
            layout,
            rng: XorShift64::new(seed),
            n_rooms,
            last_number: vec![0; n_collections],
            last_recency_us: vec![0; n_collections],
            picked: HashSet::new(),
            updates: Vec::new(),
        }
    }
}

impl UpdateSource for ChatUpdates {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest {
        // A room appears at most once per request: two updates of one room in a
        // batch are one change of the window, and the first would count as lost.
        let n_collections = self.last_number.len();
        let n_updates = n_updates.min(n_collections * self.n_rooms / 2).max(1);
        self.picked.clear();
        self.updates.clear();
        while self.updates.len() < n_updates {
            let collection = self.rng.below(n_collections as u64) as u32;
            let room = self.rng.below(self.n_rooms as u64) as u32;
            if self.picked.insert((collection, room)) {
                self.updates.push((collection, room));
            }
        }
        self.updates.sort_unstable();
        if self.layout == ChatLayout::Shared {
            return self.build_shared_request(now_us);
        }

        let mut body = String::with_capacity(64 + n_updates * 90);
        let mut parts: Vec<WritePart> = Vec::new();
        body.push_str(r#"{"writes":["#);
        for index in 0..self.updates.len() {
            let (collection, room) = self.updates[index];
            let starts_part = parts.last().is_none_or(|part| part.collection != collection);
            if starts_part {
                if index > 0 {
                    body.push_str("]},");
                }
                write!(body, r#"{{"collection":"user-{collection:04}","ops":["#).expect("writing to a String");
                parts.push(WritePart { collection, n_updates: 0 });
            } else {
                body.push(',');
            }
            let (recency_us, number) = self.next_stamp(collection as usize, now_us);
            write!(
                body,
                r#"{{"op":"upsert","id":"!r{room:04}:example.org","fields":{{"recency":{recency_us},"unread":{number}}}}}"#
            )
            .expect("writing to a String");
            parts.last_mut().expect("a part was started").n_updates += 1;
        }
        body.push_str("]}]}");
        WriteRequest {
            id: 0,
            path: "/v1/batch",
            body: body.into_bytes(),
            parts,
            multi_collection: true,
            paced_updates: None,
        }
    }
}

impl ChatUpdates {
    /// The next update of user `slot`'s list: its recency, strictly increasing
    /// within the list so the room always moves to the top, and its number.
    fn next_stamp(&mut self, slot: usize, now_us: u64) -> (u64, u64) {
        let recency_us = now_us.max(self.last_recency_us[slot] + 1);
        self.last_recency_us[slot] = recency_us;
        self.last_number[slot] += 1;
        (recency_us, self.last_number[slot])
    }

    /// `chat-shared`: the picked updates as one batch of the collection `rooms`.
    pub fn build_shared_request(&mut self, now_us: u64) -> WriteRequest {
        let mut body = String::with_capacity(16 + self.updates.len() * 90);
        let mut parts: Vec<WritePart> = Vec::new();
        body.push_str(r#"{"ops":["#);
        for index in 0..self.updates.len() {
            let (collection, room) = self.updates[index];
            if index > 0 {
                body.push(',');
            }
            // `parts` only counts each user's updates: the request is one batch.
            if parts.last().is_none_or(|part| part.collection != collection) {
                parts.push(WritePart { collection, n_updates: 0 });
            }
            let slot = collection as usize;
            let (recency_us, number) = self.next_stamp(slot, now_us);
            write!(
                body,
                r#"{{"op":"upsert","id":"{}","fields":{{"recency":{recency_us},"unread":{number}}}}}"#,
                shared_room_id(slot, room as usize)
            )
            .expect("writing to a String");
            parts.last_mut().expect("a part was started").n_updates += 1;
        }
        body.push_str("]}");
        WriteRequest {
            id: 0,
            path: "/v1/collections/rooms/batch",
            body: body.into_bytes(),
            parts,
            multi_collection: false,
            paced_updates: None,
        }
    }
}

pub fn chat_collection(index: usize) -> String {
    format!("user-{index:04}")
}

/// With `--auth`: the chat user whose collection is `chat_collection(index)`,
/// the `sub` of its subscriber's token (the rules bind `user-{sub}`).
pub fn chat_user(index: usize) -> String {
    format!("{index:04}")
}

/// Where chat lives: a collection per user, or one for all (`chat-shared`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ChatLayout {
    PerUser,
    Shared,
}

/// chat-shared: room `room` of user `user`, unique in `rooms`.
pub fn shared_room_id(user: usize, room: usize) -> String {
    format!("!u{user:04}r{room:04}:example.org")
}

/// chat-shared: the rows of user `index`, as its own filter (JSON).
pub fn owner_filter(index: usize) -> String {
    format!(r#"{{"field":"owner","op":"eq","value":"{}"}}"#, chat_user(index))
}

pub fn chat_marks() -> UpdateMarks {
    UpdateMarks { number: |fields| fields.unread, stamp_us: |fields| fields.recency }
}

/// Chat's set-up: a collection per user, then every user's rooms.
pub async fn load_chat(pool: &mut HttpPool, n_collections: usize, n_rooms: usize, seed: u64) -> Result<()> {
    let started = Instant::now();
    let schema = br#"{"fields":[{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"unread","type":"u64"}]}"#;
    pool.run_requests(
        n_collections,
        |index| (Method::PUT, format!("/v1/collections/{}", chat_collection(index)), schema.to_vec()),
        None,
    )
    .await?;
    println!("  created {n_collections} collections in {:.2} s", started.elapsed().as_secs_f64());

    // Whole collections per request, as many as fit in one request's op limit.
    let started = Instant::now();
    let collections_per_request = (MAX_OPS_PER_REQUEST / n_rooms).max(1);
    let n_requests = n_collections.div_ceil(collections_per_request);
    let mut rng = XorShift64::new(seed ^ 0x10AD);
    pool.run_requests(
        n_requests,
        |request| {
            let first = request * collections_per_request;
            let last = (first + collections_per_request).min(n_collections);
            let mut body = String::with_capacity((last - first) * n_rooms * 90);
            body.push_str(r#"{"writes":["#);
            for collection in first..last {
                if collection > first {
                    body.push(',');
                }
                write!(body, r#"{{"collection":"{}","ops":["#, chat_collection(collection)).expect("writing to a String");
                for room in 0..n_rooms {
                    if room > 0 {
                        body.push(',');
                    }
                    // Small recencies: every update (stamped in µs since the start) is newer.
                    write!(
                        body,
                        r#"{{"op":"upsert","id":"!r{room:04}:example.org","fields":{{"name":"Room {room}","recency":{},"unread":0}}}}"#,
                        rng.below(1_000)
                    )
                    .expect("writing to a String");
                }
                body.push_str("]}");
            }
            body.push_str("]}");
            (Method::POST, "/v1/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    let load_seconds = started.elapsed().as_secs_f64();
    let n_items = n_collections * n_rooms;
    println!("  loaded {n_items} rooms in {load_seconds:.2} s ({:.0} items/s)", n_items as f64 / load_seconds);
    Ok(())
}

/// chat-shared's set-up: one collection `rooms`, every user's rooms in it.
pub async fn load_shared_chat(pool: &mut HttpPool, n_users: usize, n_rooms: usize, seed: u64) -> Result<()> {
    let schema = br#"{"fields":[{"name":"owner","type":"string"},{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"unread","type":"u64"}]}"#;
    pool.run_requests(1, |_| (Method::PUT, "/v1/collections/rooms".to_string(), schema.to_vec()), None).await?;
    let started = Instant::now();
    let n_items = n_users * n_rooms;
    let mut rng = XorShift64::new(seed ^ 0x10AD);
    pool.run_requests(
        n_items.div_ceil(MAX_OPS_PER_REQUEST),
        |request| {
            let items = request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(n_items);
            let mut body = String::with_capacity(items.len() * 110);
            body.push_str(r#"{"ops":["#);
            for item in items.clone() {
                if item > items.start {
                    body.push(',');
                }
                let (user, room) = (item / n_rooms, item % n_rooms);
                write!(
                    body,
                    r#"{{"op":"upsert","id":"{}","fields":{{"owner":"{}","name":"Room {room}","recency":{},"unread":0}}}}"#,
                    shared_room_id(user, room),
                    chat_user(user),
                    rng.below(1_000)
                )
                .expect("writing to a String");
            }
            body.push_str("]}");
            (Method::POST, "/v1/collections/rooms/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    let load_seconds = started.elapsed().as_secs_f64();
    println!("  loaded {n_items} rooms in {load_seconds:.2} s ({:.0} items/s)", n_items as f64 / load_seconds);
    Ok(())
}

/// Chat's losses: acknowledged updates a user's subscriber never received.
pub struct ChatLosses {
    /// Over the users whose subscription got no Reset after its first frame.
    pub lost: u64,
    /// Received but never acknowledged (a write whose answer was lost).
    pub extra: u64,
    /// Users whose subscription got a Reset after its first frame, the updates
    /// written to them and those of them never received: a Reset announces a
    /// possible gap (the engine also sends one when it is shorter than the
    /// diffs, not only to slow consumers), so these are shown apart.
    pub reset_collections: u64,
    pub written_in_reset_collections: u64,
    pub missing_in_reset_collections: u64,
    /// Resets after the first frame, over all subscriptions.
    pub resets: u64,
}

/// `outcomes[i]` is the subscriber of user `i`; `stats` the writer's counters.
pub fn chat_losses(outcomes: &[SubscriberOutcome], stats: &WriteStats) -> ChatLosses {
    chat_losses_of(outcomes, stats, |subscriber| subscriber)
}

/// [`chat_losses`] where subscriber `i` watches collection `collection_of(i)`
/// (several subscribers per collection).
pub fn chat_losses_of(
    outcomes: &[SubscriberOutcome],
    stats: &WriteStats,
    collection_of: impl Fn(usize) -> usize,
) -> ChatLosses {
    losses_against(outcomes, |subscriber| stats.acked_per_collection[collection_of(subscriber)].load(Ordering::Relaxed))
}

/// The losses when subscriber `i` should have received `written_of(i)` updates.
pub fn losses_against(outcomes: &[SubscriberOutcome], written_of: impl Fn(usize) -> u64) -> ChatLosses {
    let mut losses = ChatLosses {
        lost: 0,
        extra: 0,
        reset_collections: 0,
        written_in_reset_collections: 0,
        missing_in_reset_collections: 0,
        resets: 0,
    };
    for (subscriber, outcome) in outcomes.iter().enumerate() {
        let written = written_of(subscriber);
        let missing = written.saturating_sub(outcome.seen.n_seen);
        if outcome.resets_after_first > 0 {
            losses.reset_collections += 1;
            losses.written_in_reset_collections += written;
            losses.missing_in_reset_collections += missing;
        } else {
            losses.lost += missing;
        }
        losses.extra += outcome.seen.n_seen.saturating_sub(written);
        losses.resets += outcome.resets_after_first;
    }
    losses
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::subscriber::SeenUpdates;

    /// A subscriber that received `seen` of the update numbers 1.. and got
    /// `resets` Resets after its first frame.
    fn outcome(seen: u64, resets: u64) -> SubscriberOutcome {
        let mut numbers = SeenUpdates { words: Vec::new(), n_seen: 0, max_number: 1_000 };
        for number in 1..=seen {
            numbers.insert(number).expect("below max_number");
        }
        SubscriberOutcome {
            list: Vec::new(),
            seen: numbers,
            resets_after_first: resets,
            seq_gaps: 0,
            protocol_errors: 0,
            error_frames: 0,
            subscribed: true,
            closed: None,
            first_problem: None,
        }
    }

    #[test]
    fn losses_count_unseen_acknowledged_updates_apart_from_announced_resets() {
        let stats = WriteStats::new(4);
        for (collection, acked) in [(0u32, 3u64), (1, 5), (2, 4), (3, 1)] {
            stats.ack(&WritePart { collection, n_updates: acked });
        }
        // User 0 saw everything; user 1 misses 3 with no reset (lost); user 2
        // misses 3 after a Reset (shown apart); user 3 saw 2 of 1 written (extra).
        let outcomes = [outcome(3, 0), outcome(2, 0), outcome(1, 2), outcome(2, 0)];
        let losses = chat_losses(&outcomes, &stats);
        assert_eq!(losses.lost, 3);
        assert_eq!(losses.reset_collections, 1);
        assert_eq!(losses.written_in_reset_collections, 4);
        assert_eq!(losses.missing_in_reset_collections, 3);
        assert_eq!(losses.resets, 2);
        assert_eq!(losses.extra, 1);
    }
}
