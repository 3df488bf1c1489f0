// The HTTP helpers (OrdoHttp) against a real `ordo serve` with auth on: schema,
// write, query, get, delete, error codes, and a token provider retried after a 401.

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { OrdoHttp, OrdoHttpError, type BatchOp } from "../src/http.js";
import { mintToken, OrdoServer } from "./helpers.js";

const FIELDS = [
  { name: "name", type: "string" },
  { name: "recency", type: "u64" },
  { name: "unread", type: "u64" },
] as const;

const room = (n: number, recency: number): BatchOp => ({
  op: "upsert",
  id: `!r${n}:example.org`,
  fields: { name: `Room ${n}`, recency, unread: 0 },
});

describe("OrdoHttp against ordo serve with auth", () => {
  const server = new OrdoServer();
  let secretFile = "";
  let admin: OrdoHttp;

  beforeAll(async () => {
    secretFile = await server.useAuth();
    await server.start(0);
    admin = new OrdoHttp(server.httpUrl, { token: server.token! });
  });

  afterAll(async () => {
    await server.dispose();
  });

  it("creates a collection, writes, queries, gets and deletes items", async () => {
    const created = await admin.createCollection("rooms", [...FIELDS]);
    expect(created).toMatchObject({ name: "rooms", fields: FIELDS });
    // The same schema again is fine; another is `collection_exists` (409).
    await admin.createCollection("rooms", [...FIELDS]);
    await expect(admin.createCollection("rooms", [FIELDS[0]])).rejects.toMatchObject({
      code: "collection_exists",
      status: 409,
    });

    const written = await admin.write("rooms", [room(1, 10), room(2, 20), room(3, 30)]);
    expect(written).toMatchObject({ upserted: 3, removed: 0 });

    // Ids with `!` and `:` travel percent-encoded in the path.
    const item = await admin.getItem("rooms", "!r1:example.org");
    expect(item).toMatchObject({ id: "!r1:example.org", fields: { name: "Room 1", recency: 10, unread: 0 } });
    if (item?.version !== undefined) expect(item.version).toBe(written.seq);
    expect(await admin.getItem("rooms", "!nope")).toBeNull();
    await expect(admin.getItem("nowhere", "!r1")).rejects.toMatchObject({ code: "unknown_collection", status: 404 });

    const page = await admin.query("rooms", { sort: [{ field: "recency", dir: "desc" }], limit: 2 });
    expect(page.total).toBe(3);
    expect(page.items.map((i) => i.id)).toEqual(["!r3:example.org", "!r2:example.org"]);

    const deleted = await admin.deleteItem("rooms", "!r3:example.org");
    expect(deleted.removed).toBe(true);
    expect(deleted.seq).toBeGreaterThan(written.seq);
    expect((await admin.deleteItem("rooms", "!r3:example.org")).removed).toBe(false);
    expect((await admin.query("rooms", { limit: 10 })).total).toBe(2);
  });

  it("a write sent again with its idempotency key is applied once and answered as the first", async () => {
    await admin.createCollection("counters", [...FIELDS]);
    const bump: BatchOp[] = [{ op: "upsert", id: "c1", increment: { unread: 1 } }];
    const first = await admin.write("counters", bump, { idempotencyKey: "bump-1" });
    // The answer was lost, say: the same call again gets it, and nothing is written twice.
    expect(await admin.write("counters", bump, { idempotencyKey: "bump-1" })).toEqual(first);
    expect((await admin.getItem("counters", "c1"))?.fields.unread).toBe(1);
    await expect(
      admin.write("counters", [{ op: "remove", id: "c1" }], { idempotencyKey: "bump-1" }),
    ).rejects.toMatchObject({ code: "idempotency_key_reused", status: 422 });
    const removed = await admin.deleteItem("counters", "c1", { idempotencyKey: "del-1" });
    expect(removed.removed).toBe(true);
    expect(await admin.deleteItem("counters", "c1", { idempotencyKey: "del-1" })).toEqual(removed);
  });

  it("a refused batch rejects with its status and code, and writes nothing", async () => {
    await admin.createCollection("rooms", [...FIELDS]);
    const before = (await admin.query("rooms", { limit: 1 })).total;
    const error = await admin
      .write("rooms", [room(10, 1), { op: "upsert", id: "!bad", fields: { recency: "soon" } }])
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OrdoHttpError);
    expect(error).toMatchObject({ status: 422, code: "invalid_batch" });
    expect((await admin.query("rooms", { limit: 1 })).total).toBe(before);
  });

  it("a reader may not write (403); a token provider is asked again after a 401", async () => {
    const reader = new OrdoHttp(server.httpUrl, {
      token: await mintToken(secretFile, { sub: "u1", role: "reader" }),
    });
    await expect(reader.write("rooms", [room(20, 1)])).rejects.toMatchObject({ code: "forbidden", status: 403 });

    let calls = 0;
    const refreshed = new OrdoHttp(server.httpUrl, {
      tokenProvider: async () => {
        calls += 1;
        // The first token is refused (a bad signature); the second is good.
        return calls === 1 ? "not-a-jwt" : server.token!;
      },
    });
    expect((await refreshed.query("rooms", { limit: 1 })).total).toBeGreaterThan(0);
    expect(calls).toBe(2);
  });

  it("adds and removes a field and drops a collection; a writer may not (403)", async () => {
    await admin.createCollection("schema", [...FIELDS]);
    const written = await admin.write("schema", [room(1, 10)]);
    const added = await admin.addField("schema", { name: "pinned", type: "bool", default: true });
    expect(added.name).toBe("schema");
    expect(added.fields.map((f) => f.name)).toEqual(["name", "recency", "unread", "pinned"]);
    expect(added.seq).toBeGreaterThan(written.seq);
    // Existing items got the default.
    expect((await admin.getItem("schema", "!r1:example.org"))?.fields).toMatchObject({ pinned: true });
    await expect(admin.addField("schema", { name: "pinned", type: "bool" })).rejects.toMatchObject({
      code: "invalid_schema",
      status: 400,
    });

    const writer = new OrdoHttp(server.httpUrl, {
      token: await mintToken(secretFile, { sub: "u1", role: "writer" }),
    });
    await expect(writer.addField("schema", { name: "x", type: "u64" })).rejects.toMatchObject({ status: 403 });
    await expect(writer.removeField("schema", "pinned")).rejects.toMatchObject({ status: 403 });
    await expect(writer.dropCollection("schema")).rejects.toMatchObject({ status: 403 });

    const removed = await admin.removeField("schema", "pinned");
    expect(removed.fields.map((f) => f.name)).toEqual(["name", "recency", "unread"]);
    expect(removed.seq).toBeGreaterThan(added.seq);
    await expect(admin.removeField("schema", "pinned")).rejects.toMatchObject({ code: "not_found", status: 404 });

    const dropped = await admin.dropCollection("schema");
    expect(dropped).toEqual({ seq: dropped.seq, dropped: "schema" });
    expect(dropped.seq).toBeGreaterThan(removed.seq);
    await expect(admin.collection("schema")).rejects.toMatchObject({ status: 404 });
  });

  it("atomic ops and preconditions are plain keys of an op", () => {
    const op: BatchOp = {
      op: "upsert",
      id: "!a",
      fields: { name: "A" },
      increment: { unread: 1 },
      set_max: { recency: 17 },
      if: { version: 41 },
    };
    expect(JSON.parse(JSON.stringify(op))).toEqual({
      op: "upsert",
      id: "!a",
      fields: { name: "A" },
      increment: { unread: 1 },
      set_max: { recency: 17 },
      if: { version: 41 },
    });
  });
});
