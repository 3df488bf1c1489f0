//! The demo's chat room list: its schema, a seeded generator of rooms and
//! messages, and `ordo load-demo`, which fills a running server through the public
//! HTTP API. `ordo serve --demo` writes the same rooms through the writer thread
//! (`crate::demo`).
//!
//! Names mix ASCII with accented Latin, Greek, Cyrillic and Japanese so that the
//! demo's case-insensitive search shows full Unicode case folding ("émile" finds
//! "Émile", "ωmega" finds "Ωmega").

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::rng::Rng;
use ordo_core::{FieldType, Schema};
use serde_json::{json, Value};

pub const ROOMS_COLLECTION: &str = "rooms";

/// The room list's fields, in schema order.
pub const ROOM_FIELDS: [(&str, FieldType); 6] = [
    ("name", FieldType::String),
    ("recency", FieldType::U64),
    ("unread", FieldType::U64),
    ("dm", FieldType::Bool),
    ("favourite", FieldType::Bool),
    ("owner", FieldType::String),
];

/// The demo's users: each room belongs to one, and the demo's access rule lets a
/// signed-in user read only their own rooms, so the two lists differ.
pub const DEMO_USERS: [&str; 2] = ["alice", "bob"];

/// Rooms per request: well inside `MAX_OPS_PER_REQUEST`.
pub const ROOMS_PER_BATCH: usize = 2_000;

/// How far back the generated rooms' last activity goes: 30 days, in ms.
const HISTORY_MS: u64 = 30 * 24 * 3_600 * 1_000;

const FIRST_NAMES: [&str; 48] = [
    "Aarav",
    "Beatriz",
    "Camille",
    "Dario",
    "Eleni",
    "Farid",
    "Greta",
    "Hiroshi",
    "Isabel",
    "Jonas",
    "Kasia",
    "Leila",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rania",
    "Sven",
    "Tomás",
    "Uma",
    "Vera",
    "Wiktor",
    "Yusuf",
    "Alice",
    "Bob",
    "Chloé",
    "Dmitri",
    "Émile",
    "Fatima",
    "Günther",
    "Hana",
    "Ivan",
    "Józef",
    "Kenji",
    "Łucja",
    "Zoë",
    "Søren",
    "Ingrid",
    "Noé",
    "Ωmega",
    "Ζωή",
    "Олег",
    "さくら",
    "Ángel",
    "Özlem",
    "Åsa",
    "Ünal",
];
const LAST_NAMES: [&str; 40] = [
    "Abbott",
    "Bianchi",
    "Castillo",
    "Delacroix",
    "Eriksen",
    "Fischer",
    "Gallagher",
    "Haddad",
    "Iglesias",
    "Jansen",
    "Kovač",
    "Lindqvist",
    "Moreau",
    "Nakamura",
    "O'Brien",
    "Petrov",
    "Quispe",
    "Rossi",
    "Sato",
    "Novák",
    "Ueda",
    "Varga",
    "Wójcik",
    "Yilmaz",
    "Martin",
    "Müller",
    "Nowak",
    "Dubois",
    "Tanaka",
    "Öztürk",
    "García",
    "Ångström",
    "Smith",
    "Kowalczyk",
    "Léger",
    "Иванова",
    "Papadopoulos",
    "Svensson",
    "Strauß",
    "東",
];
const TOPICS: [&str; 20] = [
    "general",
    "random",
    "design",
    "rust",
    "ops",
    "music",
    "books",
    "hiking",
    "café",
    "release",
    "bugs",
    "München",
    "東京 meetup",
    "Ωmega team",
    "Ελληνικά",
    "Москва",
    "crème brûlée",
    "Zürich",
    "naïve questions",
    "São Paulo",
];
const TEXTS: [&str; 16] = [
    "on my way 🚲",
    "sounds good",
    "déjà vu…",
    "can you review my PR?",
    "lunch at the café?",
    "the build is green again",
    "👍",
    "see you in München",
    "who broke the staging server?",
    "merci !",
    "お疲れさまです",
    "running 5 min late",
    "Ωmega is shipping today",
    "did anyone see the release notes?",
    "bis später",
    "haha",
];

/// One generated room, as the demo writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoRoom {
    pub id: String,
    pub name: String,
    pub recency_ms: u64,
    pub unread: u64,
    pub dm: bool,
    pub favourite: bool,
    pub owner: &'static str,
    pub last_message: String,
}

pub fn room_id(index: usize) -> String {
    format!("!room{index:06}:example.org")
}

/// The room list's schema.
pub fn rooms_schema() -> Schema {
    ROOM_FIELDS.iter().fold(Schema::new(), |schema, &(name, field_type)| schema.with_field(name, field_type))
}

fn rooms_schema_json() -> Value {
    let fields: Vec<Value> =
        ROOM_FIELDS.iter().map(|(name, field_type)| json!({"name": name, "type": field_type.name()})).collect();
    json!({ "fields": fields })
}

/// Room `index` of the demo; rooms are generated in order from one `rng`.
pub fn demo_room(index: usize, rng: &mut Rng, now_ms: u64) -> DemoRoom {
    let dm = rng.chance(35);
    let name = if dm { dm_name(index) } else { format!("{} {index}", *rng.pick(&TOPICS)) };
    DemoRoom {
        id: room_id(index),
        name,
        recency_ms: now_ms.saturating_sub(rng.below(HISTORY_MS)),
        unread: if rng.chance(25) { 1 + rng.below(9) } else { 0 },
        dm,
        favourite: rng.chance(10),
        owner: DEMO_USERS[rng.index(DEMO_USERS.len())],
        last_message: demo_message(rng),
    }
}

/// A person's name, distinct for every room index: the first 1 920 rooms pair
/// each first name with each last name once, later rounds add a middle initial.
/// (Names drawn at random repeated: sorted by name, the list opened with eight
/// rooms called "Alice Dubois".)
fn dm_name(index: usize) -> String {
    let first = FIRST_NAMES[index % FIRST_NAMES.len()];
    let last = LAST_NAMES[(index / FIRST_NAMES.len()) % LAST_NAMES.len()];
    match index / (FIRST_NAMES.len() * LAST_NAMES.len()) {
        0 => format!("{first} {last}"),
        round => format!("{first} {}. {last}", (b'A' + ((round - 1) % 26) as u8) as char),
    }
}

/// A chat line, "sender: text".
pub fn demo_message(rng: &mut Rng) -> String {
    format!("{}: {}", *rng.pick(&FIRST_NAMES), demo_text(rng))
}

/// A message's text alone.
pub fn demo_text(rng: &mut Rng) -> &'static str {
    TEXTS[rng.index(TEXTS.len())]
}

/// The payload of a room: `{"last_message": ...}`, as JSON text.
pub fn room_payload(last_message: &str) -> Vec<u8> {
    json!({ "last_message": last_message }).to_string().into_bytes()
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// The seed of the room generator: every demo has the same rooms.
pub const ROOMS_SEED: u64 = 0x2545_f491_4f6c_dd1d;

pub fn load_demo(address: &str, n_rooms: usize) -> Result<(), String> {
    let started = Instant::now();
    let (status, answer) = request(address, "PUT", "/v1/collections/rooms", &rooms_schema_json())?;
    if status >= 300 {
        return Err(format!("creating `rooms` failed: {status} {answer}"));
    }
    let mut rng = Rng::new(ROOMS_SEED);
    let now = now_ms();
    let mut loaded = 0;
    while loaded < n_rooms {
        let n = ROOMS_PER_BATCH.min(n_rooms - loaded);
        let ops: Vec<Value> = (loaded..loaded + n)
            .map(|index| {
                let room = demo_room(index, &mut rng, now);
                json!({"op": "upsert", "id": room.id, "fields": {
                    "name": room.name, "recency": room.recency_ms, "unread": room.unread,
                    "dm": room.dm, "favourite": room.favourite, "owner": room.owner,
                }, "payload": {"last_message": room.last_message}})
            })
            .collect();
        let (status, answer) = request(address, "POST", "/v1/collections/rooms/batch", &json!({"ops": ops}))?;
        if status >= 300 {
            return Err(format!("writing rooms failed: {status} {answer}"));
        }
        loaded += n;
        eprintln!("ordo load-demo: {loaded} of {n_rooms} rooms");
    }
    println!(
        "ordo load-demo: {n_rooms} rooms in collection `rooms` on {address} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One HTTP/1.1 request on a fresh connection (the demo loader needs nothing more).
fn request(address: &str, method: &str, path: &str, body: &Value) -> Result<(u16, String), String> {
    let body = body.to_string();
    let mut stream = TcpStream::connect(address).map_err(|error| format!("cannot reach {address}: {error}"))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or("a malformed HTTP response")?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_reproducible_and_include_non_ascii_names() {
        let generate = || {
            let mut rng = Rng::new(ROOMS_SEED);
            (0..2_000).map(|index| demo_room(index, &mut rng, 1_000_000_000_000)).collect::<Vec<_>>()
        };
        let rooms = generate();
        assert_eq!(rooms, generate());
        for wanted in ["Émile", "Łucja", "Günther", "München", "café", "東京", "Ωmega"] {
            assert!(rooms.iter().any(|room| room.name.contains(wanted)), "no room named with {wanted}");
        }
        assert!(rooms.iter().any(|room| room.dm) && rooms.iter().any(|room| !room.dm));
        assert!(rooms.iter().any(|room| room.favourite) && rooms.iter().any(|room| room.unread > 0));
        assert!(rooms.iter().all(|room| room.recency_ms <= 1_000_000_000_000));
        for user in DEMO_USERS {
            assert!(rooms.iter().filter(|room| room.owner == user).count() > 500, "{user} owns too few rooms");
        }
    }

    #[test]
    fn person_names_do_not_repeat() {
        let names: std::collections::HashSet<String> = (0..10_000).map(dm_name).collect();
        assert_eq!(names.len(), 10_000);
    }

    #[test]
    fn the_schema_has_the_room_fields_in_order() {
        let schema = rooms_schema();
        let names: Vec<&str> = schema.fields().iter().map(|field| field.name.as_str()).collect();
        assert_eq!(names, ["name", "recency", "unread", "dm", "favourite", "owner"]);
    }
}
