//! The demo's chat, generated from a seed: who is in which room, and each room's
//! last few messages. Pure data: `seed` writes it, the simulator and
//! `POST /demo/send` pick from it.
//!
//! The shape is a real chat service's: direct messages between two people, small
//! groups, a few large rooms and one room with everybody, so that a new message
//! moves one room in a handful of lists or in every list. The named users
//! (`alice`, `bob`, ...) share some rooms and not others, which is what the page
//! shows side by side.

use crate::demo_data::{dm_name, TOPICS};
use crate::rng::Rng;

/// The users a person can sign in as on the page.
pub const NAMED_USERS: [&str; 8] = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"];
/// Users nobody signs in as: they make the rooms as crowded as a real service's.
pub const GENERATED_USERS: usize = 2_000;
/// Rooms every named-user group gets: (topic, members by index into `NAMED_USERS`).
const NAMED_GROUPS: [(&str, &[usize]); 6] = [
    ("Weekend hike", &[0, 1, 2]),
    ("Release crew", &[0, 1, 3, 4]),
    ("Book club", &[1, 3, 5]),
    ("Café Zürich", &[0, 2, 4, 6]),
    ("東京 meetup", &[2, 5, 6, 7]),
    ("Ωmega team", &[0, 3, 7]),
];
/// Large rooms: (name, one generated user in N joins).
const LARGE_ROOMS: [(&str, usize); 3] = [("Announcements", 2), ("Rust", 3), ("Random", 4)];
/// Generated rooms each named user joins besides its own, so its list scrolls.
const EXTRA_ROOMS_PER_NAMED_USER: usize = 40;
/// Messages seeded per room: opening any room shows some history.
pub const SEEDED_MESSAGES: u64 = 4;
pub const CHAT_SEED: u64 = 0x2545_f491_4f6c_dd1d;

/// One room and its members (indexes into `Chat::users`).
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRoom {
    pub id: String,
    pub name: String,
    pub dm: bool,
    pub members: Vec<u32>,
}

/// The whole generated chat.
#[derive(Debug, PartialEq)]
pub struct Chat {
    pub users: Vec<String>,
    pub rooms: Vec<ChatRoom>,
}

pub fn room_id(index: usize) -> String {
    format!("!room{index:06}:example.org")
}

/// A membership's item id: one per (user, room).
pub fn membership_id(user: &str, room: &str) -> String {
    format!("{user}:{room}")
}

/// A message's item id: the room's id and the message's number in it.
pub fn message_id(room: &str, seq: u64) -> String {
    format!("{room}#{seq:08}")
}

impl Chat {
    /// The chat with `n_rooms` rooms (the special rooms first, then generated
    /// ones), the same for the same `n_rooms`.
    pub fn generate(n_rooms: usize) -> Chat {
        let mut rng = Rng::new(CHAT_SEED);
        let mut users: Vec<String> = NAMED_USERS.iter().map(|user| (*user).to_owned()).collect();
        users.extend((1..=GENERATED_USERS).map(|index| format!("user{index:04}")));
        let mut rooms: Vec<ChatRoom> = Vec::new();
        let add = |rooms: &mut Vec<ChatRoom>, name: String, dm: bool, members: Vec<u32>| {
            if rooms.len() < n_rooms {
                rooms.push(ChatRoom { id: room_id(rooms.len()), name, dm, members });
            }
        };
        add(&mut rooms, "Everyone".to_owned(), false, (0..users.len() as u32).collect());
        for (first, first_name) in NAMED_USERS.iter().enumerate() {
            for (second, second_name) in NAMED_USERS.iter().enumerate().skip(first + 1) {
                let name = format!("{first_name} & {second_name}");
                add(&mut rooms, name, true, vec![first as u32, second as u32]);
            }
        }
        for (name, named) in NAMED_GROUPS {
            let mut members: Vec<u32> = named.iter().map(|&index| index as u32).collect();
            let n_generated = 3 + rng.index(8);
            members.extend(generated_sample(&mut rng, n_generated));
            add(&mut rooms, name.to_owned(), false, dedup(members));
        }
        for (name, one_in) in LARGE_ROOMS {
            let first_generated = NAMED_USERS.len() as u32;
            let members = (first_generated..users.len() as u32).filter(|_| rng.index(one_in) == 0);
            add(&mut rooms, name.to_owned(), false, members.collect());
        }
        let n_special = rooms.len();
        for index in n_special..n_rooms {
            let dm = rng.chance(35);
            let size = if dm { 2 } else { 3 + rng.index(28) };
            let name = if dm { dm_name(index) } else { format!("{} {index}", rng.pick(&TOPICS)) };
            add(&mut rooms, name, dm, dedup(generated_sample(&mut rng, size)));
        }
        let mut chat = Chat { users, rooms };
        chat.add_named_users_to_generated_rooms(&mut rng, n_special);
        chat
    }

    fn add_named_users_to_generated_rooms(&mut self, rng: &mut Rng, n_special: usize) {
        let n_generated = self.rooms.len().saturating_sub(n_special);
        if n_generated == 0 {
            return;
        }
        for user in 0..NAMED_USERS.len() as u32 {
            // Draws land on DMs and on rooms joined already: a bounded number of tries.
            let mut joined = 0;
            for _ in 0..4 * EXTRA_ROOMS_PER_NAMED_USER {
                let room = &mut self.rooms[n_special + rng.index(n_generated)];
                if !room.dm && !room.members.contains(&user) {
                    room.members.push(user);
                    joined += 1;
                    if joined == EXTRA_ROOMS_PER_NAMED_USER {
                        break;
                    }
                }
            }
        }
    }

    /// How many memberships the chat has.
    pub fn n_memberships(&self) -> usize {
        self.rooms.iter().map(|room| room.members.len()).sum()
    }
}

fn generated_sample(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| (NAMED_USERS.len() + rng.index(GENERATED_USERS)) as u32).collect()
}

fn dedup(mut members: Vec<u32>) -> Vec<u32> {
    members.sort_unstable();
    members.dedup();
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rooms_of<'a>(chat: &'a Chat, user: &str) -> Vec<&'a ChatRoom> {
        let index = chat.users.iter().position(|name| name == user).unwrap() as u32;
        chat.rooms.iter().filter(|room| room.members.contains(&index)).collect()
    }

    #[test]
    fn the_chat_is_reproducible_and_has_every_kind_of_room() {
        let chat = Chat::generate(2_000);
        assert_eq!(chat, Chat::generate(2_000));
        assert_eq!(chat.rooms.len(), 2_000);
        assert_eq!(chat.rooms[0].members.len(), chat.users.len(), "one room holds every user");
        assert!(chat.rooms.iter().any(|room| room.dm && room.members.len() == 2));
        assert!(chat.rooms.iter().any(|room| room.members.len() > 500), "a large room");
        assert!(chat.rooms.iter().all(|room| !room.members.is_empty()));
        let ids: std::collections::HashSet<&str> = chat.rooms.iter().map(|room| room.id.as_str()).collect();
        assert_eq!(ids.len(), chat.rooms.len());
    }

    #[test]
    fn alice_and_bob_share_some_rooms_and_not_others() {
        let chat = Chat::generate(2_000);
        let alice: Vec<&str> = rooms_of(&chat, "alice").iter().map(|room| room.id.as_str()).collect();
        let bob: Vec<&str> = rooms_of(&chat, "bob").iter().map(|room| room.id.as_str()).collect();
        let shared = alice.iter().filter(|id| bob.contains(id)).count();
        assert!(shared >= 3 && shared < alice.len() && shared < bob.len(), "{shared} of {alice:?} / {bob:?}");
        let dm = chat.rooms.iter().find(|room| room.name == "alice & bob").unwrap();
        assert!(dm.dm && dm.members == [0, 1], "carol is not in alice and bob's DM");
        assert!(alice.len() > 40, "alice's list scrolls: {}", alice.len());
    }

    #[test]
    fn a_small_chat_keeps_its_room_count() {
        for n in [1, 10, 44, 45, 300] {
            assert_eq!(Chat::generate(n).rooms.len(), n);
        }
    }
}
