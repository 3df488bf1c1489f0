"""ProtocolState beyond the corpus: re-subscription after a gap, unsubscribe,
refused subscribe, resume ops."""

from __future__ import annotations

from typing import Any

from ordo_client import Ended, ErrorEvent, Gap, InvalidDiffs, ProtocolState, Resumed, Unsubscribed, Update

SPEC = {"collection": "rooms", "filter": None, "sort": [{"field": "recency", "dir": "desc"}],
        "offset": 0, "limit": 2, "fields": None, "payload": True}  # fmt: skip


def item(n: int) -> dict[str, Any]:
    return {"id": f"!{n}", "fields": {"recency": n}, "payload": None}


def diffs(sub: str, seq: int, *diffs: dict[str, Any]) -> dict[str, Any]:
    return {"type": "diffs", "sub": sub, "seq": seq, "diffs": list(diffs)}


def reset(sub: str, seq: int, *items: dict[str, Any]) -> dict[str, Any]:
    return diffs(sub, seq, {"Reset": {"values": list(items)}})


def test_subscribe_then_frames() -> None:
    state = ProtocolState()
    op = state.subscribe_op("a", SPEC)
    assert op == {"op": "subscribe", "sub": "a", "collection": "rooms",
                  "sort": [{"field": "recency", "dir": "desc"}], "offset": 0, "limit": 2, "payload": True}  # fmt: skip
    assert state.subs["a"].status == "pending"
    del op
    [event] = state.handle_frame(reset("a", 1, item(1)))
    assert isinstance(event, Update) and event.reset and event.items == [item(1)]
    assert state.subs["a"].status == "live"
    [event] = state.handle_frame(diffs("a", 2, {"PushFront": {"value": item(2)}}))
    assert isinstance(event, Update) and not event.reset and event.seq == 2
    assert state.lists() == {"a": [item(2), item(1)]}


def test_a_refused_subscribe_creates_nothing() -> None:
    state = ProtocolState()
    state.subscribe_op("a", SPEC)
    [event] = state.handle_frame({"type": "error", "code": "invalid_view", "message": "no", "sub": "a"})
    assert isinstance(event, ErrorEvent) and event.fatal
    assert state.lists() == {}


def test_an_error_on_a_live_subscription_leaves_it() -> None:
    state = ProtocolState()
    state.seed("a", [item(1)], 3, SPEC)
    [event] = state.handle_frame({"type": "error", "code": "invalid_view", "message": "no", "sub": "a"})
    assert isinstance(event, ErrorEvent) and not event.fatal
    assert state.seqs() == {"a": 3}


def test_resubscription_after_a_gap() -> None:
    state = ProtocolState()
    state.seed("a", [item(1)], 3, SPEC)
    [gap] = state.handle_frame(diffs("a", 5, {"Clear": {}}))
    assert gap == Gap("a", 4, 5)
    ops = state.begin_resubscribe("a")
    assert [op["op"] for op in ops] == ["unsubscribe", "subscribe"]
    assert state.begin_resubscribe("a") == [], "one re-subscription at a time"
    # Frames of the old subscription still in flight are ignored.
    assert state.handle_frame(diffs("a", 6, {"Clear": {}})) == []
    assert state.handle_frame({"type": "unsubscribed", "sub": "a"}) == [], "not the user's unsubscribe"
    assert state.lists() == {"a": [item(1)]}, "the old list stays until the new Reset"
    [event] = state.handle_frame(reset("a", 1, item(7)))
    assert isinstance(event, Update) and event.reset
    assert state.lists() == {"a": [item(7)]} and state.seqs() == {"a": 1}
    assert state.subs["a"].status == "live"


def test_invalid_diffs_are_not_applied() -> None:
    state = ProtocolState()
    state.seed("a", [item(1)], 3, SPEC)
    [event] = state.handle_frame(diffs("a", 4, {"PushBack": {"value": item(2)}}, {"Remove": {"index": 5}}))
    assert isinstance(event, InvalidDiffs)
    assert state.lists() == {"a": [item(1)]} and state.seqs() == {"a": 3}


def test_a_refused_resubscribe_ends_the_subscription() -> None:
    state = ProtocolState()
    state.seed("a", [item(1)], 3, SPEC)
    state.begin_resubscribe("a")
    [event] = state.handle_frame({"type": "error", "code": "unknown_collection", "message": "gone", "sub": "a"})
    assert isinstance(event, ErrorEvent) and event.fatal
    assert state.handle_frame({"type": "unsubscribed", "sub": "a"}) == []
    assert state.lists() == {}


def test_unsubscribe() -> None:
    state = ProtocolState()
    state.seed("a", [item(1)], 3, SPEC)
    assert state.begin_unsubscribe("a") == {"op": "unsubscribe", "sub": "a"}
    # Frames still in flight are applied; a broken one is ignored.
    [event] = state.handle_frame(diffs("a", 4, {"Clear": {}}))
    assert isinstance(event, Update)
    assert state.handle_frame(diffs("a", 9, {"Clear": {}})) == []
    assert state.handle_frame({"type": "unsubscribed", "sub": "a"}) == [Unsubscribed("a")]
    assert state.lists() == {}
    assert state.handle_frame(diffs("a", 5, {"Clear": {}})) == [], "no frame of it after unsubscribed"


def test_resume_op_lists_every_subscription_with_its_last_seq() -> None:
    state = ProtocolState()
    state.handle_frame({"type": "welcome", "protocol": 1, "session": "s1", "limits": {}})
    state.seed("live", [item(1)], 7, SPEC)
    state.seed("pending", [], 0, dict(SPEC, filter={"field": "dm", "op": "eq", "value": True}))
    state.seed("closing", [item(1)], 2, SPEC)
    state.begin_unsubscribe("closing")
    state.seed("gap", [item(1)], 4, SPEC)
    state.begin_resubscribe("gap")
    state.seed("after_unsubscribed", [item(1)], 9, SPEC)
    state.begin_resubscribe("after_unsubscribed")
    state.handle_frame({"type": "unsubscribed", "sub": "after_unsubscribed"})
    op, dropped = state.resume_op()
    assert [s.sub for s in dropped] == ["closing"]
    assert op is not None and op["op"] == "resume" and op["session"] == "s1"
    by_sub = {entry["sub"]: entry for entry in op["subs"]}
    assert {sub: entry["last_seq"] for sub, entry in by_sub.items()} == {
        "live": 7, "pending": 0, "gap": 4, "after_unsubscribed": 0,
    }  # fmt: skip
    assert by_sub["pending"]["filter"] == {"field": "dm", "op": "eq", "value": True}
    assert "filter" not in by_sub["live"] and "fields" not in by_sub["live"]
    assert state.subs["gap"].status == "live"
    # The answer: the session to use next, which replayed and which reset.
    [event] = state.handle_frame({"type": "resumed", "session": "s2", "subs": [
        {"sub": "live", "replayed": 0}, {"sub": "pending", "reset": True},
        {"sub": "gap", "error": {"code": "unknown_collection", "message": "gone"}},
        {"sub": "after_unsubscribed", "reset": True}]})  # fmt: skip
    assert isinstance(event, Resumed)
    assert event.replayed == ["live"] and event.reset == ["pending", "after_unsubscribed"]
    assert event.errors == {"gap": ("unknown_collection", "gone")}
    assert state.session == "s2" and "gap" not in state.subs


def test_nothing_to_resume() -> None:
    assert ProtocolState().resume_op() == (None, [])


def test_total_is_kept_across_frames_without_one_and_write_seq_is_per_frame() -> None:
    state = ProtocolState()
    state.subscribe_op("a", SPEC)
    assert (state.subs["a"].total, state.subs["a"].write_seq) == (None, None)
    [event] = state.handle_frame({**reset("a", 1, item(1)), "total": 9, "write_seq": 4})
    assert isinstance(event, Update) and (event.total, event.write_seq) == (9, 4)
    # No `total`: unchanged.
    [event] = state.handle_frame({**diffs("a", 2, {"PushBack": {"value": item(0)}}), "write_seq": 5})
    assert isinstance(event, Update) and (event.total, event.write_seq) == (9, 5)
    state.handle_frame({**diffs("a", 3, {"PopBack": {}}), "total": 11, "write_seq": 6})
    assert state.totals() == {"a": 11}
    # A gap applies nothing, its total included.
    state.handle_frame({**diffs("a", 9, {"PopBack": {}}), "total": 50})
    assert state.totals() == {"a": 11}


def test_ended_removes_the_subscription_and_frees_its_id() -> None:
    state = ProtocolState()
    state.subscribe_op("a", SPEC)
    state.handle_frame(reset("a", 1, item(1)))
    ended = {"type": "ended", "sub": "a", "reason": "collection_dropped", "message": "collection `rooms` was dropped"}
    assert state.handle_frame(ended) == [Ended("a", "collection_dropped", "collection `rooms` was dropped")]
    assert "a" not in state.subs
    assert state.handle_frame(diffs("a", 2, {"PopBack": {}})) == []  # in flight: dropped
    state.subscribe_op("a", SPEC)  # the id is free
    [event] = state.handle_frame(reset("a", 1, item(2)))
    assert isinstance(event, Update) and event.items == [item(2)]
    # Being re-subscribed (after a gap): the old one ended before the unsubscribe
    # reached it; that is answered `unknown_subscription`, then the new subscribe.
    state.begin_resubscribe("a")
    assert state.handle_frame({**ended, "reason": "field_removed"}) == []
    assert state.subs["a"].status == "resubscribing"
    assert state.handle_frame({"type": "error", "sub": "a", "code": "unknown_subscription", "message": ""}) == []
    assert state.subs["a"].status == "awaiting_reset"
    assert state.handle_frame({**ended, "sub": "ghost"}) == []
