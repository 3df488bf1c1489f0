//! Runs the language-neutral protocol corpus (`protocol/vectors/*.json`, format in
//! `protocol/README.md`) through the socket-free core: seed the subscriptions, feed
//! each frame, compare the event reported, the lists and the seqs after every step.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ordo_client::digest::{digest_hex, window_digest, RowKey};
use ordo_client::protocol::{Event, JsonList, ProtocolState};
use serde_json::{json, Value};

fn vectors_dir() -> PathBuf {
    std::env::var_os("ORDO_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors"))
}

/// An event as the corpus spells it, or `None` for events it does not name.
fn as_vector_event(event: &Event) -> Option<Value> {
    let sorted = |subs: &[String]| {
        let mut subs = subs.to_vec();
        subs.sort();
        subs
    };
    Some(match event {
        Event::Welcome { session, .. } => json!({"kind": "welcome", "session": session}),
        Event::Error { code, sub: None, .. } => json!({"kind": "error", "code": code}),
        Event::Error { code, sub: Some(sub), .. } => json!({"kind": "error", "code": code, "sub": sub}),
        Event::Unsubscribed { sub } => json!({"kind": "unsubscribed", "sub": sub}),
        Event::Resumed { replayed, reset, .. } => {
            json!({"kind": "resumed", "replayed": sorted(replayed), "reset": sorted(reset)})
        }
        Event::Gap { sub, expected_seq, got_seq } => {
            json!({"kind": "gap", "sub": sub, "expected_seq": expected_seq, "got_seq": got_seq})
        }
        Event::Change { sub, reset: true, .. } => json!({"kind": "reset", "sub": sub}),
        Event::InvalidDiffs { sub, .. } => json!({"kind": "invalid_diffs", "sub": sub}),
        Event::DigestMismatch { sub, seq, .. } => json!({"kind": "digest_mismatch", "sub": sub, "seq": seq}),
        Event::Protocol { message, .. } => json!({"kind": "protocol", "message": message}),
        Event::Ended { sub, reason, .. } => json!({"kind": "ended", "sub": sub, "reason": reason}),
        Event::Change { .. }
        | Event::Behind { .. }
        | Event::Authed(_)
        | Event::AuthExpired { .. }
        | Event::Ack { .. } => return None,
    })
}

fn normalize_expected(mut event: Value) -> Value {
    if event["kind"] == "resumed" {
        for key in ["replayed", "reset"] {
            let mut subs: Vec<String> = serde_json::from_value(event[key].take()).unwrap_or_default();
            subs.sort();
            event[key] = json!(subs);
        }
    }
    event
}

fn lists(state: &ProtocolState<JsonList>) -> BTreeMap<String, Vec<Value>> {
    state.live().map(|(sub, list, _)| (sub.to_owned(), list.items.iter().cloned().collect())).collect()
}

/// The last `total` each list got (`null`: none yet).
fn totals(state: &ProtocolState<JsonList>) -> BTreeMap<String, Value> {
    state.live().map(|(sub, list, _)| (sub.to_owned(), json!(list.total))).collect()
}

/// Each list's window digest, computed from the items it holds.
fn digests(state: &ProtocolState<JsonList>) -> BTreeMap<String, String> {
    state
        .live()
        .map(|(sub, list, _)| {
            let rows: Vec<RowKey> =
                list.items.iter().map(|item| serde_json::from_value(item.clone()).unwrap()).collect();
            (sub.to_owned(), digest_hex(window_digest(&rows)))
        })
        .collect()
}

fn seqs(state: &ProtocolState<JsonList>) -> BTreeMap<String, u64> {
    state.live().map(|(sub, _, seq)| (sub.to_owned(), seq)).collect()
}

#[test]
fn protocol_vectors() {
    let dir = vectors_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let names: Vec<String> =
        files.iter().map(|path| path.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    // Cases the corpus must hold for this runner to mean something.
    for name in [
        "all_diff_kinds",
        "seq_gaps",
        "digest_mismatch",
        "resume_replay",
        "resume_reset",
        "ended",
        "reference_views",
        "unread_views",
    ] {
        assert!(names.iter().any(|n| n == name), "the corpus has no {name}.json");
    }
    for path in &files {
        let vector: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = path.file_name().unwrap().to_string_lossy();
        assert_eq!(vector["protocol"], 1, "{file}: protocol version");
        let mut state = ProtocolState::<JsonList>::new();
        for (sub, seed) in vector["subscriptions"].as_object().expect("subscriptions") {
            let items = seed["items"].as_array().cloned().unwrap_or_default();
            state.seed(sub, JsonList::new(items.clone()), seed["seq"].as_u64().unwrap());
            state.seed_rows(sub, &items).unwrap();
        }
        let steps = vector["steps"].as_array().expect("steps");
        assert!(!steps.is_empty(), "{file}: no steps");
        for (index, step) in steps.iter().enumerate() {
            let where_ = format!("{file} ({}), step {index}", vector["name"]);
            let reported: Vec<Value> = state.handle_frame(&step["frame"]).iter().filter_map(as_vector_event).collect();
            let expected: Vec<Value> =
                step["expect"].get("event").cloned().map(normalize_expected).into_iter().collect();
            assert_eq!(reported, expected, "{where_}: event");
            let expected_lists: BTreeMap<String, Vec<Value>> =
                serde_json::from_value(step["expect"]["lists"].clone()).unwrap();
            assert_eq!(lists(&state), expected_lists, "{where_}: lists");
            let expected_seqs: BTreeMap<String, u64> = serde_json::from_value(step["expect"]["seqs"].clone()).unwrap();
            assert_eq!(seqs(&state), expected_seqs, "{where_}: seqs");
            if let Some(expected_digests) = step["expect"].get("digests") {
                let expected_digests: BTreeMap<String, String> =
                    serde_json::from_value(expected_digests.clone()).unwrap();
                assert_eq!(digests(&state), expected_digests, "{where_}: digests");
            }
            if let Some(expected_totals) = step["expect"].get("totals") {
                let expected_totals: BTreeMap<String, Value> = serde_json::from_value(expected_totals.clone()).unwrap();
                assert_eq!(totals(&state), expected_totals, "{where_}: totals");
            }
        }
    }
}
