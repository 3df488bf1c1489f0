//! `shared-rooms`: every user's room list over rooms that many users share.
//!
//! `users` users each belong to [`ROOMS_PER_USER`] of `rooms` rooms, drawn by a
//! Zipf law (weight `1/k` for the room of rank `k`, without repetition within a
//! user), so a few rooms have tens of thousands of members and most have a few
//! hundred. Each user holds a top-20 window of their rooms, most recent first.
//! A message picks a room uniformly and gives it a new maximum recency and a new
//! ~200-byte preview: one target update.
//!
//! Systems, all on the same data and the same messages:
//! - `ordo` (with references): a shared `rooms` collection and one shared `members` collection
//!   (`owner`, `room` a reference to `rooms`, `unread`), each user's window
//!   `owner == user` sorted by `room.recency` desc; a message is one upsert in
//!   `rooms` (the layout chosen for reference fields, see `ARCHITECTURE.md`).
//! - `ordo-fan-out`: today's layout without references: one collection per user
//!   holding its own copy of each of its rooms; a message is one upsert per
//!   member (fan-out on write).
//! - `eyeball`: one `ObservableVector` + the room-list pipeline per user, each
//!   with its own copies; a message is one `set` per member. It keeps about
//!   90 KiB per user, so it runs only up to [`EYEBALL_USERS_MAX`] users.
//!
//! Figures per message (all of its diffs drained); extras: the mean lists a
//! message reaches, heap and RSS per membership (the growth while the system
//! builds its lists, the rooms' own data included for every system), and ns per
//! list update (total time over total lists reached).

use std::time::Duration;

use ordo_core::{Batch, CollectionId, Engine, FieldType, Filter, OwnedValue, Schema, SortKey, Value, ViewDef};

use crate::data::{generate_rooms, random_payload, Rng, Room, WINDOW_LIMIT};
use crate::harness::{time_ops, Measurement, MemProbe, OpPlan, Samples};
use crate::ordo_system::CountingSink;
use crate::peers::eyeball;
use crate::report::{Group, Outcome, Row};

/// Rooms each user is in.
pub const ROOMS_PER_USER: usize = 100;
/// Users and rooms of a full run (the sizes `SCENARIOS.md` defines).
pub const FULL_SIZES: [(usize, usize); 2] = [(10_000, 1_000), (100_000, 10_000)];
/// Users and rooms of a `--quick` run.
pub const QUICK_SIZES: [(usize, usize); 1] = [(2_000, 1_000)];
/// Past this many users, `eyeball` is not run (about 90 KiB per user).
pub const EYEBALL_USERS_MAX: usize = 20_000;
/// Systems of this scenario, in report order.
pub const SYSTEMS: [&str; 3] = ["ordo", "ordo-fan-out", "eyeball"];

/// The data set: rooms, who is in which, and the message stream.
#[derive(Debug, Clone)]
pub struct SharedRooms {
    /// The rooms (`is_local` and `left` false everywhere, so every system's room
    /// list is "recency desc" alone).
    pub rooms: Vec<Room>,
    /// Number of users.
    pub users: usize,
    /// `user_rooms[u * ROOMS_PER_USER + p]`: the room at position `p` of user `u`.
    pub user_rooms: Vec<u32>,
    /// Members of room `r`: `(user, position)` pairs in
    /// `members[member_start[r]..member_start[r + 1]]`.
    pub member_start: Vec<u32>,
    /// See `member_start`.
    pub members: Vec<(u32, u32)>,
}

impl SharedRooms {
    /// The rooms of user `u`, by position.
    pub fn rooms_of(&self, user: usize) -> &[u32] {
        &self.user_rooms[user * ROOMS_PER_USER..(user + 1) * ROOMS_PER_USER]
    }

    /// The `(user, position)` pairs of room `r`.
    pub fn members_of(&self, room: usize) -> &[(u32, u32)] {
        &self.members[self.member_start[room] as usize..self.member_start[room + 1] as usize]
    }

    /// Number of memberships (`users × ROOMS_PER_USER`).
    pub fn memberships(&self) -> usize {
        self.user_rooms.len()
    }
}

/// One new message: its room gets `recency` (a new maximum) and `preview`.
#[derive(Debug, Clone)]
pub struct Message {
    /// Index into `rooms`.
    pub room: u32,
    /// Larger than every recency before it.
    pub recency: u64,
    /// The new ~200-byte preview.
    pub preview: Vec<u8>,
}

/// Generates the data set (deterministic for its arguments). `rooms` must be at
/// least `ROOMS_PER_USER`.
pub fn generate(users: usize, rooms: usize, seed: u64) -> SharedRooms {
    assert!(rooms >= ROOMS_PER_USER, "every user needs {ROOMS_PER_USER} distinct rooms");
    let mut room_data = generate_rooms(rooms, seed);
    for room in &mut room_data {
        room.is_local = false;
        room.left = false;
    }
    let mut rng = Rng::derived(seed, "shared-rooms");
    // Zipf over a random ranking of the rooms: rank k has weight 1/k.
    let mut ranking: Vec<u32> = (0..rooms as u32).collect();
    rng.shuffle(&mut ranking);
    let mut total = 0.0;
    let cdf: Vec<f64> = (0..rooms)
        .map(|k| {
            total += 1.0 / (k as f64 + 1.0);
            total
        })
        .collect();
    let mut user_rooms = Vec::with_capacity(users * ROOMS_PER_USER);
    let mut taken = vec![u32::MAX; rooms];
    for user in 0..users {
        let mut n_taken = 0;
        while n_taken < ROOMS_PER_USER {
            let u = rng.unit_f64() * total;
            let rank = cdf.partition_point(|&c| c <= u).min(rooms - 1);
            let room = ranking[rank];
            // Without repetition: a room already in this user's list is drawn again.
            if taken[room as usize] != user as u32 {
                taken[room as usize] = user as u32;
                user_rooms.push(room);
                n_taken += 1;
            }
        }
    }
    let mut member_start = vec![0u32; rooms + 1];
    for &room in &user_rooms {
        member_start[room as usize + 1] += 1;
    }
    for room in 0..rooms {
        member_start[room + 1] += member_start[room];
    }
    let mut fill = member_start.clone();
    let mut members = vec![(0u32, 0u32); user_rooms.len()];
    for (k, &room) in user_rooms.iter().enumerate() {
        let at = &mut fill[room as usize];
        members[*at as usize] = ((k / ROOMS_PER_USER) as u32, (k % ROOMS_PER_USER) as u32);
        *at += 1;
    }
    SharedRooms { rooms: room_data, users, user_rooms, member_start, members }
}

/// `count` messages, each in a room drawn uniformly.
pub fn generate_messages(data: &SharedRooms, count: usize, seed: u64) -> Vec<Message> {
    let mut rng = Rng::derived(seed, "shared-rooms-messages");
    let recency_max = data.rooms.iter().map(|room| room.recency).max().unwrap_or(0);
    (0..count)
        .map(|k| Message {
            room: rng.below(data.rooms.len() as u64) as u32,
            recency: recency_max + 1 + k as u64,
            preview: random_payload(&mut rng),
        })
        .collect()
}

/// The plan: every system times the same messages (no time budget cuts one
/// short), so their figures cover the same rooms.
pub fn plan(quick: bool) -> OpPlan {
    let n_messages = if quick { 40 } else { 300 };
    OpPlan { warmup: 10, min_ops: n_messages, max_ops: n_messages, budget: Duration::from_secs(3_600) }
}

fn member_id(user: usize, room: u32) -> String {
    format!("u{user:07}/r{room:07}")
}

fn user_name(user: usize) -> String {
    format!("u{user:07}")
}

/// The room list of `user` in the shared membership collection.
pub fn refs_room_list(user: &str) -> ViewDef {
    ViewDef::new(Filter::eq("owner", OwnedValue::Str(user.to_owned())), vec![SortKey::desc("room.recency")])
}

/// Adds the per-message figures shared by every system.
fn finish(samples: &Samples, data: &SharedRooms, messages: &[Message], memory: (f64, Option<f64>)) -> Measurement {
    let timed = samples.first_index..samples.first_index + samples.len();
    let lists: usize = messages[timed].iter().map(|m| data.members_of(m.room as usize).len()).sum();
    let ns_total: u64 = samples.ns.iter().sum();
    let mut m = samples
        .measurement(true)
        .with_extra("lists_per_message", lists as f64 / samples.len().max(1) as f64)
        .with_extra("ns_per_list_update", ns_total as f64 / lists.max(1) as f64)
        .with_extra("heap_bytes_per_membership", memory.0);
    if let Some(rss) = memory.1 {
        m = m.with_extra("rss_bytes_per_membership", rss);
    }
    m
}

/// `ordo`, with references: see the module documentation.
pub fn ordo_refs(data: &SharedRooms, messages: &[Message], plan: &OpPlan) -> Option<Measurement> {
    let probe = MemProbe::start();
    let mut engine = Engine::new();
    let mut sink = CountingSink::default();
    let mut batch = Batch::new();
    let rooms_schema = Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64);
    let rooms = engine.create_collection("rooms", rooms_schema).ok()?;
    for chunk in data.rooms.chunks(10_000) {
        batch.clear();
        for room in chunk {
            batch
                .upsert(&room.id)
                .set("name", Value::Str(&room.name))
                .set("recency", Value::U64(room.recency))
                .payload(&room.payload);
        }
        engine.apply_batch(rooms, &batch, &mut sink).ok()?;
    }
    let members_schema = Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("room", FieldType::Ref(rooms))
        .with_field("unread", FieldType::U64);
    let members = engine.create_collection("members", members_schema).ok()?;
    for users in (0..data.users).collect::<Vec<_>>().chunks(1_000) {
        batch.clear();
        for &user in users {
            let owner = user_name(user);
            for &room in data.rooms_of(user) {
                batch
                    .upsert(&member_id(user, room))
                    .set("owner", Value::Str(&owner))
                    .set("room", Value::Str(&data.rooms[room as usize].id))
                    .set("unread", Value::U64(0));
            }
        }
        engine.apply_batch(members, &batch, &mut sink).ok()?;
    }
    for user in 0..data.users {
        let window = engine.open_window(members, &refs_room_list(&user_name(user)), 0, WINDOW_LIMIT, &mut sink).ok()?;
        engine.prepare_window(window).ok()?;
    }
    sink.take();
    let memory = probe.per_unit(data.memberships());
    let room_ids: Vec<&str> = data.rooms.iter().map(|room| room.id.as_str()).collect();
    let samples = time_ops(plan, |i| {
        let message = &messages[i];
        batch.clear();
        batch
            .upsert(room_ids[message.room as usize])
            .set("recency", Value::U64(message.recency))
            .payload(&message.preview);
        engine.apply_batch(rooms, &batch, &mut sink).expect("valid message");
        (sink.take(), ())
    });
    Some(finish(&samples, data, messages, (memory.heap, memory.rss)))
}

/// `ordo-fan-out`: see the module documentation.
pub fn ordo_fan_out(data: &SharedRooms, messages: &[Message], plan: &OpPlan) -> Option<Measurement> {
    use crate::data::RoomFilter;
    use crate::ordo_system::{add_rooms, room_list_def, room_schema};
    let probe = MemProbe::start();
    let mut engine = Engine::new();
    let mut sink = CountingSink::default();
    let mut batch = Batch::new();
    let def = room_list_def(RoomFilter::NotLeft);
    let mut collections: Vec<CollectionId> = Vec::with_capacity(data.users);
    for user in 0..data.users {
        let collection = engine.create_collection(&user_name(user), room_schema()).ok()?;
        batch.clear();
        add_rooms(&mut batch, data.rooms_of(user).iter().map(|&room| &data.rooms[room as usize]));
        engine.apply_batch(collection, &batch, &mut sink).ok()?;
        let window = engine.open_window(collection, &def, 0, WINDOW_LIMIT, &mut sink).ok()?;
        engine.prepare_window(window).ok()?;
        collections.push(collection);
    }
    sink.take();
    let memory = probe.per_unit(data.memberships());
    let samples = time_ops(plan, |i| {
        let message = &messages[i];
        let room_id = &data.rooms[message.room as usize].id;
        for &(user, _position) in data.members_of(message.room as usize) {
            batch.clear();
            batch.upsert(room_id).set("recency", Value::U64(message.recency)).payload(&message.preview);
            engine.apply_batch(collections[user as usize], &batch, &mut sink).expect("valid message");
        }
        (sink.take(), ())
    });
    Some(finish(&samples, data, messages, (memory.heap, memory.rss)))
}

/// `eyeball`: see the module documentation.
pub fn eyeball_lists(data: &SharedRooms, messages: &[Message], plan: &OpPlan) -> Option<Measurement> {
    use crate::data::RoomFilter;
    use eyeball::{drain, limit_channel, room_list, RoomItem};
    use std::sync::Arc;
    let probe = MemProbe::start();
    let mut lists: Vec<_> = (0..data.users)
        .map(|user| {
            let mut vector = eyeball_im::ObservableVector::new();
            vector.append(
                data.rooms_of(user).iter().map(|&room| RoomItem::from_room(&data.rooms[room as usize])).collect(),
            );
            let (handle, limits) = limit_channel();
            let (_window, stream) = room_list(&vector, RoomFilter::NotLeft, WINDOW_LIMIT, limits);
            (vector, stream, handle)
        })
        .collect();
    let memory = probe.per_unit(data.memberships());
    let samples = time_ops(plan, |i| {
        let message = &messages[i];
        let mut n_diffs = 0;
        for &(user, position) in data.members_of(message.room as usize) {
            let (vector, stream, _) = &mut lists[user as usize];
            let mut item = vector[position as usize].clone();
            item.recency = message.recency;
            item.preview = Arc::from(&message.preview[..]);
            vector.set(position as usize, item);
            n_diffs += drain(stream);
        }
        (n_diffs, ())
    });
    Some(finish(&samples, data, messages, (memory.heap, memory.rss)))
}

/// Runs the scenario at every size of the mode for the chosen systems.
pub fn run(quick: bool, systems: &[&'static str], seed: u64, emit: &mut dyn FnMut(Group)) {
    let sizes: &[(usize, usize)] = if quick { &QUICK_SIZES } else { &FULL_SIZES };
    for &(users, n_rooms) in sizes {
        eprintln!("[shared-rooms] {users} users × {ROOMS_PER_USER} of {n_rooms} rooms: generating…");
        let data = generate(users, n_rooms, seed);
        let plan = plan(quick);
        let messages = generate_messages(&data, plan.inputs(), seed);
        let sizes: Vec<usize> = (0..n_rooms).map(|room| data.members_of(room).len()).collect();
        eprintln!(
            "  room sizes: max {}, mean {:.0}, median {}",
            sizes.iter().max().unwrap_or(&0),
            data.memberships() as f64 / n_rooms as f64,
            {
                let mut sorted = sizes.clone();
                sorted.sort_unstable();
                sorted[sorted.len() / 2]
            }
        );
        let rows = systems
            .iter()
            .map(|&system| {
                let start = std::time::Instant::now();
                let outcome = match system {
                    "ordo" => ordo_refs(&data, &messages, &plan),
                    "ordo-fan-out" => ordo_fan_out(&data, &messages, &plan),
                    _ if users > EYEBALL_USERS_MAX => {
                        let row = Row {
                            system,
                            outcome: Outcome::NotMeasured(format!(
                                "n/a: ~90 KiB per user's pipeline, run up to {EYEBALL_USERS_MAX} users"
                            )),
                        };
                        return row;
                    }
                    _ => eyeball_lists(&data, &messages, &plan),
                };
                eprintln!("  shared-rooms users={users} {system}: {:.1} s", start.elapsed().as_secs_f64());
                Row {
                    system,
                    outcome: match outcome {
                        Some(m) => Outcome::Measured(m),
                        None => Outcome::NotMeasured("failed".into()),
                    },
                }
            })
            .collect();
        emit(Group { scenario: "shared-rooms", n: users, dist: format!("{n_rooms}-rooms"), rows });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::WindowId;

    #[test]
    fn memberships_are_distinct_per_user_and_indexed_both_ways() {
        let data = generate(300, 1_000, 3);
        assert_eq!(data.memberships(), 300 * ROOMS_PER_USER);
        for user in 0..data.users {
            let mut rooms = data.rooms_of(user).to_vec();
            rooms.sort_unstable();
            rooms.dedup();
            assert_eq!(rooms.len(), ROOMS_PER_USER, "a room twice in user {user}'s list");
        }
        for room in 0..data.rooms.len() {
            for &(user, position) in data.members_of(room) {
                assert_eq!(data.rooms_of(user as usize)[position as usize], room as u32);
            }
        }
        // Zipf: the largest room is far above the mean.
        let largest = (0..data.rooms.len()).map(|room| data.members_of(room).len()).max().unwrap();
        assert!(largest > 2 * data.memberships() / data.rooms.len());
    }

    /// Every system sees the same lists: after the same messages, each user's
    /// top 20 in the references layout equals the naive answer.
    #[test]
    fn refs_windows_equal_a_naive_join() {
        let data = generate(200, 150, 4);
        let messages = generate_messages(&data, 50, 4);
        let mut recency: Vec<u64> = data.rooms.iter().map(|room| room.recency).collect();
        for message in &messages {
            recency[message.room as usize] = message.recency;
        }
        let plan = OpPlan { warmup: 0, min_ops: 50, max_ops: 50, budget: Duration::from_secs(60) };
        let measurement = ordo_refs(&data, &messages, &plan).expect("runs");
        assert!(measurement.diffs_per_op.unwrap() > 0.0);
        // The same engine calls, then the windows read back and compared.
        let mut engine = Engine::new();
        let rooms_schema = Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64);
        let rooms = engine.create_collection("rooms", rooms_schema).unwrap();
        let mut batch = Batch::new();
        let mut sink = CountingSink::default();
        for room in &data.rooms {
            batch.upsert(&room.id).set("name", Value::Str(&room.name)).set("recency", Value::U64(room.recency));
        }
        engine.apply_batch(rooms, &batch, &mut sink).unwrap();
        let schema = Schema::new().with_field("owner", FieldType::String).with_field("room", FieldType::Ref(rooms));
        let members = engine.create_collection("members", schema).unwrap();
        batch.clear();
        for user in 0..data.users {
            for &room in data.rooms_of(user) {
                batch
                    .upsert(&member_id(user, room))
                    .set("owner", Value::Str(&user_name(user)))
                    .set("room", Value::Str(&data.rooms[room as usize].id));
            }
        }
        engine.apply_batch(members, &batch, &mut sink).unwrap();
        let windows: Vec<WindowId> = (0..data.users)
            .map(|user| engine.open_window(members, &refs_room_list(&user_name(user)), 0, 20, &mut sink).unwrap())
            .collect();
        for message in &messages {
            batch.clear();
            batch.upsert(&data.rooms[message.room as usize].id).set("recency", Value::U64(message.recency));
            engine.apply_batch(rooms, &batch, &mut sink).unwrap();
        }
        for (user, &window) in windows.iter().enumerate() {
            let mut expected: Vec<(u64, String)> =
                data.rooms_of(user).iter().map(|&room| (recency[room as usize], member_id(user, room))).collect();
            expected.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let expected: Vec<String> = expected.into_iter().take(20).map(|(_, id)| id).collect();
            let got: Vec<String> = engine.window_items(window).unwrap().into_iter().map(|item| item.id).collect();
            assert_eq!(got, expected, "user {user}");
        }
    }
}
