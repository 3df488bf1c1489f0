// End to end: OrdoClient against a real `ordo serve` on loopback. After every step
// each live list must equal a one-shot query of its window (with a deadline as a
// failure guard only).

import { isDeepStrictEqual } from "node:util";

import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";

import {
  OrdoClient,
  OrdoError,
  type ConnectionState,
  type Filter,
  type LiveList,
  type SortKey,
  type SubscribeOptions,
} from "../src/index.js";
import {
  mintToken,
  OrdoServer,
  Rng,
  sleep,
  tappedWebSocket,
  waitFor,
  waitForQuery,
  type SocketTap,
} from "./helpers.js";

const SCHEMA = {
  fields: [
    { name: "name", type: "string" },
    { name: "recency", type: "u64" },
    { name: "unread", type: "u64" },
    { name: "dm", type: "bool" },
  ],
};

const NAMES = ["alice", "Bob", "carol", "Émile", "dave", "Zoë", "eve", "Ålesund", "frank", "ángel", "grace", "中文", "a"];

function randomOps(rng: Rng, n: number): unknown[] {
  const ops: unknown[] = [];
  for (let i = 0; i < n; i++) {
    const id = `!r${rng.below(70)}:example.org`;
    if (rng.chance(0.15)) {
      ops.push({ op: "remove", id });
      continue;
    }
    const fields: Record<string, unknown> = {};
    if (rng.chance(0.7)) fields.name = rng.chance(0.05) ? null : rng.pick(NAMES);
    if (rng.chance(0.8)) fields.recency = rng.below(400);
    if (rng.chance(0.5)) fields.unread = rng.chance(0.1) ? null : rng.below(4);
    if (rng.chance(0.4)) fields.dm = rng.chance(0.5);
    const op: Record<string, unknown> = { op: "upsert", id, fields };
    if (rng.chance(0.3)) op.payload = rng.chance(0.2) ? null : { last: rng.pick(NAMES), n: rng.below(100) };
    ops.push(op);
  }
  return ops;
}

const FILTERS: (Filter | null)[] = [
  null,
  { field: "dm", op: "eq", value: true },
  { field: "unread", op: "gt", value: 0 },
  { all: [{ field: "unread", op: "ge", value: 1 }, { not: { field: "name", is_null: true } }] },
  { any: [{ field: "name", prefix: "a" }, { field: "name", contains: "e" }] },
  { field: "name", in: ["alice", "Bob", "Zoë"] },
  { not: { field: "dm", op: "eq", value: true } },
];

const SORTS: SortKey[][] = [
  [],
  [{ field: "recency", dir: "desc" }],
  [{ field: "name", case_insensitive: true }],
  [{ field: "unread", dir: "desc" }, { field: "recency", dir: "desc" }],
  [{ field: "dm" }, { field: "name", dir: "desc" }],
];

const VIEWS: SubscribeOptions[] = [
  { id: "recent", collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 10 },
  {
    id: "dms",
    collection: "rooms",
    filter: { field: "dm", op: "eq", value: true },
    sort: [{ field: "name", case_insensitive: true }],
    offset: 2,
    limit: 6,
  },
  {
    id: "unread",
    collection: "rooms",
    filter: { all: [{ field: "unread", op: "gt", value: 0 }, { not: { field: "name", is_null: true } }] },
    sort: [
      { field: "unread", dir: "desc" },
      { field: "recency", dir: "desc" },
    ],
    limit: 7,
    fields: ["name", "unread"],
    payload: false,
  },
  { id: "by-id", collection: "Rooms", offset: 5, limit: 15 },
  {
    collection: "rooms",
    filter: { any: [{ field: "name", prefix: "a" }, { field: "name", contains: "é" }] },
    sort: [{ field: "recency" }],
    limit: 5,
  },
];

const server = new OrdoServer();
const clients: OrdoClient[] = [];

function connect(options: { tap?: boolean; initialDelayMs?: number; maxDelayMs?: number } = {}): {
  client: OrdoClient;
  tap: SocketTap | null;
} {
  const tapped = options.tap ? tappedWebSocket() : null;
  const client = new OrdoClient({
    url: server.wsUrl,
    WebSocket: tapped ? tapped.ctor : WebSocket,
    reconnect: { initialDelayMs: options.initialDelayMs ?? 20, maxDelayMs: options.maxDelayMs ?? 200 },
  });
  clients.push(client);
  return { client, tap: tapped?.tap ?? null };
}

async function write(ops: unknown[]): Promise<void> {
  await server.ok("POST", "/v1/collections/rooms/batch", { ops });
}

async function allEqual(lists: LiveList[], label: string): Promise<void> {
  for (const list of lists) await waitForQuery(server, list, label);
}

/** Counts Resets and errors per list from now on. */
function watch(lists: LiveList[]): { resets: Map<string, number>; errors: OrdoError[] } {
  const resets = new Map<string, number>();
  const errors: OrdoError[] = [];
  for (const list of lists) {
    resets.set(list.id, 0);
    list.on("change", (change) => {
      if (change.reset) resets.set(list.id, resets.get(list.id)! + 1);
    });
    list.on("error", (error) => errors.push(error));
  }
  return { resets, errors };
}

async function metric(name: string): Promise<number> {
  const response = await fetch(`${server.httpUrl}/metrics`);
  const text = await response.text();
  const match = new RegExp(`^${name} (\\d+)`, "m").exec(text);
  return match ? Number(match[1]) : Number.NaN;
}

beforeAll(async () => {
  await server.start(0);
  await server.ok("PUT", "/v1/collections/rooms", SCHEMA);
  await write(randomOps(new Rng(7), 120));
});

afterEach(() => {
  for (const client of clients.splice(0)) client.close();
});

afterAll(async () => {
  await server.dispose();
});

describe("OrdoClient against ordo serve", () => {
  it("live lists equal one-shot queries through random writes, range and view changes", async () => {
    const { client } = connect();
    const states: ConnectionState[] = [];
    client.on("state", (state) => states.push(state));
    const lists = VIEWS.map((view) => client.subscribe(view));
    const { errors } = watch(lists);
    await Promise.all(lists.map((list) => list.ready));
    expect(client.state).toBe("open");
    // 64 bits of hex before auth, 128 since.
    expect(client.session).toMatch(/^(?:[0-9a-f]{16}|[0-9a-f]{32})$/);
    expect(lists.map((list) => list.id).slice(0, 4)).toEqual(["recent", "dms", "unread", "by-id"]);
    await allEqual(lists, "after subscribing");

    const rng = new Rng(0x0bd0);
    for (let step = 0; step < 40; step++) {
      await write(randomOps(rng, 1 + rng.below(8)));
      const list = rng.pick(lists);
      const roll = rng.below(4);
      if (roll === 0) list.setRange(rng.below(20), 1 + rng.below(14));
      else if (roll === 1) list.setView({ filter: rng.pick(FILTERS), sort: rng.pick(SORTS) });
      await allEqual(lists, `step ${step}`);
    }
    // Load more on one list: the window grows in place.
    const recent = lists[0]!;
    recent.setRange(0, 30);
    await allEqual([recent], "after load more");
    expect(recent.items.length).toBe(30);

    expect(errors).toEqual([]);
    expect(states).toEqual(["open"]);
    for (const list of lists) expect(list.seq).toBeGreaterThan(0);
  });

  it("every change gives a new items array and the diffs that led to it", async () => {
    const { client } = connect();
    const list = client.subscribe({ collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 5 });
    const seen: { items: readonly unknown[]; seq: number }[] = [];
    list.on("change", (change) => {
      expect(change.items).toBe(list.items);
      seen.push({ items: change.items, seq: list.seq });
    });
    await list.ready;
    await write([{ op: "upsert", id: "!top:example.org", fields: { name: "top", recency: 100_000 } }]);
    await waitForQuery(server, list, "after a write to the top");
    expect(seen.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < seen.length; i++) {
      expect(seen[i]!.items).not.toBe(seen[i - 1]!.items);
      expect(seen[i]!.seq).toBe(seen[i - 1]!.seq + 1);
    }
    await write([{ op: "remove", id: "!top:example.org" }]);
    await waitForQuery(server, list, "after the remove");
  });

  it("lists expose total and writeSeq; a removed field and a dropped collection end them", async () => {
    await server.ok("PUT", "/v1/collections/gone", SCHEMA);
    const rooms = [1, 2, 3, 4].map((n) => ({ op: "upsert", id: `!g${n}`, fields: { name: `g${n}`, recency: n } }));
    await server.ok("POST", "/v1/collections/gone/batch", { ops: rooms });
    await server.ok("POST", "/v1/collections/gone/fields", { name: "pinned", type: "bool", default: false });
    const { client } = connect();
    const clientEnded: unknown[] = [];
    client.on("ended", (ended) => clientEnded.push(ended));
    const sort: SortKey[] = [{ field: "recency", dir: "desc" }];
    const all = client.subscribe({ id: "all", collection: "gone", sort, limit: 2 });
    const pins = client.subscribe({
      id: "pins",
      collection: "gone",
      filter: { field: "pinned", op: "eq", value: false },
      sort,
      limit: 2,
    });
    await Promise.all([all.ready, pins.ready]);
    expect(all.total).toBe(4);
    const written = (await server.ok("POST", "/v1/collections/gone/batch", {
      ops: [{ op: "upsert", id: "!g5", fields: { name: "g5", recency: 5 } }],
    })) as { seq: number };
    await waitFor(
      () => all.total === 5 && (all.writeSeq ?? 0) >= written.seq,
      () => `all: total ${all.total}, writeSeq ${all.writeSeq}`,
    );
    const pinsEnded: unknown[] = [];
    pins.on("ended", (ended) => pinsEnded.push(ended));

    await server.ok("DELETE", "/v1/collections/gone/fields/pinned");
    await waitFor(
      () => pins.status === "ended",
      () => `pins is ${pins.status}`,
    );
    expect(pins.ended).toMatchObject({ sub: "pins", reason: "field_removed" });
    expect(pinsEnded).toEqual([pins.ended]);
    expect(clientEnded).toEqual([pins.ended]);
    // Not re-subscribed; the list keeps its last items and ignores changes.
    expect(pins.items.length).toBe(2);
    pins.setRange(0, 3);
    pins.close();
    expect(pins.status).toBe("ended");
    // The other list goes on, now without the field.
    await waitForQuery(server, all, "after the field was removed");
    // The id is free again.
    const again = client.subscribe({ id: "pins", collection: "gone", sort, limit: 1 });
    await again.ready;

    await server.ok("DELETE", "/v1/collections/gone");
    await waitFor(
      () => all.status === "ended" && again.status === "ended",
      () => `all is ${all.status}, pins is ${again.status}`,
    );
    expect(all.ended?.reason).toBe("collection_dropped");
    expect(clientEnded.map((e) => (e as { sub: string; reason: string }).reason)).toEqual([
      "field_removed",
      "collection_dropped",
      "collection_dropped",
    ]);
    expect(client.state).toBe("open");
  });

  it("a subscribe with an unknown field rejects ready with invalid_view", async () => {
    const { client } = connect();
    const good = client.subscribe({ collection: "rooms", limit: 3 });
    const badSort = client.subscribe({ id: "bad-sort", collection: "rooms", sort: [{ field: "recncy" }], limit: 3 });
    const badFilter = client.subscribe({
      collection: "rooms",
      filter: { field: "nope", op: "eq", value: 1 },
      limit: 3,
    });
    const noCollection = client.subscribe({ collection: "roms", limit: 3 });
    const errors: OrdoError[] = [];
    badSort.on("error", (error) => errors.push(error));

    const error = await badSort.ready.then(
      () => null,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(OrdoError);
    expect((error as OrdoError).code).toBe("invalid_view");
    expect((error as OrdoError).sub).toBe("bad-sort");
    expect(badSort.status).toBe("closed");
    expect(errors.map((e) => e.code)).toEqual(["invalid_view"]);
    await expect(badFilter.ready).rejects.toMatchObject({ code: "invalid_view" });
    await expect(noCollection.ready).rejects.toMatchObject({ code: "unknown_collection" });
    // The connection and the other subscription are unaffected.
    await good.ready;
    await waitForQuery(server, good, "the good list");
    expect(client.state).toBe("open");
    // The refused id is free again.
    const again = client.subscribe({ id: "bad-sort", collection: "rooms", sort: [{ field: "recency" }], limit: 3 });
    await again.ready;
    await waitForQuery(server, again, "the id reused");
  });

  it("a refused set_view is reported and the list keeps its view", async () => {
    const { client } = connect();
    const list = client.subscribe({ collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 4 });
    await list.ready;
    const errors: OrdoError[] = [];
    list.on("error", (error) => errors.push(error));
    list.setView({ sort: [{ field: "nope" }] });
    await waitFor(
      () => errors.length > 0,
      () => "no error for the refused set_view",
    );
    expect(errors[0]!.code).toBe("invalid_view");
    expect(list.view.sort).toEqual([{ field: "recency", dir: "desc" }]);
    expect(list.status).toBe("live");
    await write([{ op: "upsert", id: "!sv:example.org", fields: { name: "sv", recency: 99_999 } }]);
    await waitForQuery(server, list, "after the refused set_view");
    await write([{ op: "remove", id: "!sv:example.org" }]);
    await waitForQuery(server, list, "after the remove");
  });

  it("a seq gap (a dropped frame) is reported and recovered by re-subscribing", async () => {
    const { client, tap } = connect({ tap: true });
    const list = client.subscribe({ id: "gappy", collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 6 });
    const { errors, resets } = watch([list]);
    await list.ready;
    let dropped = false;
    tap!.dropIncoming = (frame) => {
      if (!dropped && frame.type === "diffs" && frame.sub === "gappy") {
        dropped = true;
        return true;
      }
      return false;
    };
    // Each write enters the window at the top: the first one's frame is dropped, the
    // second one's arrives with a seq one too far.
    await write([{ op: "upsert", id: "!gap0:example.org", fields: { name: "gap 0", recency: 200_000 } }]);
    await waitFor(
      () => dropped,
      () => "the first frame after the write never came",
    );
    await write([{ op: "upsert", id: "!gap1:example.org", fields: { name: "gap 1", recency: 200_001 } }]);
    await waitFor(
      () => errors.length > 0,
      () => "no gap reported",
    );
    expect(errors[0]!.code).toBe("gap");
    expect(errors[0]!.sub).toBe("gappy");
    await waitForQuery(server, list, "after the gap");
    expect(resets.get("gappy")).toBeGreaterThanOrEqual(1);
    const ops = tap!.sent[0]!.map((message) => (message as { op: string; sub?: string }).op);
    expect(ops).toEqual(["subscribe", "unsubscribe", "subscribe"]);
    await write([
      { op: "remove", id: "!gap0:example.org" },
      { op: "remove", id: "!gap1:example.org" },
    ]);
    await waitForQuery(server, list, "after cleaning up");
  });

  it("a dropped connection resumes its session and replays the missed frames", async () => {
    const { client, tap } = connect({ tap: true, initialDelayMs: 20, maxDelayMs: 50 });
    const lists = VIEWS.slice(0, 3).map((view) => client.subscribe(view));
    const { resets } = watch(lists);
    await Promise.all(lists.map((list) => list.ready));
    await allEqual(lists, "before the drop");
    const session = client.session;
    for (const list of lists) resets.set(list.id, 0);

    // Hold the reconnection (it is refused) until the server has parked the session.
    tap!.redirect = "ws://127.0.0.1:1/v1/ws"; // nothing listens there: refused
    tap!.sockets[0]!.terminate();
    await waitFor(
      () => client.state === "reconnecting",
      () => `state is ${client.state}`,
    );
    await waitFor(
      async () => (await metric("ordo_connections")) === 0,
      () => "the server still counts a connection",
    );
    const rng = new Rng(99);
    for (let i = 0; i < 5; i++) await write(randomOps(rng, 4));
    tap!.redirect = null;

    await waitFor(
      () => client.state === "open",
      () => `state is ${client.state}`,
    );
    await allEqual(lists, "after the resume");
    const socket = tap!.sockets.length - 1;
    const first = tap!.sent[socket]![0] as { op: string; session: string; subs: { sub: string; last_seq: number }[] };
    expect(first.op).toBe("resume");
    expect(first.session).toBe(session);
    expect(first.subs.map((entry) => entry.sub).sort()).toEqual(lists.map((list) => list.id).sort());
    const resumed = tap!.received[socket]!.find((frame) => (frame as { type: string }).type === "resumed") as {
      session: string;
      subs: { sub: string; replayed?: number; reset?: boolean }[];
    };
    expect(resumed.subs.every((entry) => typeof entry.replayed === "number")).toBe(true);
    for (const list of lists) expect(resets.get(list.id)).toBe(0);
    // The session to name next time is the one `resumed` gave (a new one at every resume since auth).
    expect(client.session).toBe(resumed.session);
  });

  for (const signal of ["SIGTERM", "SIGKILL"] as const) {
    it(`lists recover through resume after a ${signal} and a restart on the same data and port`, async () => {
      const { client, tap } = connect({ tap: true, initialDelayMs: 50, maxDelayMs: 300 });
      const lists = VIEWS.map((view) => client.subscribe(view));
      const { resets, errors } = watch(lists);
      await Promise.all(lists.map((list) => list.ready));
      await allEqual(lists, `before ${signal}`);
      const port = server.port;
      const closeCodes: number[] = [];
      tap!.sockets[0]!.on("close", (code) => closeCodes.push(code));
      for (const list of lists) resets.set(list.id, 0);

      await server.stop(signal);
      await waitFor(
        () => client.state === "reconnecting",
        () => `state is ${client.state}`,
      );
      if (signal === "SIGTERM") expect(closeCodes).toEqual([1001]);
      // Changed while disconnected: the resume carries the new window.
      lists[0]!.setRange(3, 8);
      lists[1]!.setView({ filter: null, sort: [{ field: "recency", dir: "desc" }] });

      await server.start(port);
      expect(server.port).toBe(port);
      await waitFor(
        () => client.state === "open",
        () => `state is ${client.state}`,
      );
      await allEqual(lists, `after ${signal} and restart`);
      for (const list of lists) expect(resets.get(list.id), `resets of ${list.id}`).toBeGreaterThanOrEqual(1);
      const last = tap!.sent[tap!.sent.length - 1]!;
      const resume = last[0] as { op: string; subs: { sub: string; offset: number; limit: number; last_seq: number }[] };
      expect(resume.op).toBe("resume");
      expect(resume.subs.find((entry) => entry.sub === "recent")).toMatchObject({ offset: 3, limit: 8 });
      expect(errors).toEqual([]);

      await write(randomOps(new Rng(signal.length), 10));
      await allEqual(lists, `a write after ${signal}`);
    });
  }

  it("close() ends the client: pending lists reject with `closed`", async () => {
    const { client } = connect();
    const list = client.subscribe({ collection: "rooms", limit: 2 });
    const states: ConnectionState[] = [];
    client.on("state", (state) => states.push(state));
    client.close();
    await expect(list.ready).rejects.toMatchObject({ code: "closed" });
    expect(client.state).toBe("closed");
    expect(states).toEqual(["closed"]);
    expect(() => client.subscribe({ collection: "rooms", limit: 1 })).toThrow(OrdoError);
  });

  it("closing a list unsubscribes it; its id can be used again", async () => {
    const { client, tap } = connect({ tap: true });
    const first = client.subscribe({ id: "again", collection: "rooms", sort: [{ field: "recency" }], limit: 3 });
    await first.ready;
    first.close();
    expect(first.status).toBe("closed");
    const second = client.subscribe({ id: "again", collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 4 });
    await second.ready;
    await waitForQuery(server, second, "the id reused at once");
    await waitFor(
      () => tap!.received[0]!.some((frame) => isDeepStrictEqual(frame, { type: "unsubscribed", sub: "again" })),
      () => "no unsubscribed frame",
    );
    expect(second.items.length).toBe(4);
  });
});

// The same client against a server with auth (`--auth-secret-file`), tokens minted
// with `ordo token`: the handshake, refresh on the live connection, refused tokens,
// close code 4401, and resume (a new session every time).
describe("OrdoClient against ordo serve with auth", () => {
  const secure = new OrdoServer();
  let secretFile = "";

  /** A token provider minting tokens for `sub` with `ordo token`; counts its calls. */
  function minter(sub: string, role: string, ttl = 600) {
    const minted: string[] = [];
    const get = async () => {
      const token = await mintToken(secretFile, { sub, role, ttl });
      minted.push(token);
      return token;
    };
    return { get, minted };
  }

  function connectSecure(options: { tokenProvider?: () => Promise<string>; token?: string }) {
    const tapped = tappedWebSocket();
    const client = new OrdoClient({
      url: secure.wsUrl,
      WebSocket: tapped.ctor,
      reconnect: { initialDelayMs: 20, maxDelayMs: 200 },
      ...options,
    });
    clients.push(client);
    const errors: OrdoError[] = [];
    client.on("error", (error) => errors.push(error));
    return { client, tap: tapped.tap, errors };
  }

  const framesOf = (tap: SocketTap, type: string) =>
    tap.received.flat().filter((frame) => (frame as { type?: string }).type === type) as Record<string, unknown>[];

  beforeAll(async () => {
    secretFile = await secure.useAuth();
    // A connection must send `auth` within 2 s (10 by default): the 4401 test waits less.
    secure.args.push("--auth-timeout", "2");
    await secure.start(0);
    await secure.ok("PUT", "/v1/collections/rooms", SCHEMA);
    await secure.ok("POST", "/v1/collections/rooms/batch", { ops: randomOps(new Rng(11), 80) });
    // Readers and writers read `rooms`, writers write it (admins need no rule).
    await secure.ok("PUT", "/v1/rules", {
      rules: [
        { collection: "rooms", roles: ["reader", "writer"], read: true },
        { collection: "rooms", roles: ["writer"], write: true },
      ],
    });
  });

  afterAll(async () => {
    await secure.dispose();
  });

  it("HTTP without a token is refused with 401", async () => {
    const { status, json } = await secure.request("POST", "/v1/collections/rooms/query", { limit: 1 }, null);
    expect(status).toBe(401);
    expect(json).toMatchObject({ error: { code: "unauthorized" } });
  });

  it("authenticates after welcome, then subscribes; lists equal queries made with the same token", async () => {
    const writer = minter("alice", "writer");
    const { client, tap, errors } = connectSecure({ tokenProvider: writer.get });
    const lists = VIEWS.slice(0, 3).map((view) => client.subscribe(view));
    await Promise.all(lists.map((list) => list.ready));
    const welcome = tap.received[0]![0] as { type: string; auth: unknown };
    expect(welcome).toMatchObject({ type: "welcome", auth: "required" });
    const sent = tap.sent[0]!.map((message) => (message as { op: string }).op);
    expect(sent[0]).toBe("auth");
    expect(sent.slice(1).every((op) => op === "subscribe")).toBe(true);
    expect(client.identity).toMatchObject({ sub: "alice", role: "writer" });
    const token = writer.minted[0]!;
    for (const list of lists) await waitForQuery(secure, list, "after subscribing", 15_000, token);
    // A write by the writer itself reaches its lists.
    await secure.ok("POST", "/v1/collections/rooms/batch", { ops: randomOps(new Rng(12), 6) }, token);
    for (const list of lists) await waitForQuery(secure, list, "after a write", 15_000, token);
    expect(errors).toEqual([]);
  });

  it("refreshes short-lived tokens on the live connection", async () => {
    const shortLived = minter("alice", "reader", 3);
    const { client, tap, errors } = connectSecure({ tokenProvider: shortLived.get });
    const list = client.subscribe({ collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 5 });
    await list.ready;
    // A 3 s token is refreshed 0.6 s before its exp: three tokens by 5 s.
    await waitFor(
      () => shortLived.minted.length >= 3 && framesOf(tap, "authed").length >= 3,
      () => `${shortLived.minted.length} tokens minted, ${framesOf(tap, "authed").length} authed`,
      10_000,
    );
    expect(tap.sockets).toHaveLength(1);
    expect(framesOf(tap, "auth_expired")).toEqual([]);
    const latest = shortLived.minted[shortLived.minted.length - 1]!;
    await secure.ok("POST", "/v1/collections/rooms/batch", {
      ops: [{ op: "upsert", id: "!fresh:example.org", fields: { name: "fresh", recency: 900_000 } }],
    });
    await waitForQuery(secure, list, "after the refreshes", 15_000, latest);
    expect(errors).toEqual([]);
    expect(client.state).toBe("open");
    await secure.ok("POST", "/v1/collections/rooms/batch", { ops: [{ op: "remove", id: "!fresh:example.org" }] });
  });

  it("a refused token is reported and retried with the provider until one is accepted", async () => {
    let calls = 0;
    const good = minter("alice", "reader");
    const { client, errors } = connectSecure({
      tokenProvider: async () => {
        calls += 1;
        // Signed with another secret, then a good one.
        return calls === 1 ? "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4IiwiZXhwIjo0MTAyNDQ0ODAwfQ.AAAA" : good.get();
      },
    });
    const list = client.subscribe({ collection: "rooms", limit: 4 });
    await list.ready;
    expect(errors[0]).toMatchObject({ code: "unauthorized" });
    expect(calls).toBe(2);
    await waitForQuery(secure, list, "after the retry", 15_000, good.minted[0]!);
  });

  it("a client without a token is told the server requires one", async () => {
    const { client, errors } = connectSecure({});
    const list = client.subscribe({ collection: "rooms", limit: 4 });
    await waitFor(
      () => errors.some((error) => error.code === "unauthorized"),
      () => `errors: ${JSON.stringify(errors.map((error) => error.code))}`,
    );
    await sleep(300);
    expect(list.status).not.toBe("live");
  });

  it("close code 4401 (no auth in time): it reconnects with a fresh token and goes on", async () => {
    let calls = 0;
    const reader = minter("bob", "reader");
    const { client, tap, errors } = connectSecure({
      tokenProvider: async () => {
        calls += 1;
        // The first token comes too late: the server closes with 4401 after 2 s (--auth-timeout).
        if (calls === 1) await sleep(4_000);
        return reader.get();
      },
    });
    const codes: number[] = [];
    const list = client.subscribe({ collection: "rooms", sort: [{ field: "name" }], limit: 4 });
    await waitFor(
      () => tap.sockets.length > 0,
      () => "no socket",
    );
    tap.sockets[0]!.on("close", (code) => codes.push(code));
    await list.ready;
    expect(codes).toEqual([4401]);
    expect(errors.map((error) => error.code)).toContain("unauthorized");
    expect(calls).toBeGreaterThanOrEqual(2);
    await waitForQuery(secure, list, "after the 4401", 15_000, reader.minted[reader.minted.length - 1]!);
  });

  it("resumes after a dropped connection: auth first, then resume; a new session each time", async () => {
    const reader = minter("carol", "reader");
    const { client, tap } = connectSecure({ tokenProvider: reader.get });
    const list = client.subscribe({ id: "resumable", collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 6 });
    await list.ready;
    const sessions = [client.session!];
    for (let drop = 1; drop <= 2; drop++) {
      tap.sockets[tap.sockets.length - 1]!.terminate();
      await waitFor(
        () => tap.sockets.length === drop + 1 && framesOf(tap, "resumed").length === drop,
        () => `${tap.sockets.length} sockets, ${framesOf(tap, "resumed").length} resumed`,
      );
      const sent = tap.sent[drop]!.map((message) => message as { op: string; session?: string });
      expect(sent.map((message) => message.op).slice(0, 2)).toEqual(["auth", "resume"]);
      expect(sent[1]!.session).toBe(sessions[drop - 1]);
      const resumed = framesOf(tap, "resumed")[drop - 1]!;
      expect(resumed.session).toMatch(/^[0-9a-f]{32}$/);
      expect(sessions).not.toContain(resumed.session);
      await waitFor(
        () => client.session === resumed.session,
        () => `client.session ${client.session}, resumed ${resumed.session as string}`,
      );
      sessions.push(resumed.session as string);
    }
    await waitForQuery(secure, list, "after two resumes", 15_000, reader.minted[reader.minted.length - 1]!);
  });
});
