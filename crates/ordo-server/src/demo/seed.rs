//! The demo chat written at start: its three collections created if missing
//! (and checked if present), the generated chat written into an empty `rooms`,
//! and the flagship's access rules installed.

use serde_json::{json, Value as Json};

use super::backend::Backend;
use super::chat::{membership_id, message_id, Chat, SEEDED_MESSAGES};
use crate::demo_data::{self, COLLECTIONS, MEMBERS, MESSAGES, OPS_PER_WRITE, ROOMS};
use crate::rng::Rng;
use crate::routing::CollectionEntry;
use ordo_core::FieldType;

/// How far back a generated room's last message goes: 30 days, in ms.
const HISTORY_MS: u64 = 30 * 24 * 3_600 * 1_000;
/// Between two seeded messages of a room.
const SEEDED_MESSAGE_GAP_MS: u64 = 7 * 60 * 1_000;

/// The rules of the flagship (docs/SECURITY.md): each reader reads its own
/// memberships, the rooms only through them, and the messages of its rooms; it
/// may mark its memberships read and favourite, nothing else.
pub fn flagship_rules() -> Json {
    let own = json!({"field": "owner", "op": "eq", "value": "$sub"});
    json!({"rules": [
        {"collection": MEMBERS, "roles": ["reader"], "read": {"filter": own},
         "write": {"filter": own, "fields": ["read_upto", "favourite"], "atomics": ["set_max"],
                   "payload": false, "create": false, "remove": false}},
        {"collection": ROOMS, "roles": ["reader"], "read": {"through": format!("{MEMBERS}.room")}},
        {"collection": MESSAGES, "roles": ["reader"],
         "read": {"related": {"field": "room", "to": format!("{MEMBERS}.room")}}},
    ]})
}

/// The collections, created or checked; `true` when `rooms` is empty (the chat is then written).
pub async fn prepare_collections(backend: &Backend) -> Result<bool, String> {
    for (name, fields) in COLLECTIONS {
        let entry = match backend.entry(name) {
            Some(entry) => entry,
            None => backend.create_collection(name, demo_data::fields_json(fields)).await?,
        };
        check_schema(&entry, fields, Integers::Unsigned)?;
    }
    Ok(backend.page(ROOMS, 0, 1, &[]).await?.is_empty())
}

/// The collections as PostgreSQL tables made them (`make pg-demo`): the same
/// fields, PostgreSQL's integers as `i64` where the demo has `u64`.
pub fn check_followed_collections(backend: &Backend) -> Result<(), String> {
    for (name, fields) in COLLECTIONS {
        let entry =
            backend.entry(name).ok_or_else(|| format!("--demo: the followed collection `{name}` is missing"))?;
        check_schema(&entry, fields, Integers::Signed)?;
    }
    Ok(())
}

/// Whether the demo's `u64` fields may be `i64` (PostgreSQL has no unsigned integers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Integers {
    Unsigned,
    Signed,
}

/// The page and the simulator need these fields; others may be there too.
fn check_schema(entry: &CollectionEntry, fields: &[(&str, &str)], integers: Integers) -> Result<(), String> {
    let fits = |&(name, field_type): &(&str, &str)| {
        entry.schema.field_id(name).is_some_and(|id| {
            let found = entry.schema.field(id).field_type;
            match field_type {
                "ref" => entry.ref_targets.iter().any(|(field, target)| field == name && target == ROOMS),
                "u64" if integers == Integers::Signed => found == FieldType::I64,
                other => crate::wire::parse_field_type(other) == Some(found),
            }
        })
    };
    if fields.iter().all(fits) {
        return Ok(());
    }
    let wanted: Vec<String> = fields.iter().map(|(name, field_type)| format!("{name}: {field_type}")).collect();
    Err(format!(
        "--demo needs collection `{}` with the fields {}; this data directory has one with another schema \
         (an older demo's, perhaps: use another --data-dir)",
        entry.name,
        wanted.join(", ")
    ))
}

/// Writes the whole chat, `OPS_PER_WRITE` ops at a time.
pub async fn write_chat(backend: &Backend, chat: &Chat) -> Result<(), String> {
    for writes in chat_writes(chat, demo_data::now_ms()) {
        backend.write(&writes).await.map_err(|error| format!("writing the demo chat: {error}"))?;
    }
    Ok(())
}

/// The chat as `POST /v1/batch` bodies: rooms, then memberships, then messages.
pub fn chat_writes(chat: &Chat, now_ms: u64) -> Vec<Json> {
    let mut rng = Rng::new(demo_data::ROOMS_SEED);
    let (mut rooms, mut members, mut messages) = (Vec::new(), Vec::new(), Vec::new());
    for room in &chat.rooms {
        let recency = now_ms.saturating_sub(rng.below(HISTORY_MS));
        let mut preview = String::new();
        for seq in 1..=SEEDED_MESSAGES {
            let author = &chat.users[room.members[rng.index(room.members.len())] as usize];
            let text = demo_data::demo_text(&mut rng);
            let time = recency.saturating_sub((SEEDED_MESSAGES - seq) * SEEDED_MESSAGE_GAP_MS);
            messages.push(message_op(&room.id, seq, author, text, time));
            preview = format!("{author}: {text}");
        }
        rooms.push(json!({"op": "upsert", "id": room.id, "fields": {
            "name": room.name, "recency": recency, "last_seq": SEEDED_MESSAGES, "preview": preview, "dm": room.dm}}));
        for &member in &room.members {
            let owner = &chat.users[member as usize];
            let read_upto = SEEDED_MESSAGES.saturating_sub(if rng.chance(30) { 1 + rng.below(3) } else { 0 });
            members.push(json!({"op": "upsert", "id": membership_id(owner, &room.id), "fields": {
                "owner": owner, "room": room.id, "read_upto": read_upto, "favourite": rng.chance(8)}}));
        }
    }
    [(ROOMS, rooms), (MEMBERS, members), (MESSAGES, messages)]
        .into_iter()
        .flat_map(|(collection, ops)| {
            ops.chunks(OPS_PER_WRITE)
                .map(|chunk| json!({"writes": [{"collection": collection, "ops": chunk}]}))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A message's upsert.
pub fn message_op(room: &str, seq: u64, author: &str, text: &str, time: u64) -> Json {
    json!({"op": "upsert", "id": message_id(room, seq), "fields": {
        "room": room, "seq": seq, "author": author, "text": text, "time": time}})
}

/// Each room's `last_seq` as stored, by room index (rooms the chat does not
/// have, or that are gone, count 0).
pub async fn stored_last_seqs(backend: &Backend, chat: &Chat) -> Result<Vec<u64>, String> {
    let mut last_seqs = vec![0; chat.rooms.len()];
    let index_of: std::collections::HashMap<&str, usize> =
        chat.rooms.iter().enumerate().map(|(index, room)| (room.id.as_str(), index)).collect();
    let fields = ["last_seq".to_owned()];
    let mut offset = 0;
    loop {
        let page = backend.page(ROOMS, offset, crate::limits::MAX_WINDOW_LIMIT, &fields).await?;
        for item in &page {
            if let (Some(id), Some(seq)) = (item["id"].as_str(), item["fields"]["last_seq"].as_u64()) {
                if let Some(&index) = index_of.get(id) {
                    last_seqs[index] = seq;
                }
            }
        }
        if page.len() < crate::limits::MAX_WINDOW_LIMIT {
            return Ok(last_seqs);
        }
        offset += page.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chat_writes_cover_every_room_membership_and_message_once() {
        let chat = Chat::generate(300);
        let writes = chat_writes(&chat, 1_000_000_000_000);
        let count = |collection: &str| -> usize {
            writes
                .iter()
                .flat_map(|write| write["writes"].as_array().unwrap())
                .filter(|part| part["collection"] == collection)
                .map(|part| part["ops"].as_array().unwrap().len())
                .sum()
        };
        assert_eq!(count(ROOMS), 300);
        assert_eq!(count(MEMBERS), chat.n_memberships());
        assert_eq!(count(MESSAGES), 300 * SEEDED_MESSAGES as usize);
        assert!(writes.iter().all(|write| write["writes"][0]["ops"].as_array().unwrap().len() <= OPS_PER_WRITE));
    }

    #[test]
    fn the_flagship_rules_compile() {
        let doc = serde_json::from_value(flagship_rules()).unwrap();
        crate::rules::RuleSet::compile(doc).unwrap();
    }
}
