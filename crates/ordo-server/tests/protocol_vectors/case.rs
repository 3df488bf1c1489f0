//! One vector of the corpus (a case) and its JSON form: the lists a client
//! holds before it, and each frame with what the client must hold after it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::common::{list_digest, LocalList};

pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) description: &'static str,
    pub(crate) synthetic: bool,
    pub(crate) subscriptions: BTreeMap<String, LocalList>,
    pub(crate) steps: Vec<Value>,
}

impl Case {
    pub(crate) fn to_json(&self) -> Value {
        let subscriptions: serde_json::Map<String, Value> = self
            .subscriptions
            .iter()
            .map(|(sub, list)| (sub.clone(), json!({"items": list.items, "seq": list.seq})))
            .collect();
        json!({
            "protocol": 1,
            "name": self.name,
            "description": self.description,
            "synthetic": self.synthetic,
            "subscriptions": subscriptions,
            "steps": self.steps,
        })
    }
}

/// `totals`: the last `total` each subscription got in a frame it applied
/// (absent: none yet, written as `null`); `digests`: each list's window digest.
pub(crate) fn expectation(
    lists: &BTreeMap<String, LocalList>,
    totals: &BTreeMap<String, u64>,
    event: Option<Value>,
) -> Value {
    let items: serde_json::Map<String, Value> =
        lists.iter().map(|(sub, list)| (sub.clone(), Value::Array(list.items.clone()))).collect();
    let seqs: serde_json::Map<String, Value> = lists.iter().map(|(sub, list)| (sub.clone(), json!(list.seq))).collect();
    let totals: serde_json::Map<String, Value> =
        lists.keys().map(|sub| (sub.clone(), totals.get(sub).map_or(Value::Null, |total| json!(total)))).collect();
    let digests: serde_json::Map<String, Value> =
        lists.iter().map(|(sub, list)| (sub.clone(), json!(list_digest(&list.items)))).collect();
    let mut expect = json!({"lists": items, "seqs": seqs, "totals": totals, "digests": digests});
    if let Some(event) = event {
        expect["event"] = event;
    }
    expect
}
