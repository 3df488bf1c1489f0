//! The hand-built cases: diff kinds the server does not emit today, broken
//! sequences and wrong digests, applied with the same reference code as the
//! recorded frames.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::case::{expectation, Case};
use crate::common::{apply_diffs, list_digest, LocalList};

/// An item at a version (its `recency` doubles as one: every write moves both).
fn item(id: &str, name: &str, recency: u64) -> Value {
    json!({"id": id, "version": recency, "fields": {"name": name, "recency": recency}, "payload": null})
}

/// Applies hand-built frames with the same reference code as the recorded ones.
/// A frame without a `digest` key gets the right one, as a server would send it;
/// `"digest": null` sends it without one (a large window's frame); any other
/// digest is kept, and must be caught when it is not the list's.
fn synthetic(name: &'static str, description: &'static str, start: LocalList, frames: Vec<Value>) -> Case {
    let mut lists = BTreeMap::from([("list".to_owned(), start.clone())]);
    let mut steps = Vec::new();
    for mut frame in frames {
        let list = lists.get_mut("list").unwrap();
        let seq = frame["seq"].as_u64().unwrap();
        let event = if seq != list.seq + 1 {
            Some(json!({"kind": "gap", "sub": "list", "expected_seq": list.seq + 1, "got_seq": seq}))
        } else {
            let mut after = list.clone();
            apply_diffs(&mut after, &frame);
            let digest = list_digest(&after.items);
            match frame.get("digest") {
                None => frame["digest"] = json!(digest),
                Some(Value::Null) => {
                    frame.as_object_mut().unwrap().remove("digest");
                }
                Some(_) => {}
            }
            if frame.get("digest").is_some_and(|sent| *sent != json!(digest)) {
                // The list is not the server's: it stays as it was, and is subscribed again.
                Some(json!({"kind": "digest_mismatch", "sub": "list", "seq": seq}))
            } else {
                *list = after;
                let has_reset = frame["diffs"].as_array().unwrap().iter().any(|diff| diff.get("Reset").is_some());
                has_reset.then(|| json!({"kind": "reset", "sub": "list"}))
            }
        };
        steps.push(json!({"frame": frame, "expect": expectation(&lists, &BTreeMap::new(), event)}));
    }
    Case { name, description, synthetic: true, subscriptions: BTreeMap::from([("list".to_owned(), start)]), steps }
}

pub(crate) fn synthetic_cases() -> Vec<Case> {
    let (a, b, c) = (item("a", "Alice", 3), item("b", "Bob", 2), item("c", "Chloé", 1));
    let (d, e, f, g) = (item("d", "Dmitri", 9), item("e", "Émile", 8), item("f", "Fatima", 7), item("g", "Günther", 6));
    let (h, i) = (item("h", "Hana", 5), item("i", "Ivan", 4));
    let start = LocalList { items: vec![a.clone(), b.clone(), c.clone()], seq: 4, ..LocalList::default() };
    let frame = |seq: u64, diffs: Value| json!({"type": "diffs", "sub": "list", "seq": seq, "diffs": diffs});
    let every_kind = synthetic(
        "all_diff_kinds",
        "Every eyeball-im VectorDiff kind, several in one frame and one after another, built by hand: a client \
         must apply them all in order, from the first diff of a frame to the last.",
        start.clone(),
        vec![
            frame(
                5,
                json!([{"PushBack": {"value": d}}, {"PushFront": {"value": e}}, {"Insert": {"index": 2, "value": f}},
                            {"Set": {"index": 0, "value": g}}, {"Remove": {"index": 1}}, {"PopFront": {}}, {"PopBack": {}},
                            {"Append": {"values": [h, i]}}, {"Truncate": {"length": 3}}]),
            ),
            frame(6, json!([{"Clear": {}}])),
            frame(7, json!([{"Append": {"values": [a.clone()]}}, {"Insert": {"index": 1, "value": b.clone()}}])),
            frame(8, json!([{"Reset": {"values": [c.clone(), b.clone()]}}])),
            frame(9, json!([{"Truncate": {"length": 0}}, {"PushBack": {"value": a}}])),
        ],
    );
    let gaps = synthetic(
        "seq_gaps",
        "Frames whose seq is not the next one (skipped, repeated): the client must not apply them and must \
         report the gap; it keeps its list and seq until it subscribes again.",
        start.clone(),
        vec![
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(7, json!([{"Remove": {"index": 0}}])),
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(6, json!([{"PushFront": {"value": c}}])),
        ],
    );
    vec![every_kind, gaps, digest_mismatch(start)]
}

/// Frames whose digest is not the list's once they are applied: the diffs
/// apply, yet the list is not the server's window.
fn digest_mismatch(start: LocalList) -> Case {
    let with_digest = |seq: u64, diffs: Value, digest: Value| json!({"type": "diffs", "sub": "list", "seq": seq, "diffs": diffs, "digest": digest});
    let frame = |seq: u64, diffs: Value| json!({"type": "diffs", "sub": "list", "seq": seq, "diffs": diffs});
    let (a, b, c) = (&start.items[0], &start.items[1], &start.items[2]);
    let b_later = item("b", "Bob", 12);
    // What the server holds after frame 6: `b` at the version of a write this client never saw.
    let server_after_6 = list_digest(&[b_later.clone(), c.clone()]);
    // The same rows as the list after frame 7, in the other order.
    let swapped_after_7 = list_digest(&[c.clone(), b.clone()]);
    synthetic(
        "digest_mismatch",
        "Frames whose window digest is not the digest of the list they leave: the same rows at another version,          the same rows in another order. The client must compute the digest after applying each frame that          carries one, and on a mismatch report it, keep its list and seq as they were before the frame, and          subscribe again; a frame without a digest (a window past 256 rows) is applied unchecked.",
        start.clone(),
        vec![
            frame(5, json!([{"Remove": {"index": 0}}])),
            with_digest(6, json!([{"Set": {"index": 0, "value": b}}]), json!(server_after_6)),
            frame(6, json!([{"PushFront": {"value": a}}])),
            with_digest(7, json!([{"Remove": {"index": 0}}]), json!(swapped_after_7)),
            frame(7, json!([{"Remove": {"index": 0}}])),
            frame(8, json!([{"Append": {"values": [a]}}])),
            with_digest(9, json!([{"PopBack": {}}]), Value::Null),
        ],
    )
}
