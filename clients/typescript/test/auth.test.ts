// The client's side of auth and its robustness against unreadable frames, against a
// scripted server (each frame written by the test): the `auth` handshake after
// `welcome`, refresh before expiry and on `auth_expired`, reconnection after close
// code 4401, the session of every `resumed`, and recovery from frames it cannot read
// or whose window digest is not the list's.

import { afterEach, beforeEach, describe, expect, it } from "vitest";
import WebSocket from "ws";

import { jwtClaims, jwtTimes, refreshDelayMs } from "../src/auth.js";
import { OrdoClient, OrdoError, windowDigest, type AuthIdentity, type ConnectionState, type Item } from "../src/index.js";
import { fakeJwt, ScriptedServer, waitFor, type ScriptedConnection } from "./helpers.js";

let server: ScriptedServer;
const clients: OrdoClient[] = [];

beforeEach(async () => {
  server = await ScriptedServer.start();
});

afterEach(async () => {
  for (const client of clients.splice(0)) client.close();
  await server.close();
});

const nowSecs = () => Math.floor(Date.now() / 1000);
const item = (id: string): Item => ({ id, fields: { name: id } });
const reset = (sub: string, seq: number, ids: string[]) => ({
  type: "diffs",
  sub,
  seq,
  diffs: [{ Reset: { values: ids.map(item) } }],
});

/** A provider of distinct tokens for user `alice`, each living `ttl` seconds; counts its calls. */
function provider(ttl = 3600) {
  const tokens: string[] = [];
  const get = async () => {
    const iat = nowSecs();
    const token = fakeJwt({ sub: "alice", role: "reader", iat, exp: iat + ttl, jti: `t${tokens.length + 1}` });
    tokens.push(token);
    return token;
  };
  return { get, tokens };
}

function connect(options: { token?: string; tokenProvider?: () => Promise<string> } = {}) {
  const client = new OrdoClient({
    url: server.url,
    WebSocket,
    reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
    ...options,
  });
  clients.push(client);
  const errors: OrdoError[] = [];
  const states: ConnectionState[] = [];
  const identities: AuthIdentity[] = [];
  client.on("error", (error) => errors.push(error));
  client.on("state", (state) => states.push(state));
  client.on("auth", (identity) => identities.push(identity));
  return { client, errors, states, identities };
}

const authed = (expiresAt: number) => ({ type: "authed", sub: "alice", role: "reader", expires_at: expiresAt });

/** Welcome with auth required, expect `auth`, answer `authed`: returns the token sent. */
async function handshake(connection: ScriptedConnection, session: string): Promise<string> {
  connection.welcome(session, "required");
  const auth = await connection.next();
  expect(auth.op).toBe("auth");
  const token = auth.token as string;
  connection.send(authed(jwtTimes(token).exp ?? nowSecs() + 3600));
  return token;
}

describe("JWT reading", () => {
  it("reads exp and iat from the payload (base64url, no verification)", () => {
    // A payload whose base64url has both `-` and `_` and needs padding.
    const token = fakeJwt({ sub: "ü?>>~", exp: 1732262400, iat: 1732262100 });
    expect(jwtClaims(token)).toEqual({ sub: "ü?>>~", exp: 1732262400, iat: 1732262100 });
    expect(jwtTimes(token)).toEqual({ exp: 1732262400, iat: 1732262100 });
    expect(jwtTimes("not a jwt")).toEqual({ exp: null, iat: null });
    expect(jwtTimes("a.%%%.c")).toEqual({ exp: null, iat: null });
  });

  it("refreshes at exp - min(60 s, lifetime / 5)", () => {
    const now = 1_000_000_000_000;
    const secs = now / 1000;
    // 300 s token: a minute early.
    expect(refreshDelayMs(secs + 300, secs, now)).toBe(240_000);
    // 100 s token: 20 s early.
    expect(refreshDelayMs(secs + 100, secs, now)).toBe(80_000);
    // No iat: the lifetime counts from now.
    expect(refreshDelayMs(secs + 10, null, now)).toBe(8_000);
    // Already past: soon, but not in a tight loop.
    expect(refreshDelayMs(secs - 5, secs - 100, now)).toBe(1_000);
    expect(refreshDelayMs(null, null, now)).toBeNull();
  });
});

describe("OrdoClient auth", () => {
  it("sends auth after welcome and waits for authed before subscribing", async () => {
    const tokens = provider();
    const { client, identities, states } = connect({ tokenProvider: tokens.get });
    const list = client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    connection.welcome("s1", "required");
    const auth = await connection.next();
    expect(auth).toEqual({ op: "auth", token: tokens.tokens[0] });
    // Nothing else goes out before `authed`.
    await connection.nothingFor(150);
    expect(client.state).toBe("connecting");
    connection.send(authed(nowSecs() + 3600));
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "rooms", collection: "rooms", limit: 5 });
    connection.send(reset("rooms", 1, ["a", "b"]));
    await list.ready;
    expect(list.items.map((room) => room.id)).toEqual(["a", "b"]);
    expect(states).toEqual(["open"]);
    expect(client.identity).toMatchObject({ sub: "alice", role: "reader" });
    expect(identities).toHaveLength(1);
  });

  it("a fixed token works the same way", async () => {
    const token = fakeJwt({ sub: "alice", exp: nowSecs() + 3600 });
    const { client } = connect({ token });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    expect(await handshake(connection, "s1")).toBe(token);
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "rooms" });
  });

  it("sends no auth to a server without auth, token or not", async () => {
    const tokens = provider();
    const { client } = connect({ tokenProvider: tokens.get });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const first = await server.nextConnection();
    first.welcome("s1", "none");
    expect(await first.next()).toMatchObject({ op: "subscribe", sub: "rooms" });
    // An older server says nothing about auth: the same.
    first.close(1001);
    const second = await server.nextConnection();
    second.welcome("s2");
    expect(await second.next()).toMatchObject({ op: "resume", session: "s1" });
    expect(tokens.tokens).toEqual([]);
  });

  it("refreshes the token on the live connection before it expires", async () => {
    const tokens = provider(3);
    const { client, states } = connect({ tokenProvider: tokens.get });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    const first = await handshake(connection, "s1");
    expect(await connection.next()).toMatchObject({ op: "subscribe" });
    // A 3 s token is refreshed 0.6 s before its exp.
    const refresh = await connection.next(4_000);
    expect(refresh.op).toBe("auth");
    expect(refresh.token).not.toBe(first);
    expect(refresh.token).toBe(tokens.tokens[1]);
    expect(Date.now()).toBeLessThan(jwtTimes(first).exp! * 1000);
    connection.send(authed(jwtTimes(refresh.token as string).exp!));
    expect(server.connections).toHaveLength(1);
    expect(states).toEqual(["open"]);
  });

  it("refreshes at once on auth_expired", async () => {
    const tokens = provider(3600);
    const { client } = connect({ tokenProvider: tokens.get });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    await handshake(connection, "s1");
    expect(await connection.next()).toMatchObject({ op: "subscribe" });
    connection.send({ type: "auth_expired", grace_secs: 30 });
    expect(await connection.next(1_000)).toEqual({ op: "auth", token: tokens.tokens[1] });
    expect(tokens.tokens).toHaveLength(2);
  });

  it("after close code 4401 it reconnects with a fresh token, then resumes; it keeps every resumed session", async () => {
    const tokens = provider();
    const { client, errors, states } = connect({ tokenProvider: tokens.get });
    const list = client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const first = await server.nextConnection();
    await handshake(first, "s1");
    expect(await first.next()).toMatchObject({ op: "subscribe" });
    first.send(reset("rooms", 1, ["a"]));
    await list.ready;

    first.close(4401, "token expired");
    const second = await server.nextConnection();
    const token2 = await handshake(second, "s2");
    expect(token2).toBe(tokens.tokens[1]);
    // `resume` is the first message after `auth`, naming the first connection's session.
    const resume = await second.next();
    expect(resume).toMatchObject({ op: "resume", session: "s1", subs: [{ sub: "rooms", last_seq: 1 }] });
    second.send({ type: "resumed", session: "s3", subs: [{ sub: "rooms", replayed: 1 }] });
    second.send({ type: "diffs", sub: "rooms", seq: 2, diffs: [{ PushBack: { value: item("b") } }] });
    await waitFor(
      () => list.items.length === 2,
      () => `the list holds ${JSON.stringify(list.items)}`,
    );
    expect(errors.map((error) => error.code)).toEqual(["unauthorized"]);

    // The next resume names the session `resumed` gave.
    second.close(1001);
    const third = await server.nextConnection();
    expect(await handshake(third, "s4")).toBe(tokens.tokens[2]);
    expect(await third.next()).toMatchObject({ op: "resume", session: "s3", subs: [{ sub: "rooms", last_seq: 2 }] });
    expect(states).toEqual(["open", "reconnecting", "open", "reconnecting", "open"]);
  });

  it("a refused token is reported; it connects again with backoff and asks the provider again", async () => {
    const tokens = provider();
    const { client, errors } = connect({ tokenProvider: tokens.get });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const first = await server.nextConnection();
    first.welcome("s1", "required");
    expect(await first.next()).toMatchObject({ op: "auth" });
    first.send({ type: "error", code: "unauthorized", message: "the token has expired" });
    await first.closed;
    const second = await server.nextConnection();
    const token = await handshake(second, "s2");
    expect(token).toBe(tokens.tokens[1]);
    // The first connection's session was never used: the lists are subscribed afresh.
    expect(await second.next()).toMatchObject({ op: "subscribe", sub: "rooms" });
    expect(errors.map((error) => [error.code, error.message])).toEqual([["unauthorized", "the token has expired"]]);
  });

  it("a provider that throws is reported and asked again on the next connection", async () => {
    let calls = 0;
    const { client, errors } = connect({
      tokenProvider: async () => {
        calls += 1;
        if (calls === 1) throw new Error("the login service is down");
        return fakeJwt({ sub: "alice", exp: nowSecs() + 3600 });
      },
    });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const first = await server.nextConnection();
    first.welcome("s1", "required");
    await first.closed;
    const second = await server.nextConnection();
    await handshake(second, "s2");
    expect(await second.next()).toMatchObject({ op: "subscribe" });
    expect(errors[0]).toMatchObject({ code: "unauthorized" });
    expect(errors[0]!.message).toContain("the login service is down");
    expect(calls).toBe(2);
  });

  it("the provider is called at every reconnection", async () => {
    const tokens = provider();
    const { client } = connect({ tokenProvider: tokens.get });
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    for (let n = 1; n <= 3; n++) {
      const connection = await server.nextConnection();
      expect(await handshake(connection, `s${n}`)).toBe(tokens.tokens[n - 1]);
      await connection.next();
      connection.close(1001);
    }
    expect(tokens.tokens).toHaveLength(3);
  });

  it("a refused refresh (forbidden) is reported and the connection stays", async () => {
    const tokens = provider();
    const { client, errors } = connect({ tokenProvider: tokens.get });
    const list = client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    await handshake(connection, "s1");
    await connection.next();
    connection.send(reset("rooms", 1, ["a"]));
    await list.ready;
    client.refreshToken();
    expect(await connection.next()).toMatchObject({ op: "auth", token: tokens.tokens[1] });
    connection.send({ type: "error", code: "forbidden", message: "another identity" });
    connection.send({ type: "diffs", sub: "rooms", seq: 2, diffs: [{ PushBack: { value: item("b") } }] });
    await waitFor(
      () => list.items.length === 2,
      () => `the list holds ${JSON.stringify(list.items)}`,
    );
    expect(errors.map((error) => error.code)).toEqual(["forbidden"]);
    expect(client.state).toBe("open");
    expect(server.connections).toHaveLength(1);
  });

  it("without a token, a server that requires one is reported", async () => {
    const { client, errors } = connect();
    client.subscribe({ id: "rooms", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    connection.welcome("s1", "required");
    expect(await connection.next()).toMatchObject({ op: "subscribe" });
    expect(errors.map((error) => error.code)).toEqual(["unauthorized"]);
  });
});

describe("OrdoClient and frames it cannot read", () => {
  /** A connection with lists `a` and `b` live at seq 1. */
  async function twoLists() {
    const context = connect();
    const a = context.client.subscribe({ id: "a", collection: "rooms", limit: 5 });
    const b = context.client.subscribe({ id: "b", collection: "rooms", limit: 5 });
    const connection = await server.nextConnection();
    connection.welcome("s1", "none");
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "a" });
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "b" });
    connection.send(reset("a", 1, ["a1"]));
    connection.send(reset("b", 1, ["b1"]));
    await Promise.all([a.ready, b.ready]);
    return { ...context, a, b, connection };
  }

  /** Plays the server's part of a re-subscription: expects unsubscribe + subscribe, answers with a Reset. */
  async function resubscribed(connection: ScriptedConnection, sub: string, ids: string[]) {
    expect(await connection.next()).toMatchObject({ op: "unsubscribe", sub });
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub });
    connection.send({ type: "unsubscribed", sub });
    connection.send(reset(sub, 1, ids));
  }

  const ids = (list: { items: readonly Item[] }) => list.items.map((room) => room.id);

  it("a frame of the wrong shape re-subscribes its list; the others go on", async () => {
    const { a, b, connection, client, errors } = await twoLists();
    const listErrors: OrdoError[] = [];
    a.on("error", (error) => listErrors.push(error));
    connection.send({ type: "diffs", sub: "a", seq: 2, diffs: "not a list" });
    await resubscribed(connection, "a", ["a2"]);
    await waitFor(
      () => ids(a).join() === "a2",
      () => `a holds ${ids(a)}`,
    );
    expect(listErrors.map((error) => error.code)).toEqual(["protocol"]);
    // `b` was not touched and still follows its frames.
    connection.send({ type: "diffs", sub: "b", seq: 2, diffs: [{ PushBack: { value: item("b2") } }] });
    await waitFor(
      () => ids(b).join() === "b1,b2",
      () => `b holds ${ids(b)}`,
    );
    expect(errors).toEqual([]);
    expect(client.state).toBe("open");
    expect(server.connections).toHaveLength(1);
  });

  it("a frame that is not JSON re-subscribes every list, and the client recovers", async () => {
    const { a, b, connection, client, errors, states } = await twoLists();
    connection.sendRaw('{"type":"diffs","sub":"a","seq":2,"diffs":[{"PushBack":');
    await resubscribed(connection, "a", ["a3"]);
    await resubscribed(connection, "b", ["b3"]);
    await waitFor(
      () => ids(a).join() === "a3" && ids(b).join() === "b3",
      () => `a holds ${ids(a)}, b holds ${ids(b)}`,
    );
    expect(errors.map((error) => error.code)).toEqual(["protocol"]);
    // Later frames apply as usual.
    connection.send({ type: "diffs", sub: "a", seq: 2, diffs: [{ PushBack: { value: item("a4") } }] });
    await waitFor(
      () => ids(a).join() === "a3,a4",
      () => `a holds ${ids(a)}`,
    );
    expect(client.state).toBe("open");
    expect(states).toEqual(["open"]);
  });

  it("frames nested too deep, of no known shape, or with items that are not items: each recovered", async () => {
    const { a, b, connection, client, errors } = await twoLists();
    // Parses, but too deep to print or walk: its list is re-subscribed.
    const depth = 200_000;
    connection.sendRaw(`{"type":"diffs","sub":"b","seq":2,"diffs":${"[".repeat(depth)}${"]".repeat(depth)}}`);
    await resubscribed(connection, "b", ["b5"]);
    await waitFor(
      () => ids(b).join() === "b5",
      () => `b holds ${ids(b)}`,
    );
    // An item without an id: the diffs do not apply.
    connection.send({ type: "diffs", sub: "a", seq: 2, diffs: [{ Insert: { index: 0 } }] });
    await resubscribed(connection, "a", ["a5"]);
    await waitFor(
      () => ids(a).join() === "a5",
      () => `a holds ${ids(a)}`,
    );
    // Not even an object: every list.
    connection.sendRaw("[1,2,3]");
    await resubscribed(connection, "a", ["a6"]);
    await resubscribed(connection, "b", ["b6"]);
    await waitFor(
      () => ids(a).join() === "a6" && ids(b).join() === "b6",
      () => `a holds ${ids(a)}, b holds ${ids(b)}`,
    );
    expect(errors.map((error) => error.code)).toEqual(["protocol"]);
    expect(client.state).toBe("open");
    expect(server.connections).toHaveLength(1);
  });

  it("a frame whose digest is not the list's after it: reported, not applied, and the list re-subscribed", async () => {
    const { a, b, connection, client, errors } = await twoLists();
    const listErrors: OrdoError[] = [];
    a.on("error", (error) => listErrors.push(error));
    // Diffs that apply, but the digest of the rows in the other order.
    const swapped = windowDigest([item("a2"), item("a1")]);
    expect(swapped).not.toBe(windowDigest([item("a1"), item("a2")]));
    connection.send({ type: "diffs", sub: "a", seq: 2, digest: swapped, diffs: [{ PushBack: { value: item("a2") } }] });
    expect(await connection.next()).toMatchObject({ op: "unsubscribe", sub: "a" });
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "a", collection: "rooms", limit: 5 });
    expect(listErrors.map((error) => [error.code, error.sub])).toEqual([["digest_mismatch", "a"]]);
    expect(a.error?.code).toBe("digest_mismatch");
    expect(a.digestMismatches).toBe(1);
    expect(ids(a).join()).toBe("a1");
    expect(a.seq).toBe(1);
    // The new subscription's snapshot (with its own digest) replaces the list.
    const fresh: Item[] = [
      { ...item("a7"), version: 7 },
      { ...item("a8"), version: 8 },
    ];
    connection.send({ type: "unsubscribed", sub: "a" });
    connection.send({ type: "diffs", sub: "a", seq: 1, digest: windowDigest(fresh), diffs: [{ Reset: { values: fresh } }] });
    await waitFor(
      () => ids(a).join() === "a7,a8",
      () => `a holds ${ids(a)}`,
    );
    expect(a.items).toEqual(fresh);
    expect(a.seq).toBe(1);
    expect(a.status).toBe("live");
    expect(a.digestMismatches).toBe(1);
    expect(ids(b).join()).toBe("b1");
    expect(errors).toEqual([]);
    expect(client.state).toBe("open");
    expect(server.connections).toHaveLength(1);
  });

  it("an unreadable frame while a list is being re-subscribed: every list anew on a new connection", async () => {
    const { a, b, connection, errors } = await twoLists();
    connection.send({ type: "diffs", sub: "a", seq: 5, diffs: [] }); // a gap: `a` re-subscribes
    expect(await connection.next()).toMatchObject({ op: "unsubscribe", sub: "a" });
    expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "a" });
    // The frame lost may have been `a`'s `unsubscribed`: only a fresh start is sure.
    connection.sendRaw("garbage");
    await connection.closed;
    const second = await server.nextConnection();
    second.welcome("s2", "none");
    const first = await second.next();
    const next = await second.next();
    expect([first.op, next.op]).toEqual(["subscribe", "subscribe"]);
    expect([first.sub, next.sub].sort()).toEqual(["a", "b"]);
    second.send(reset("a", 1, ["a7"]));
    second.send(reset("b", 1, ["b7"]));
    await waitFor(
      () => ids(a).join() === "a7" && ids(b).join() === "b7",
      () => `a holds ${ids(a)}, b holds ${ids(b)}`,
    );
    expect(errors.map((error) => error.code)).toEqual(["protocol"]);
  });

  it("a garbled welcome: it connects again and resumes", async () => {
    const { client, errors } = connect();
    const list = client.subscribe({ id: "a", collection: "rooms", limit: 5 });
    const first = await server.nextConnection();
    first.sendRaw("{nope");
    await first.closed;
    const second = await server.nextConnection();
    second.welcome("s2", "none");
    expect(await second.next()).toMatchObject({ op: "subscribe", sub: "a" });
    second.send(reset("a", 1, ["x"]));
    await list.ready;
    expect(errors.map((error) => error.code)).toEqual(["protocol"]);
  });
});
