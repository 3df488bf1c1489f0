// The protocol core's own behaviour beyond the corpus: what the client tells it it
// sent (subscribe, unsubscribe, a re-subscribe after a gap, a resume).

import { describe, expect, it } from "vitest";

import { ProtocolState, type Item } from "../src/index.js";

const item = (id: string): Item => ({ id, fields: { name: id }, payload: null });
const reset = (sub: string, seq: number, ids: string[]) => ({
  type: "diffs",
  sub,
  seq,
  diffs: [{ Reset: { values: ids.map(item) } }],
});
const push = (sub: string, seq: number, id: string) => ({
  type: "diffs",
  sub,
  seq,
  diffs: [{ PushBack: { value: item(id) } }],
});

describe("ProtocolState", () => {
  it("reports welcome and keeps the session", () => {
    const state = new ProtocolState();
    expect(state.handleFrame({ type: "welcome", protocol: 1, session: "abc", limits: { x: 1 } })).toEqual([
      { kind: "welcome", session: "abc", protocol: 1, limits: { x: 1 }, auth: "none" },
    ]);
    expect(state.session).toBe("abc");
  });

  it("reads the welcome's auth, authed and auth_expired", () => {
    const state = new ProtocolState();
    const welcome = (auth: unknown) => state.handleFrame({ type: "welcome", protocol: 1, session: "s", limits: {}, auth });
    expect(welcome("none")).toMatchObject([{ kind: "welcome", auth: "none" }]);
    expect(welcome("required")).toMatchObject([{ kind: "welcome", auth: "required" }]);
    expect(welcome({ sub: "u42", role: "reader", expires_at: 1732262400 })).toMatchObject([
      { kind: "welcome", auth: { sub: "u42", role: "reader", expires_at: 1732262400 } },
    ]);
    // A form it does not know: a client with a token sends it.
    expect(welcome("oauth-something")).toMatchObject([{ kind: "welcome", auth: "required" }]);
    expect(state.handleFrame({ type: "authed", sub: "u42", role: "reader", expires_at: 1732262400 })).toEqual([
      { kind: "authed", sub: "u42", role: "reader", expires_at: 1732262400 },
    ]);
    expect(state.handleFrame({ type: "authed", sub: "u42" })).toMatchObject([{ kind: "protocol", resubscribe: "none" }]);
    expect(state.handleFrame({ type: "auth_expired", grace_secs: 30 })).toEqual([{ kind: "auth_expired", grace_secs: 30 }]);
  });

  it("says which lists an unreadable frame may have concerned", () => {
    const state = new ProtocolState();
    state.subscribe("a");
    expect(state.handleFrame({ type: "diffs", sub: "a", seq: 1, diffs: "no" })).toMatchObject([
      { kind: "protocol", resubscribe: "sub", sub: "a" },
    ]);
    // A sub it does not hold cannot be trusted: every list.
    expect(state.handleFrame({ type: "diffs", sub: "zz", seq: "1" })).toMatchObject([{ kind: "protocol", resubscribe: "all" }]);
    expect(state.handleFrame([1, 2])).toMatchObject([{ kind: "protocol", resubscribe: "all" }]);
    expect(state.handleFrame({ type: "unsubscribed" })).toMatchObject([{ kind: "protocol", resubscribe: "all" }]);
    // Nested too deep to print: still an event, not an exception.
    let deep: unknown = [];
    for (let i = 0; i < 200_000; i++) deep = [deep];
    expect(state.handleFrame(deep)).toMatchObject([{ kind: "protocol", resubscribe: "all" }]);
    // Items that are not items are diffs that do not apply.
    expect(state.handleFrame({ type: "diffs", sub: "a", seq: 1, diffs: [{ Reset: { values: [{ id: 1 }] } }] })).toMatchObject([
      { kind: "invalid_diffs", sub: "a" },
    ]);
    expect(state.get("a")).toMatchObject({ seq: 0, items: [] });
  });

  it("a refused subscribe removes the subscription; a refused request keeps it", () => {
    const state = new ProtocolState();
    state.subscribe("a");
    state.subscribe("b");
    expect(state.handleFrame({ type: "error", code: "invalid_view", message: "m", sub: "a" })).toEqual([
      { kind: "error", code: "invalid_view", message: "m", sub: "a", refused: "subscribe" },
    ]);
    expect(state.has("a")).toBe(false);
    state.handleFrame(reset("b", 1, ["x"]));
    expect(state.handleFrame({ type: "error", code: "invalid_view", message: "m", sub: "b" })).toEqual([
      { kind: "error", code: "invalid_view", message: "m", sub: "b", refused: "request" },
    ]);
    expect(state.lists()).toEqual({ b: [item("x")] });
  });

  it("a gap keeps the list; after restart frames wait for `unsubscribed`, then seq 1", () => {
    const state = new ProtocolState({ l: { items: [item("a")], seq: 3 } });
    expect(state.handleFrame(push("l", 5, "b"))).toEqual([{ kind: "gap", sub: "l", expected_seq: 4, got_seq: 5 }]);
    expect(state.seqs()).toEqual({ l: 3 });
    state.restart("l");
    // Late frames of the old subscription are ignored.
    expect(state.handleFrame(push("l", 6, "c"))).toEqual([]);
    expect(state.handleFrame({ type: "unsubscribed", sub: "l" })).toEqual([]);
    expect(state.get("l")).toEqual({ items: [item("a")], seq: 0, phase: "subscribing", total: null, write_seq: null });
    const events = state.handleFrame(reset("l", 1, ["q", "r"]));
    expect(events).toMatchObject([{ kind: "change", sub: "l", seq: 1, reset: true }]);
    expect(state.lists()).toEqual({ l: [item("q"), item("r")] });
  });

  it("diffs that do not apply are reported, not applied", () => {
    const state = new ProtocolState({ l: { items: [item("a")], seq: 1 } });
    const events = state.handleFrame({ type: "diffs", sub: "l", seq: 2, diffs: [{ Remove: { index: 4 } }] });
    expect(events).toMatchObject([{ kind: "invalid_diffs", sub: "l", seq: 2 }]);
    expect(state.get("l")).toMatchObject({ items: [item("a")], seq: 1 });
  });

  it("a closing subscription ignores frames until `unsubscribed`; an id reused meanwhile starts at seq 1", () => {
    const state = new ProtocolState({ l: { items: [item("a")], seq: 2 } });
    state.unsubscribe("l");
    expect(state.lists()).toEqual({});
    expect(state.handleFrame(push("l", 3, "b"))).toEqual([]);
    state.subscribe("l");
    expect(state.handleFrame(push("l", 4, "c"))).toEqual([]);
    expect(state.handleFrame({ type: "unsubscribed", sub: "l" })).toEqual([]);
    state.handleFrame(reset("l", 1, ["z"]));
    expect(state.lists()).toEqual({ l: [item("z")] });
    state.unsubscribe("l");
    expect(state.handleFrame({ type: "unsubscribed", sub: "l" })).toEqual([{ kind: "unsubscribed", sub: "l" }]);
    expect(state.ids()).toEqual([]);
  });

  it("prepareResume lists last seqs, drops closing and restarts recovering subscriptions", () => {
    const state = new ProtocolState({
      live: { items: [item("a")], seq: 7 },
      gone: { items: [], seq: 2 },
      broken: { items: [item("b")], seq: 4 },
      fresh: { items: [], seq: 0 },
    });
    state.unsubscribe("gone");
    state.restart("broken");
    expect(state.prepareResume()).toEqual([
      { sub: "live", last_seq: 7 },
      { sub: "broken", last_seq: 0 },
      { sub: "fresh", last_seq: 0 },
    ]);
    const events = state.handleFrame({
      type: "resumed",
      session: "s2",
      subs: [
        { sub: "live", replayed: 0 },
        { sub: "broken", reset: true },
        { sub: "fresh", error: { code: "unknown_collection", message: "no" } },
      ],
    });
    expect(events).toEqual([
      {
        kind: "resumed",
        session: "s2",
        replayed: ["live"],
        reset: ["broken"],
        failed: [{ sub: "fresh", code: "unknown_collection", message: "no" }],
      },
    ]);
    expect(state.session).toBe("s2");
    expect(state.seqs()).toEqual({ live: 7, broken: 0 });
    expect(state.handleFrame(reset("broken", 1, ["n"]))).toMatchObject([{ kind: "change", reset: true }]);
  });

  it("keeps the last `total` across frames without one, and each frame's `write_seq`", () => {
    const state = new ProtocolState();
    state.subscribe("l");
    expect(state.get("l")).toMatchObject({ total: null, write_seq: null });
    expect(state.handleFrame({ ...reset("l", 1, ["a"]), total: 9, write_seq: 4 })).toMatchObject([
      { kind: "change", total: 9, write_seq: 4 },
    ]);
    // No `total`: unchanged.
    expect(state.handleFrame({ ...push("l", 2, "b"), write_seq: 5 })).toMatchObject([
      { kind: "change", total: 9, write_seq: 5 },
    ]);
    expect(state.totals()).toEqual({ l: 9 });
    state.handleFrame({ ...push("l", 3, "c"), total: 11, write_seq: 6 });
    expect(state.get("l")).toMatchObject({ total: 11, write_seq: 6 });
    // A gap applies nothing, its total included.
    state.handleFrame({ ...push("l", 9, "d"), total: 50 });
    expect(state.totals()).toEqual({ l: 11 });
  });

  it("`ended` removes the subscription and frees its id; a restarting one waits for its unsubscribe", () => {
    const state = new ProtocolState();
    state.subscribe("l");
    state.handleFrame(reset("l", 1, ["a"]));
    const ended = { type: "ended", sub: "l", reason: "field_removed", message: "field `x` was removed" };
    expect(state.handleFrame(ended)).toEqual([
      { kind: "ended", sub: "l", reason: "field_removed", message: "field `x` was removed" },
    ]);
    expect(state.has("l")).toBe(false);
    // Frames for it that were in flight are dropped; the id starts afresh at seq 1.
    expect(state.handleFrame(push("l", 2, "b"))).toEqual([]);
    state.subscribe("l");
    expect(state.handleFrame(reset("l", 1, ["z"]))).toMatchObject([{ kind: "change", reset: true }]);

    // Being re-subscribed (after a gap): the old one ended before the unsubscribe reached
    // it, so that is answered `unknown_subscription`, then the new subscribe.
    state.restart("l");
    expect(state.handleFrame({ ...ended, reason: "collection_dropped" })).toEqual([]);
    expect(state.get("l")?.phase).toBe("restarting");
    state.handleFrame({ type: "error", sub: "l", code: "unknown_subscription", message: "no" });
    expect(state.get("l")?.phase).toBe("subscribing");
    // An `ended` of an unknown id reports nothing.
    expect(state.handleFrame({ ...ended, sub: "ghost" })).toEqual([]);
  });

  it("ignores unknown frame types and reports unreadable ones", () => {
    const state = new ProtocolState();
    expect(state.handleFrame({ type: "from_the_future" })).toEqual([]);
    expect(state.handleFrame(42)).toMatchObject([{ kind: "protocol" }]);
    expect(state.handleFrame({ type: "diffs", sub: "x" })).toMatchObject([{ kind: "protocol" }]);
    // Frames of subscriptions it does not hold are dropped.
    expect(state.handleFrame(push("nobody", 1, "a"))).toEqual([]);
  });
});
