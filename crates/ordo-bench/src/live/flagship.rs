//! The flagship chat through the server (`loadgen --scenario flagship`): users
//! in shared rooms of Zipf sizes, each user's room list live. Two layouts of the
//! same chat, measured in the same run:
//!
//! - **rooms** (`FlagshipLayout::Rooms`): the flagship's — one shared `rooms`
//!   collection and one `members` item per (user, room), each user's subscriber
//!   on its memberships sorted by `room.recency` through the reference, under
//!   the flagship's rules. A message is one write, to its room.
//! - **fan-out** (`FlagshipLayout::FanOut`): a collection per user holding a
//!   copy of each of its rooms; a message is one write per member.
//!
//! Every message carries a global number (`msg`) and its send time in µs
//! (`recency`), so a subscriber counts each message once and measures its
//! latency, whichever layout carries it.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hyper::Method;

use super::chat::{chat_collection, chat_user, losses_against, ChatLosses};
use super::http::HttpPool;
use super::stats::XorShift64;
use super::subscriber::{SubscriberOutcome, UpdateMarks};
use super::writer::{UpdateSource, WritePart, WriteRequest, WriteStats};
use super::{Result, MAX_OPS_PER_REQUEST};

/// Zipf's exponent of room sizes and of which room gets a message.
pub const ROOM_ZIPF_EXPONENT: f64 = 1.1;
/// One "mark as read" per this many messages.
pub const MESSAGES_PER_READ_MARK: u64 = 10;
/// What each subscriber shows of its rooms.
pub const ROOMS_FIELDS: &str = r#"["read_upto","room.name","room.preview","room.last_seq","room.recency","room.msg"]"#;
pub const FAN_OUT_FIELDS: &str = r#"["name","preview","unread","recency","msg"]"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlagshipLayout {
    Rooms,
    FanOut,
}

/// Who is in which room: users pick rooms by a Zipf law, so a few rooms hold
/// nearly everybody and most hold few.
pub struct FlagshipChat {
    pub n_rooms: usize,
    pub rooms_of_user: Vec<Vec<u32>>,
    pub members_of_room: Vec<Vec<u32>>,
}

impl FlagshipChat {
    pub fn generate(n_users: usize, n_rooms: usize, rooms_per_user: usize, seed: u64) -> FlagshipChat {
        let zipf = ordo_server::demo::Zipf::new(n_rooms, ROOM_ZIPF_EXPONENT);
        let mut rng = XorShift64::new(seed ^ 0xF1A6);
        let rooms_per_user = rooms_per_user.min(n_rooms);
        let mut members_of_room = vec![Vec::new(); n_rooms];
        let mut rooms_of_user = Vec::with_capacity(n_users);
        for user in 0..n_users {
            let mut rooms: Vec<u32> = Vec::with_capacity(rooms_per_user);
            // Distinct rooms by rejection; past a bounded number of draws, the first rooms not taken.
            for _ in 0..rooms_per_user * 20 {
                if rooms.len() == rooms_per_user {
                    break;
                }
                let room = zipf.sample(unit(&mut rng)) as u32;
                if !rooms.contains(&room) {
                    rooms.push(room);
                }
            }
            for room in 0..n_rooms as u32 {
                if rooms.len() == rooms_per_user {
                    break;
                }
                if !rooms.contains(&room) {
                    rooms.push(room);
                }
            }
            for &room in &rooms {
                members_of_room[room as usize].push(user as u32);
            }
            rooms_of_user.push(rooms);
        }
        FlagshipChat { n_rooms, rooms_of_user, members_of_room }
    }

    pub fn n_memberships(&self) -> usize {
        self.rooms_of_user.iter().map(Vec::len).sum()
    }
}

fn unit(rng: &mut XorShift64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

pub fn room_id(room: usize) -> String {
    format!("!f{room:04}:example.org")
}

/// A user's membership of a room: its id in `members`.
pub fn membership_id(user: usize, room: usize) -> String {
    format!("{}:{}", chat_user(user), room_id(room))
}

pub fn flagship_marks(layout: FlagshipLayout) -> UpdateMarks {
    match layout {
        FlagshipLayout::Rooms => {
            UpdateMarks { number: |fields| fields.room_msg, stamp_us: |fields| fields.room_recency }
        }
        FlagshipLayout::FanOut => UpdateMarks { number: |fields| fields.msg, stamp_us: |fields| fields.recency },
    }
}

/// The rooms layout's set-up: `rooms`, then `members` (a `ref` to `rooms`).
pub async fn load_rooms_layout(pool: &mut HttpPool, chat: &FlagshipChat) -> Result<()> {
    let rooms = br#"{"fields":[{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"msg","type":"u64"},{"name":"last_seq","type":"u64"},{"name":"preview","type":"string"}]}"#;
    let members = br#"{"fields":[{"name":"owner","type":"string"},{"name":"room","type":"ref","target":"rooms"},{"name":"read_upto","type":"u64"}]}"#;
    pool.run_requests(1, |_| (Method::PUT, "/v1/collections/rooms".to_string(), rooms.to_vec()), None).await?;
    pool.run_requests(1, |_| (Method::PUT, "/v1/collections/members".to_string(), members.to_vec()), None).await?;
    let started = Instant::now();
    let n_rooms = chat.n_rooms;
    pool.run_requests(
        n_rooms.div_ceil(MAX_OPS_PER_REQUEST),
        |request| {
            let rooms = request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(n_rooms);
            let ops: Vec<String> = rooms
                .map(|room| {
                    format!(
                        r#"{{"op":"upsert","id":"{}","fields":{{"name":"Room {room}","recency":{room},"msg":0,"last_seq":0,"preview":""}}}}"#,
                        room_id(room)
                    )
                })
                .collect();
            (Method::POST, "/v1/collections/rooms/batch".to_string(), format!(r#"{{"ops":[{}]}}"#, ops.join(",")).into_bytes())
        },
        None,
    )
    .await?;
    let memberships: Vec<(usize, usize)> = chat
        .rooms_of_user
        .iter()
        .enumerate()
        .flat_map(|(user, rooms)| rooms.iter().map(move |&room| (user, room as usize)))
        .collect();
    pool.run_requests(
        memberships.len().div_ceil(MAX_OPS_PER_REQUEST),
        |request| {
            let chunk = &memberships
                [request * MAX_OPS_PER_REQUEST..((request + 1) * MAX_OPS_PER_REQUEST).min(memberships.len())];
            let mut body = String::with_capacity(chunk.len() * 120);
            body.push_str(r#"{"ops":["#);
            for (index, &(user, room)) in chunk.iter().enumerate() {
                if index > 0 {
                    body.push(',');
                }
                write!(
                    body,
                    r#"{{"op":"upsert","id":"{}","fields":{{"owner":"{}","room":"{}","read_upto":0}}}}"#,
                    membership_id(user, room),
                    chat_user(user),
                    room_id(room)
                )
                .expect("writing to a String");
            }
            body.push_str("]}");
            (Method::POST, "/v1/collections/members/batch".to_string(), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    println!(
        "  loaded {n_rooms} rooms and {} memberships in {:.2} s",
        memberships.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The fan-out layout's set-up: a collection per user with a copy of each of its rooms.
pub async fn load_fan_out_layout(pool: &mut HttpPool, chat: &FlagshipChat) -> Result<()> {
    let schema = br#"{"fields":[{"name":"name","type":"string"},{"name":"recency","type":"u64"},{"name":"msg","type":"u64"},{"name":"unread","type":"u64"},{"name":"preview","type":"string"}]}"#;
    let n_users = chat.rooms_of_user.len();
    pool.run_requests(
        n_users,
        |user| (Method::PUT, format!("/v1/collections/{}", chat_collection(user)), schema.to_vec()),
        None,
    )
    .await?;
    let started = Instant::now();
    pool.run_requests(
        n_users,
        |user| {
            let ops: Vec<String> = chat.rooms_of_user[user]
                .iter()
                .map(|&room| {
                    format!(
                        r#"{{"op":"upsert","id":"{}","fields":{{"name":"Room {room}","recency":{room},"msg":0,"unread":0,"preview":""}}}}"#,
                        room_id(room as usize)
                    )
                })
                .collect();
            let body = format!(r#"{{"ops":[{}]}}"#, ops.join(","));
            (Method::POST, format!("/v1/collections/{}/batch", chat_collection(user)), body.into_bytes())
        },
        Some("load"),
    )
    .await?;
    println!("  loaded {} room copies in {:.2} s", chat.n_memberships(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Messages to rooms picked by a Zipf law, with a read mark per ten messages.
pub struct FlagshipUpdates {
    layout: FlagshipLayout,
    rng: XorShift64,
    zipf: ordo_server::demo::Zipf,
    members_of_room: Vec<Vec<u32>>,
    last_seq: Vec<u64>,
    last_recency_us: Vec<u64>,
    next_msg: u64,
    messages_since_mark: u64,
    picked: Vec<u32>,
    /// Messages written so far (a fan-out message is one however many copies).
    pub n_messages: u64,
}

impl FlagshipUpdates {
    pub fn new(layout: FlagshipLayout, chat: &FlagshipChat, seed: u64) -> FlagshipUpdates {
        FlagshipUpdates {
            layout,
            rng: XorShift64::new(seed),
            zipf: ordo_server::demo::Zipf::new(chat.n_rooms, ROOM_ZIPF_EXPONENT),
            members_of_room: chat.members_of_room.clone(),
            last_seq: vec![0; chat.n_rooms],
            last_recency_us: vec![0; chat.n_rooms],
            next_msg: 0,
            messages_since_mark: 0,
            picked: Vec::new(),
            n_messages: 0,
        }
    }

    /// Distinct rooms for `n` messages: one message per room per request (two in
    /// one batch would be one change of a window, and the first would count as lost).
    fn pick_rooms(&mut self, n: usize) {
        self.picked.clear();
        let n = n.min(self.last_seq.len());
        for _ in 0..n * 20 {
            if self.picked.len() == n {
                break;
            }
            let room = self.zipf.sample(unit(&mut self.rng)) as u32;
            if !self.picked.contains(&room) {
                self.picked.push(room);
            }
        }
    }

    /// The message to `room`: its send time (strictly increasing per room) and numbers.
    fn stamp(&mut self, room: usize, now_us: u64) -> (u64, u64, u64) {
        let recency_us = now_us.max(self.last_recency_us[room] + 1);
        self.last_recency_us[room] = recency_us;
        self.last_seq[room] += 1;
        self.next_msg += 1;
        (recency_us, self.next_msg, self.last_seq[room])
    }

    /// A room's members whose copy a fan-out message writes: at most what one request takes.
    fn fits(&self, rooms: &[u32]) -> usize {
        let mut n_ops = 0;
        rooms
            .iter()
            .take_while(|&&room| {
                n_ops += self.members_of_room[room as usize].len();
                n_ops <= MAX_OPS_PER_REQUEST
            })
            .count()
            .max(1)
    }

    fn read_marks_request(&mut self) -> WriteRequest {
        let n_marks = (self.messages_since_mark / MESSAGES_PER_READ_MARK).max(1) as usize;
        self.messages_since_mark = 0;
        let mut ops = Vec::with_capacity(n_marks);
        let mut fan_out_user = 0;
        for _ in 0..n_marks {
            let room = self.rng.below(self.last_seq.len() as u64) as usize;
            let members = &self.members_of_room[room];
            if members.is_empty() {
                continue;
            }
            let user = members[self.rng.below(members.len() as u64) as usize] as usize;
            match self.layout {
                FlagshipLayout::Rooms => ops.push(format!(
                    r#"{{"op":"upsert","id":"{}","set_max":{{"read_upto":{}}}}}"#,
                    membership_id(user, room),
                    self.last_seq[room]
                )),
                FlagshipLayout::FanOut => {
                    // One user's copy per request: its own collection.
                    fan_out_user = user;
                    ops.push(format!(r#"{{"op":"upsert","id":"{}","fields":{{"unread":0}}}}"#, room_id(room)));
                    break;
                }
            }
        }
        let ops = ops.join(",");
        match self.layout {
            FlagshipLayout::Rooms => WriteRequest {
                id: 0,
                path: "/v1/collections/members/batch",
                body: format!(r#"{{"ops":[{ops}]}}"#).into_bytes(),
                parts: Vec::new(),
                multi_collection: false,
                paced_updates: None,
            },
            // A read mark counts as no message: one part of no updates.
            FlagshipLayout::FanOut => WriteRequest {
                id: 0,
                path: "/v1/batch",
                body: format!(r#"{{"writes":[{{"collection":"{}","ops":[{ops}]}}]}}"#, chat_collection(fan_out_user))
                    .into_bytes(),
                parts: vec![WritePart { collection: fan_out_user as u32, n_updates: 0 }],
                multi_collection: true,
                paced_updates: None,
            },
        }
    }

    /// A message to each picked room, as this layout writes it.
    fn messages_request(&mut self, now_us: u64) -> WriteRequest {
        match self.layout {
            FlagshipLayout::Rooms => self.rooms_request(now_us),
            FlagshipLayout::FanOut => self.fan_out_request(now_us),
        }
    }

    fn rooms_request(&mut self, now_us: u64) -> WriteRequest {
        let mut body = String::with_capacity(16 + self.picked.len() * 110);
        let mut parts = Vec::with_capacity(self.picked.len());
        body.push_str(r#"{"ops":["#);
        for index in 0..self.picked.len() {
            let room = self.picked[index] as usize;
            let (recency_us, msg, last_seq) = self.stamp(room, now_us);
            if index > 0 {
                body.push(',');
            }
            write!(
                body,
                r#"{{"op":"upsert","id":"{}","fields":{{"recency":{recency_us},"msg":{msg},"last_seq":{last_seq},"preview":"message {msg}"}}}}"#,
                room_id(room)
            )
            .expect("writing to a String");
            // Counted per room: each of its members' subscribers should see it.
            parts.push(WritePart { collection: room as u32, n_updates: 1 });
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

    fn fan_out_request(&mut self, now_us: u64) -> WriteRequest {
        let n_rooms = self.fits(&self.picked);
        self.picked.truncate(n_rooms);
        // Per user, the copies this request writes: one part per user collection.
        let mut copies: Vec<(u32, String)> = Vec::new();
        for index in 0..self.picked.len() {
            let room = self.picked[index] as usize;
            let (recency_us, msg, _) = self.stamp(room, now_us);
            for &user in &self.members_of_room[room] {
                let op = format!(
                    r#"{{"op":"upsert","id":"{}","fields":{{"recency":{recency_us},"msg":{msg},"preview":"message {msg}"}},"increment":{{"unread":1}}}}"#,
                    room_id(room)
                );
                copies.push((user, op));
            }
        }
        copies.sort_by_key(|(user, _)| *user);
        let mut body = String::with_capacity(16 + copies.len() * 140);
        let mut parts: Vec<WritePart> = Vec::new();
        body.push_str(r#"{"writes":["#);
        for (index, (user, op)) in copies.iter().enumerate() {
            let starts_part = parts.last().is_none_or(|part| part.collection != *user);
            if starts_part {
                if index > 0 {
                    body.push_str("]},");
                }
                write!(body, r#"{{"collection":"{}","ops":["#, chat_collection(*user as usize))
                    .expect("writing to a String");
                parts.push(WritePart { collection: *user, n_updates: 0 });
            } else {
                body.push(',');
            }
            body.push_str(op);
            parts.last_mut().expect("a part was started").n_updates += 1;
        }
        body.push_str(if copies.is_empty() { "]}" } else { "]}]}" });
        let paced_updates = Some(self.picked.len() as u64);
        WriteRequest { id: 0, path: "/v1/batch", body: body.into_bytes(), parts, multi_collection: true, paced_updates }
    }
}

impl FlagshipUpdates {
    /// One message to `room` alone, as the live phase writes it in this layout
    /// (counted as a message; no read mark in between).
    pub fn message_to(&mut self, room: usize) -> WriteRequest {
        self.picked.clear();
        self.picked.push(room as u32);
        let request = self.messages_request(0);
        self.n_messages += 1;
        request
    }
}

impl UpdateSource for FlagshipUpdates {
    fn build_request(&mut self, n_updates: usize, now_us: u64) -> WriteRequest {
        if self.messages_since_mark >= MESSAGES_PER_READ_MARK {
            return self.read_marks_request();
        }
        self.pick_rooms(n_updates.max(1));
        let request = self.messages_request(now_us);
        let n_messages = self.picked.len() as u64;
        self.n_messages += n_messages;
        self.messages_since_mark += n_messages;
        request
    }
}

/// The rooms layout's losses: subscriber `user` should have seen every
/// acknowledged message of each of its rooms (`stats` counts them per room).
pub fn rooms_layout_losses(outcomes: &[SubscriberOutcome], stats: &WriteStats, chat: &FlagshipChat) -> ChatLosses {
    losses_against(outcomes, |user| {
        chat.rooms_of_user[user]
            .iter()
            .map(|&room| stats.acked_per_collection[room as usize].load(Ordering::Relaxed))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_have_zipf_sizes_and_users_distinct_rooms() {
        let chat = FlagshipChat::generate(2_000, 100, 10, 1);
        assert_eq!(chat.n_memberships(), 20_000);
        assert!(chat.rooms_of_user.iter().all(|rooms| {
            let mut sorted = rooms.clone();
            sorted.sort_unstable();
            sorted.dedup();
            sorted.len() == 10
        }));
        let largest = chat.members_of_room.iter().map(Vec::len).max().unwrap();
        let median = {
            let mut sizes: Vec<usize> = chat.members_of_room.iter().map(Vec::len).collect();
            sizes.sort_unstable();
            sizes[50]
        };
        assert!(largest > 5 * median, "largest {largest}, median {median}");
    }

    #[test]
    fn a_fan_out_request_writes_one_copy_per_member_and_counts_them_per_user() {
        let chat = FlagshipChat::generate(50, 20, 5, 2);
        let mut updates = FlagshipUpdates::new(FlagshipLayout::FanOut, &chat, 3);
        let request = updates.build_request(4, 1_000);
        let n_copies: u64 = request.parts.iter().map(|part| part.n_updates).sum();
        let expected: usize = updates.picked.iter().map(|&room| chat.members_of_room[room as usize].len()).sum();
        assert_eq!(n_copies as usize, expected);
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body["writes"].as_array().unwrap().len(), request.parts.len());
    }

    #[test]
    fn a_message_to_one_room_is_one_write_or_one_copy_per_member() {
        let chat = FlagshipChat::generate(50, 20, 5, 2);
        let largest = (0..chat.n_rooms).max_by_key(|&room| chat.members_of_room[room].len()).unwrap();
        let mut rooms = FlagshipUpdates::new(FlagshipLayout::Rooms, &chat, 3);
        let request = rooms.message_to(largest);
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body["ops"].as_array().unwrap().len(), 1);
        assert_eq!(body["ops"][0]["id"], room_id(largest));
        let mut fan_out = FlagshipUpdates::new(FlagshipLayout::FanOut, &chat, 3);
        let request = fan_out.message_to(largest);
        let n_copies: u64 = request.parts.iter().map(|part| part.n_updates).sum();
        assert_eq!(n_copies as usize, chat.members_of_room[largest].len());
        assert_eq!((rooms.n_messages, fan_out.n_messages), (1, 1));
    }

    #[test]
    fn every_tenth_message_brings_a_read_mark() {
        let chat = FlagshipChat::generate(50, 20, 5, 2);
        let mut updates = FlagshipUpdates::new(FlagshipLayout::Rooms, &chat, 3);
        let first = updates.build_request(10, 1_000);
        assert_eq!(first.parts.len(), 10);
        let marks = updates.build_request(10, 2_000);
        assert!(marks.parts.is_empty() && marks.path == "/v1/collections/members/batch");
        let body: serde_json::Value = serde_json::from_slice(&marks.body).unwrap();
        assert_eq!(body["ops"].as_array().unwrap().len(), 1);
    }
}
