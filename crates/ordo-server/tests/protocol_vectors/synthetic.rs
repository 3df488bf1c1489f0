//! The hand-built cases: diff kinds the server does not emit today and broken
//! sequences, applied with the same reference code as the recorded frames.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::case::{expectation, Case};
use crate::common::{apply_frame, LocalList};

fn item(id: &str, name: &str, recency: u64) -> Value {
    json!({"id": id, "fields": {"name": name, "recency": recency}, "payload": null})
}

/// Applies hand-built frames with the same reference code as the recorded ones.
fn synthetic(name: &'static str, description: &'static str, start: LocalList, frames: Vec<Value>) -> Case {
    let mut lists = BTreeMap::from([("list".to_owned(), start.clone())]);
    let mut steps = Vec::new();
    for frame in frames {
        let list = lists.get_mut("list").unwrap();
        let seq = frame["seq"].as_u64().unwrap();
        let event = if seq != list.seq + 1 {
            Some(json!({"kind": "gap", "sub": "list", "expected_seq": list.seq + 1, "got_seq": seq}))
        } else {
            apply_frame(list, &frame);
            let has_reset = frame["diffs"].as_array().unwrap().iter().any(|diff| diff.get("Reset").is_some());
            has_reset.then(|| json!({"kind": "reset", "sub": "list"}))
        };
        steps.push(json!({"frame": frame, "expect": expectation(&lists, &BTreeMap::new(), event)}));
    }
    Case { name, description, synthetic: true, subscriptions: BTreeMap::from([("list".to_owned(), start)]), steps }
}

pub(crate) fn synthetic_cases() -> Vec<Case> {
    let (a, b, c) = (item("a", "Alice", 3), item("b", "Bob", 2), item("c", "Chloé", 1));
    let (d, e, f, g) = (item("d", "Dmitri", 9), item("e", "Émile", 8), item("f", "Fatima", 7), item("g", "Günther", 6));
    let (h, i) = (item("h", "Hana", 5), item("i", "Ivan", 4));
    let start = LocalList { items: vec![a.clone(), b.clone(), c.clone()], seq: 4, n_resets: 0 };
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
        start,
        vec![
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(7, json!([{"Remove": {"index": 0}}])),
            frame(5, json!([{"Remove": {"index": 0}}])),
            frame(6, json!([{"PushFront": {"value": c}}])),
        ],
    );
    vec![every_kind, gaps]
}
