// Failover across node URLs: the rotation and backoff (socket-free), OrdoHttp's retry of
// idempotent requests (a fake fetch), and OrdoClient against two real `ordo serve`
// processes holding the same data (written by the test), one of which is SIGKILLed.

import { isDeepStrictEqual } from "node:util";

import { afterEach, describe, expect, it } from "vitest";

import { OrdoHttp } from "../src/http.js";
import { NodeRotation, OrdoClient, type Failover, type LiveList } from "../src/index.js";
import WebSocket from "ws";

import { OrdoServer, ScriptedServer, tappedWebSocket, waitFor, waitForQuery } from "./helpers.js";

describe("NodeRotation", () => {
  it("moves round robin, waits only at the end of a full round, and doubles that wait per round", () => {
    // random() = 1: every delay at its ceiling.
    const nodes = new NodeRotation(["a", "b", "c"], 100, 1000, () => 1);
    expect(nodes.current).toBe("a");
    const seen: [string, number][] = [];
    for (let i = 0; i < 9; i++) {
      const delay = nodes.fail();
      seen.push([nodes.current, delay]);
    }
    expect(seen).toEqual([
      ["b", 50],
      ["c", 50],
      ["a", 100],
      ["b", 50],
      ["c", 50],
      ["a", 200],
      ["b", 50],
      ["c", 50],
      ["a", 400],
    ]);
    // A good connection on `a` starts afresh: the next loss goes to `b` quickly, and a
    // full round costs the first backoff again.
    nodes.succeeded();
    expect([nodes.fail(), nodes.fail(), nodes.fail()]).toEqual([50, 50, 100]);
    expect(nodes.current).toBe("a");
  });

  it("with one URL it is the old backoff: every reconnection waits, capped", () => {
    const nodes = new NodeRotation("ws://x/v1/ws", 250, 1000, () => 1);
    expect(Array.from({ length: 5 }, () => nodes.fail())).toEqual([250, 500, 1000, 1000, 1000]);
    expect(nodes.current).toBe("ws://x/v1/ws");
    nodes.succeeded();
    expect(nodes.fail()).toBe(250);
    // The jitter keeps at least half the ceiling.
    const low = new NodeRotation("u", 250, 1000, () => 0);
    expect(low.fail()).toBe(125);
  });

  it("refuses an empty list", () => {
    expect(() => new NodeRotation([], 1, 1)).toThrow(TypeError);
  });
});

describe("OrdoHttp across nodes", () => {
  /** A fetch where node `dead` refuses connections and the others answer `{"node": url}`. */
  function fakeFetch(dead: Set<string>, status = 200): { fetch: typeof fetch; calls: string[] } {
    const calls: string[] = [];
    const fn = (async (input: string | URL | Request) => {
      const url = String(input);
      calls.push(url);
      const origin = new URL(url).origin;
      if (dead.has(origin)) throw new TypeError("fetch failed (connection refused)");
      const body = status === 503 && origin !== "http://c" ? '{"error":{"code":"lagging","message":"lags"}}' : JSON.stringify({ node: origin });
      return new Response(body, { status: origin === "http://c" ? 200 : status, headers: { "content-type": "application/json" } });
    }) as typeof fetch;
    return { fetch: fn, calls };
  }

  it("sends a GET or a query again on the next node when the connection fails", async () => {
    const { fetch, calls } = fakeFetch(new Set(["http://a"]));
    const http = new OrdoHttp(["http://a", "http://b/"], { fetch });
    expect(http.currentUrl).toBe("http://a");
    expect(await http.collection("rooms")).toEqual({ node: "http://b" });
    expect(calls).toEqual(["http://a/v1/collections/rooms", "http://b/v1/collections/rooms"]);
    expect(http.currentUrl).toBe("http://b");
    calls.length = 0;
    expect(await http.query("rooms", { limit: 1 })).toEqual({ node: "http://b" });
    expect(calls).toEqual(["http://b/v1/collections/rooms/query"]);
  });

  it("never sends a write twice: it rejects, and the next request goes to the next node", async () => {
    const { fetch, calls } = fakeFetch(new Set(["http://a"]));
    const http = new OrdoHttp(["http://a", "http://b"], { fetch });
    await expect(http.write("rooms", [{ op: "remove", id: "x" }])).rejects.toThrow(/connection refused/);
    expect(calls).toEqual(["http://a/v1/collections/rooms/batch"]);
    expect(http.currentUrl).toBe("http://b");
    expect(await http.write("rooms", [{ op: "remove", id: "x" }])).toEqual({ node: "http://b" });
  });

  it("tries each node once, then gives the last failure", async () => {
    const { fetch, calls } = fakeFetch(new Set(["http://a", "http://b"]));
    const http = new OrdoHttp(["http://a", "http://b"], { fetch });
    await expect(http.collection("rooms")).rejects.toThrow(/connection refused/);
    expect(calls).toHaveLength(2);
  });

  it("moves a read on from a node that answers 503 (lagging), not a write", async () => {
    const { fetch, calls } = fakeFetch(new Set(), 503);
    const http = new OrdoHttp(["http://a", "http://c"], { fetch });
    expect(await http.query("rooms", { limit: 1 })).toEqual({ node: "http://c" });
    expect(calls).toEqual(["http://a/v1/collections/rooms/query", "http://c/v1/collections/rooms/query"]);
    const other = new OrdoHttp(["http://a", "http://c"], { fetch });
    await expect(other.write("rooms", [])).rejects.toMatchObject({ status: 503, code: "lagging" });
  });
});

describe("OrdoClient fails over between two ordo serve nodes", () => {
  const SCHEMA = { fields: [{ name: "rank", type: "u64" }] };
  const VIEW = { id: "top", collection: "notes", sort: [{ field: "rank", dir: "desc" as const }], limit: 5 };
  let servers: OrdoServer[] = [];
  let clients: OrdoClient[] = [];
  let nextId = 0;

  afterEach(async () => {
    for (const client of clients) client.close();
    for (const server of servers) await server.dispose();
    clients = [];
    servers = [];
  });

  async function twoNodes(): Promise<[OrdoServer, OrdoServer]> {
    const a = new OrdoServer();
    const b = new OrdoServer();
    servers.push(a, b);
    await Promise.all([a.start(0), b.start(0)]);
    for (const server of [a, b]) await server.ok("PUT", "/v1/collections/notes", SCHEMA);
    return [a, b];
  }

  /** The same batch on each node, in the same order, so both reach the same `seq`. */
  async function writeTo(nodes: OrdoServer[], count = 3): Promise<number> {
    let seq = 0;
    const ops = Array.from({ length: count }, () => {
      nextId += 1;
      return { op: "upsert", id: `n${nextId}`, fields: { rank: (nextId * 37) % 101 } };
    });
    for (const node of nodes) {
      const answer = (await node.ok("POST", "/v1/collections/notes/batch", { ops })) as { seq: number };
      seq = answer.seq;
    }
    return seq;
  }

  function client(urls: string[]) {
    const { ctor, tap } = tappedWebSocket();
    const made = new OrdoClient({ url: urls, WebSocket: ctor, reconnect: { initialDelayMs: 20, maxDelayMs: 200 } });
    clients.push(made);
    const failovers: Failover[] = [];
    made.on("failover", (event) => failovers.push(event));
    return { client: made, tap, failovers };
  }

  /** Every `write_seq` the list shows from now on. */
  function writeSeqs(list: LiveList): (number | null)[] {
    const seen: (number | null)[] = [];
    list.on("change", (change) => seen.push(change.write_seq));
    return seen;
  }

  it("SIGKILL of the node in use: the list moves to the other node, equals its query, and gets its writes", async () => {
    const [a, b] = await twoNodes();
    await writeTo([a, b], 8);
    const { client: c, tap, failovers } = client([a.wsUrl, b.wsUrl]);
    const list = c.subscribe(VIEW);
    await list.ready;
    await waitForQuery(a, list, "on A");
    expect(c.currentUrl).toBe(a.wsUrl);
    const floor = list.floorSeq;
    expect(floor).not.toBeNull();
    const seen = writeSeqs(list);
    let resets = 0;
    list.on("change", (change) => {
      if (change.reset) resets += 1;
    });

    await a.stop("SIGKILL");
    await waitFor(
      () => c.currentUrl === b.wsUrl && c.state === "open",
      () => `client on ${c.currentUrl}, state ${c.state}`,
    );
    await waitForQuery(b, list, "on B after the failover");
    expect(failovers).toEqual([{ from: a.wsUrl, to: b.wsUrl }]);
    // B does not know A's session: the list came back through a Reset, never older than it was.
    expect(resets).toBeGreaterThanOrEqual(1);
    expect(seen.every((seq) => seq !== null && seq >= floor!)).toBe(true);
    const toB = tap.sent[tap.sent.length - 1]![0] as { op: string; subs: { sub: string; min_seq?: number }[] };
    expect(toB).toMatchObject({ op: "resume", subs: [{ sub: "top", min_seq: floor }] });

    // Writes on B after the failover reach the list.
    await writeTo([b], 6);
    await waitForQuery(b, list, "a write on B");
    expect(list.status).toBe("live");
  });

  it("a node behind the list's write_seq is not shown: seq_not_reached, retried until the node catches up", async () => {
    const [a, b] = await twoNodes();
    await writeTo([a, b], 5);
    // A runs ahead of B by two batches (the lag of a slow node).
    const ahead = [await writeTo([a], 4), await writeTo([a], 4)];
    const { client: c, tap } = client([a.wsUrl, b.wsUrl]);
    const list = c.subscribe(VIEW);
    await list.ready;
    await waitForQuery(a, list, "on A");
    const floor = list.floorSeq!;
    expect(floor).toBe(ahead[1]);
    const itemsOnA = list.items;
    const seen = writeSeqs(list);
    const errors: string[] = [];
    list.on("error", (error) => errors.push(error.code));

    await a.stop("SIGKILL");
    // B holds the subscription until it reaches `floor` (5 s), then refuses it; the client
    // keeps A's list and tries again (A is dead, so B again).
    await waitFor(
      () => errors.includes("seq_not_reached"),
      () => `list errors ${JSON.stringify(errors)}, status ${list.status}, client on ${c.currentUrl}`,
      20_000,
    );
    expect(list.status).toBe("subscribing");
    expect(list.items).toBe(itemsOnA);
    expect(seen).toEqual([]);
    const resumes = tap.sent
      .map((sent) => sent[0] as { op?: string; subs?: { sub: string; min_seq?: number }[] } | undefined)
      .filter((first) => first?.op === "resume");
    expect(resumes.length).toBeGreaterThanOrEqual(1);
    for (const resume of resumes) expect(resume!.subs).toMatchObject([{ sub: "top", min_seq: floor }]);

    // B catches up (the same two batches): the list comes back from B, at `floor` or later.
    nextId -= 8;
    await writeTo([b], 4);
    await writeTo([b], 4);
    await waitFor(
      () => list.status === "live" && seen.length >= 1,
      () => `list status ${list.status}, errors ${JSON.stringify(errors)}, client on ${c.currentUrl}`,
      20_000,
    );
    await waitForQuery(b, list, "on B once it caught up");
    expect(isDeepStrictEqual(list.items, itemsOnA)).toBe(true);
    expect(seen.every((seq) => seq !== null && seq >= floor)).toBe(true);
  });
});

describe("OrdoClient and a node that lags (scripted servers)", () => {
  it("a subscribe refused with `lagging` is taken to the next node, not failed", async () => {
    const [lagging, healthy] = await Promise.all([ScriptedServer.start(), ScriptedServer.start()]);
    const client = new OrdoClient({ url: [lagging.url, healthy.url], WebSocket, reconnect: { initialDelayMs: 20, maxDelayMs: 50 } });
    try {
      const list = client.subscribe({ id: "top", collection: "notes", limit: 5 });
      const first = await lagging.nextConnection();
      first.welcome("s1");
      expect(await first.next()).toMatchObject({ op: "subscribe", sub: "top" });
      first.send({ type: "error", sub: "top", code: "lagging", message: "this node lags its cluster's log" });
      const second = await healthy.nextConnection();
      second.welcome("s2");
      // The session of the lagging node is presented (unknown here: every entry resets).
      expect(await second.next()).toMatchObject({ op: "resume", session: "s1", subs: [{ sub: "top", last_seq: 0 }] });
      second.send({ type: "resumed", session: "s3", subs: [{ sub: "top", reset: true }] });
      second.send({ type: "diffs", sub: "top", seq: 1, diffs: [{ Reset: { values: [{ id: "a", fields: {} }] } }], write_seq: 4 });
      await list.ready;
      expect(list.items).toEqual([{ id: "a", fields: {} }]);
      expect(list.error?.code).toBe("lagging");
      expect(client.currentUrl).toBe(healthy.url);
    } finally {
      client.close();
      await Promise.all([lagging.close(), healthy.close()]);
    }
  });
});
