//! The socket-free core against a naive reference (random diffs, valid or not, applied
//! to a `Vec`), and the frames the corpus does not cover yet: `ended`, `total`,
//! `ack`, unknown frame types and keys, a re-subscribe after a gap.

use ordo_client::protocol::{Event, JsonList, Phase, ProtocolState};
use serde_json::{json, Value};

// The shared seeded generator, so a failure names its seed.
use ordo_test_kit::rng::Rng;

fn item(n: u64) -> Value {
    json!({"id": format!("i{n}"), "fields": {"n": n}, "payload": null})
}

/// A random diff: usually one that fits a list of `len` items, sometimes one that does not.
fn random_diff(rng: &mut Rng, len: usize, counter: &mut u64) -> Value {
    *counter += 1;
    let fresh = item(*counter);
    let stray = len + rng.below(3); // past the end, or at it
    match rng.below(12) {
        0 => json!({"Append": {"values": [fresh, item(*counter + 1000)]}}),
        1 => json!({"Clear": {}}),
        2 => json!({"PushFront": {"value": fresh}}),
        3 => json!({"PushBack": {"value": fresh}}),
        4 => json!({"PopFront": {}}),
        5 => json!({"PopBack": {}}),
        6 => json!({"Insert": {"index": rng.below(len + 2), "value": fresh}}),
        7 => json!({"Set": {"index": if rng.below(8) == 0 { stray } else { rng.below(len.max(1)) }, "value": fresh}}),
        8 => json!({"Remove": {"index": if rng.below(8) == 0 { stray } else { rng.below(len.max(1)) }}}),
        9 => json!({"Truncate": {"length": rng.below(len + 2)}}),
        10 => {
            json!({"Reset": {"values": (0..rng.below(5)).map(|k| item(*counter * 10 + k as u64)).collect::<Vec<_>>()}})
        }
        _ => json!({"Bogus": {}}),
    }
}

/// The reference: a `Vec`, the rules of `docs/PROTOCOL.md` spelt out. `None`: does not apply.
fn naive_apply(list: &[Value], diffs: &[Value]) -> Option<Vec<Value>> {
    let mut out = list.to_vec();
    for diff in diffs {
        let (kind, body) = diff.as_object()?.iter().next()?;
        let index = body.get("index").and_then(Value::as_u64).map(|i| i as usize);
        match kind.as_str() {
            "Append" => out.extend(body["values"].as_array()?.iter().cloned()),
            "Clear" => out.clear(),
            "PushFront" => out.insert(0, body["value"].clone()),
            "PushBack" => out.push(body["value"].clone()),
            "PopFront" => {
                if out.is_empty() {
                    return None;
                }
                out.remove(0);
            }
            "PopBack" => {
                out.pop()?;
            }
            "Insert" if index? <= out.len() => out.insert(index?, body["value"].clone()),
            "Set" if index? < out.len() => out[index?] = body["value"].clone(),
            "Remove" if index? < out.len() => {
                out.remove(index?);
            }
            "Truncate" if body["length"].as_u64()? as usize <= out.len() => {
                out.truncate(body["length"].as_u64()? as usize)
            }
            "Reset" => out = body["values"].as_array()?.clone(),
            _ => return None,
        }
    }
    Some(out)
}

#[test]
fn frames_apply_exactly_like_a_naive_list_and_bad_ones_change_nothing() {
    let seeds: u64 = std::env::var("ORDO_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut state = ProtocolState::<JsonList>::new();
        state.subscribe("s", JsonList::default());
        let mut reference: Vec<Value> = Vec::new();
        let (mut seq, mut counter) = (0u64, 0u64);
        for step in 0..300 {
            let diffs: Vec<Value> =
                (0..1 + rng.below(4)).map(|_| random_diff(&mut rng, reference.len(), &mut counter)).collect();
            let events = state.handle_frame(&json!({"type": "diffs", "sub": "s", "seq": seq + 1, "diffs": diffs}));
            let context = format!("seed {seed}, step {step}, diffs {diffs:?}");
            match naive_apply(&reference, &diffs) {
                Some(next) => {
                    reference = next;
                    seq += 1;
                    assert!(matches!(events.as_slice(), [Event::Change { .. }]), "{context}: {events:?}");
                }
                None => {
                    assert!(matches!(events.as_slice(), [Event::InvalidDiffs { .. }]), "{context}: {events:?}");
                }
            }
            let (_, list, got_seq) = state.live().next().unwrap();
            assert_eq!(list.items.iter().cloned().collect::<Vec<_>>(), reference, "{context}");
            assert_eq!(got_seq, seq, "{context}");
        }
    }
}

fn one_list(items: Vec<Value>, seq: u64) -> ProtocolState<JsonList> {
    let mut state = ProtocolState::new();
    state.seed("rooms", JsonList::new(items), seq);
    state
}

#[test]
fn unknown_frame_types_and_keys_are_ignored() {
    let mut state = one_list(vec![], 0);
    assert_eq!(state.handle_frame(&json!({"type": "from_the_future", "sub": "rooms", "seq": 1})), vec![]);
    let events = state.handle_frame(&json!({
        "type": "diffs", "sub": "rooms", "seq": 1, "req": "r1", "write_seq": 40, "total": 7, "new_key": {"x": 1},
        "diffs": [{"Reset": {"values": [{"id": "a", "fields": {}, "payload": null, "extra": 1}]}}]
    }));
    assert_eq!(events, vec![Event::Change { sub: "rooms".into(), seq: 1, reset: true, req: Some("r1".into()) }]);
    let list = state.sink("rooms").unwrap();
    assert_eq!(list.total, Some(7));
    assert_eq!(list.items.len(), 1);
    // `total` absent: the last one stands.
    state.handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 2, "diffs": [{"PopBack": {}}]}));
    assert_eq!(state.sink("rooms").unwrap().total, Some(7));
    assert_eq!(
        state.handle_frame(&json!({"type": "ack", "sub": "rooms", "req": "r2"})),
        vec![Event::Ack { sub: Some("rooms".into()), req: Some("r2".into()) }]
    );
}

#[test]
fn ended_removes_the_subscription_and_tells_why() {
    let mut state = one_list(vec![item(1)], 3);
    let events = state
        .handle_frame(&json!({"type": "ended", "sub": "rooms", "reason": "collection_dropped", "message": "gone"}));
    assert_eq!(
        events,
        vec![Event::Ended { sub: "rooms".into(), reason: "collection_dropped".into(), message: "gone".into() }]
    );
    assert!(!state.contains("rooms"));
    // No frame of it follows; one that did would be ignored, not applied.
    assert_eq!(
        state.handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 4, "diffs": [{"Clear": {}}]})),
        vec![]
    );
}

#[test]
fn a_restarted_subscription_keeps_its_list_until_the_new_reset() {
    let mut state = one_list(vec![item(1), item(2)], 5);
    assert!(matches!(
        state.handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 7, "diffs": [{"Clear": {}}]}))[..],
        [Event::Gap { expected_seq: 6, got_seq: 7, .. }]
    ));
    state.restart("rooms");
    // The old subscription's frames still on their way are ignored.
    assert_eq!(
        state.handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 8, "diffs": [{"Clear": {}}]})),
        vec![]
    );
    assert_eq!(state.sink("rooms").unwrap().items.len(), 2);
    assert_eq!(state.handle_frame(&json!({"type": "unsubscribed", "sub": "rooms"})), vec![]);
    assert_eq!(state.phase("rooms"), Some(Phase::Subscribing));
    let events = state
        .handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 1, "diffs": [{"Reset": {"values": [item(3)]}}]}));
    assert!(matches!(events[..], [Event::Change { seq: 1, reset: true, .. }]));
    assert_eq!(state.sink("rooms").unwrap().items.iter().cloned().collect::<Vec<_>>(), vec![item(3)]);
}

#[test]
fn every_resumed_replaces_the_session() {
    let mut state = one_list(vec![], 2);
    state.handle_frame(&json!({"type": "welcome", "protocol": 1, "session": "s1", "auth": "none"}));
    assert_eq!(state.session.as_deref(), Some("s1"));
    state.handle_frame(&json!({"type": "resumed", "session": "s2", "subs": [{"sub": "rooms", "reset": true}]}));
    assert_eq!(state.session.as_deref(), Some("s2"));
    state.handle_frame(&json!({"type": "resumed", "session": "s3", "subs": [{"sub": "rooms", "replayed": 0}]}));
    assert_eq!(state.session.as_deref(), Some("s3"));
}

#[test]
fn the_floor_is_the_greatest_write_seq_and_a_node_behind_it_keeps_the_list() {
    let mut state: ProtocolState<JsonList> = ProtocolState::new();
    state.subscribe("rooms", JsonList::new(vec![]));
    assert_eq!(state.floor_seq("rooms"), None);
    state.handle_frame(
        &json!({"type": "diffs", "sub": "rooms", "seq": 1, "diffs": [{"Reset": {"values": [item(1)]}}], "write_seq": 9}),
    );
    // A frame without write_seq does not lower it.
    state
        .handle_frame(&json!({"type": "diffs", "sub": "rooms", "seq": 2, "diffs": [{"PushBack": {"value": item(2)}}]}));
    assert_eq!(state.floor_seq("rooms"), Some(9));

    // Resumed on a node that has not reached 9: the list stays, subscribing afresh.
    state.prepare_resume();
    let events = state.handle_frame(&json!({"type": "resumed", "session": "s2", "subs": [
        {"sub": "rooms", "error": {"code": "seq_not_reached", "message": "not yet"}}]}));
    assert!(
        matches!(&events[..], [Event::Resumed { failed, .. }, Event::Behind { sub, .. }] if failed.is_empty() && sub == "rooms"),
        "{events:?}"
    );
    assert_eq!(state.phase("rooms"), Some(Phase::Subscribing));
    assert_eq!(state.floor_seq("rooms"), Some(9));
    assert_eq!(state.sink("rooms").unwrap().items.len(), 2);
    // The same on a refused subscribe.
    let events =
        state.handle_frame(&json!({"type": "error", "sub": "rooms", "code": "seq_not_reached", "message": "not yet"}));
    assert!(matches!(&events[..], [Event::Behind { .. }]), "{events:?}");
    assert!(state.contains("rooms"));

    // `lagging` (the node refuses subscribers until it catches up): kept, even with no floor.
    state.subscribe("new", JsonList::new(vec![]));
    let events = state.handle_frame(&json!({"type": "error", "sub": "new", "code": "lagging", "message": "lags"}));
    assert!(matches!(&events[..], [Event::Behind { .. }]), "{events:?}");
    assert_eq!(state.phase("new"), Some(Phase::Subscribing));

    // A list that never showed anything is refused as before: it is gone.
    state.subscribe("fresh", JsonList::new(vec![]));
    let events =
        state.handle_frame(&json!({"type": "error", "sub": "fresh", "code": "seq_not_reached", "message": "not yet"}));
    assert!(matches!(&events[..], [Event::Error { .. }]), "{events:?}");
    assert!(!state.contains("fresh"));
}
