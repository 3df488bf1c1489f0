//! The demo chat's collections and their items as write ops: their schemas, the
//! names and lines the generator draws from, and `ordo load-demo`, which fills a
//! running server through the public HTTP API. `ordo serve --demo` writes the same
//! chat through the writer (`crate::demo`).
//!
//! Names mix ASCII with accented Latin, Greek, Cyrillic and Japanese so that the
//! demo's case-insensitive search shows full Unicode case folding ("émile" finds
//! "Émile", "ωmega" finds "Ωmega").

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::rng::Rng;
use serde_json::{json, Value};

pub const ROOMS: &str = "rooms";
pub const MEMBERS: &str = "members";
pub const MESSAGES: &str = "messages";

/// Each collection's fields, in schema order, with their wire types; the one
/// `ref` field targets `rooms`.
pub const ROOM_FIELDS: [(&str, &str); 5] =
    [("name", "string"), ("recency", "u64"), ("last_seq", "u64"), ("preview", "string"), ("dm", "bool")];
pub const MEMBER_FIELDS: [(&str, &str); 4] =
    [("owner", "string"), ("room", "ref"), ("read_upto", "u64"), ("favourite", "bool")];
pub const MESSAGE_FIELDS: [(&str, &str); 5] =
    [("room", "string"), ("seq", "u64"), ("author", "string"), ("text", "string"), ("time", "u64")];
/// The collections in creation order (a `ref` target before its referrers).
pub const COLLECTIONS: [(&str, &[(&str, &str)]); 3] =
    [(ROOMS, &ROOM_FIELDS), (MEMBERS, &MEMBER_FIELDS), (MESSAGES, &MESSAGE_FIELDS)];

/// A collection's fields as `PUT /v1/collections/{name}` takes them.
pub fn fields_json(fields: &[(&str, &str)]) -> Value {
    let field = |&(name, field_type): &(&str, &str)| match field_type {
        "ref" => json!({"name": name, "type": "ref", "target": ROOMS}),
        other => json!({"name": name, "type": other}),
    };
    Value::Array(fields.iter().map(field).collect())
}

/// Ops per write: well inside `MAX_OPS_PER_REQUEST`.
pub const OPS_PER_WRITE: usize = 2_000;

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
pub const TOPICS: [&str; 20] = [
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

/// A person's name, distinct for every room index: the first 1 920 rooms pair
/// each first name with each last name once, later rounds add a middle initial.
pub fn dm_name(index: usize) -> String {
    let first = FIRST_NAMES[index % FIRST_NAMES.len()];
    let last = LAST_NAMES[(index / FIRST_NAMES.len()) % LAST_NAMES.len()];
    match index / (FIRST_NAMES.len() * LAST_NAMES.len()) {
        0 => format!("{first} {last}"),
        round => format!("{first} {}. {last}", (b'A' + ((round - 1) % 26) as u8) as char),
    }
}

/// A message's text alone.
pub fn demo_text(rng: &mut Rng) -> &'static str {
    TEXTS[rng.index(TEXTS.len())]
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// The seed of the room generator: every demo has the same rooms.
pub const ROOMS_SEED: u64 = 0x2545_f491_4f6c_dd1d;

/// `ordo load-demo`: the demo chat with `n_rooms` rooms, through the HTTP API of
/// the server at `address` (without auth, or the writes are refused).
pub fn load_demo(address: &str, n_rooms: usize) -> Result<(), String> {
    let started = Instant::now();
    for (name, fields) in COLLECTIONS {
        let body = json!({"fields": fields_json(fields)});
        let (status, answer) = request(address, "PUT", &format!("/v1/collections/{name}"), &body)?;
        if status >= 300 {
            return Err(format!("creating `{name}` failed: {status} {answer}"));
        }
    }
    let chat = crate::demo::chat::Chat::generate(n_rooms);
    let writes = crate::demo::seed::chat_writes(&chat, now_ms());
    for (done, write) in writes.iter().enumerate() {
        let (status, answer) = request(address, "POST", "/v1/batch", write)?;
        if status >= 300 {
            return Err(format!("writing the chat failed: {status} {answer}"));
        }
        eprintln!("ordo load-demo: {} of {} writes", done + 1, writes.len());
    }
    println!(
        "ordo load-demo: {n_rooms} rooms, {} memberships and their messages on {address} in {:.1} s",
        chat.n_memberships(),
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
    fn person_names_do_not_repeat() {
        let names: std::collections::HashSet<String> = (0..10_000).map(dm_name).collect();
        assert_eq!(names.len(), 10_000);
    }

    #[test]
    fn a_ref_field_comes_after_its_target_collection() {
        let position = |name: &str| COLLECTIONS.iter().position(|(collection, _)| *collection == name).unwrap();
        assert!(position(ROOMS) < position(MEMBERS));
        assert_eq!(MEMBER_FIELDS.iter().filter(|(_, field_type)| *field_type == "ref").count(), 1);
        for (_, fields) in COLLECTIONS {
            assert!(fields
                .iter()
                .all(|(_, field_type)| *field_type == "ref" || crate::wire::parse_field_type(field_type).is_some()));
        }
    }
}
