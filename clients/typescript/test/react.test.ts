// useLiveList against a real server, rendered with react-test-renderer.

import { createElement, type ReactElement } from "react";
import TestRenderer, { act, type ReactTestRenderer } from "react-test-renderer";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";

import { OrdoClient, type LiveList, type SubscribeOptions } from "../src/index.js";
import { useLiveList, type LiveListState } from "../src/react.js";
import { fakeJwt, OrdoServer, ScriptedServer, waitFor } from "./helpers.js";

// Tell React that updates in tests go through `act`.
(globalThis as { IS_REACT_ACT_ENVIRONMENT?: boolean }).IS_REACT_ACT_ENVIRONMENT = true;

const server = new OrdoServer();
let client: OrdoClient;

beforeAll(async () => {
  await server.start(0);
  await server.ok("PUT", "/v1/collections/rooms", {
    fields: [
      { name: "name", type: "string" },
      { name: "recency", type: "u64" },
      { name: "unread", type: "u64" },
      { name: "dm", type: "bool" },
    ],
  });
  const ops = Array.from({ length: 30 }, (_, n) => ({
    op: "upsert",
    id: `!room${String(n).padStart(2, "0")}`,
    fields: { name: `room ${n}`, recency: (n * 37) % 100, unread: n % 3, dm: n % 4 === 0 },
  }));
  await server.ok("POST", "/v1/collections/rooms/batch", { ops });
  client = new OrdoClient({ url: server.wsUrl, WebSocket });
});

afterAll(async () => {
  client?.close();
  await server.dispose();
});

/** Polls under `act`, so React applies the updates the socket caused. */
async function until(check: () => boolean, describe: () => string): Promise<void> {
  await waitFor(
    async () => {
      await act(async () => {
        await new Promise((resolve) => setTimeout(resolve, 10));
      });
      return check();
    },
    describe,
  );
}

describe("useLiveList", () => {
  it("renders the window, follows writes and view changes, and unsubscribes on unmount", async () => {
    const seen: LiveListState[] = [];
    function Rooms(props: { view: SubscribeOptions }): ReactElement {
      const state = useLiveList(client, props.view);
      seen.push(state);
      return createElement("ul", null, state.ready ? state.items.map((item) => createElement("li", { key: item.id }, item.id)) : "loading");
    }
    const rendered = (renderer: ReactTestRenderer) => JSON.stringify(renderer.toJSON());
    const ids = (items: { id: string }[]) => JSON.stringify({ type: "ul", props: {}, children: items.map((item) => ({ type: "li", props: {}, children: [item.id] })) });

    const view: SubscribeOptions = { collection: "rooms", sort: [{ field: "recency", dir: "desc" }], limit: 5 };
    let renderer!: ReactTestRenderer;
    await act(async () => {
      renderer = TestRenderer.create(createElement(Rooms, { view }));
    });
    let expected = await server.query(view);
    await until(
      () => rendered(renderer) === ids(expected),
      () => `rendered ${rendered(renderer)}, query ${ids(expected)}`,
    );

    await server.ok("POST", "/v1/collections/rooms/batch", {
      ops: [{ op: "upsert", id: "!new", fields: { name: "new", recency: 1000 } }],
    });
    expected = await server.query(view);
    expect(expected[0]!.id).toBe("!new");
    await until(
      () => rendered(renderer) === ids(expected),
      () => `after a write: rendered ${rendered(renderer)}, query ${ids(expected)}`,
    );

    // New props: a set_view and a set_range on the same subscription.
    const list = seen[seen.length - 1]!.list as LiveList;
    const next: SubscribeOptions = { ...view, filter: { field: "dm", op: "eq", value: true }, offset: 1, limit: 3 };
    await act(async () => {
      renderer.update(createElement(Rooms, { view: next }));
    });
    expected = await server.query(next);
    await until(
      () => rendered(renderer) === ids(expected),
      () => `after new props: rendered ${rendered(renderer)}, query ${ids(expected)}`,
    );
    expect(seen[seen.length - 1]!.list).toBe(list);

    // Snapshots are stable between changes: equal state, same object.
    const last = seen[seen.length - 1]!;
    await act(async () => {
      renderer.update(createElement(Rooms, { view: { ...next } }));
    });
    expect(seen[seen.length - 1]).toBe(last);

    await act(async () => {
      renderer.unmount();
    });
    expect(list.status).toBe("closed");
  });

  it("reports a refused subscribe as its error", async () => {
    let state: LiveListState | null = null;
    function Bad(): ReactElement {
      state = useLiveList(client, { collection: "rooms", sort: [{ field: "nope" }], limit: 2 });
      return createElement("p", null, state.error ? state.error.code : "waiting");
    }
    let renderer!: ReactTestRenderer;
    await act(async () => {
      renderer = TestRenderer.create(createElement(Bad));
    });
    await until(
      () => JSON.stringify(renderer.toJSON()).includes("invalid_view"),
      () => `rendered ${JSON.stringify(renderer.toJSON())}`,
    );
    expect(state!.ready).toBe(false);
    await act(async () => {
      renderer.unmount();
    });
  });

  it("with client options, makes its own client: token and tokenProvider pass through to auth", async () => {
    const scripted = await ScriptedServer.start();
    try {
      const exp = Math.floor(Date.now() / 1000) + 3600;
      const tokens = [fakeJwt({ sub: "alice", exp, jti: "1" }), fakeJwt({ sub: "alice", exp, jti: "2" })];
      function Rooms(props: { token: string }): ReactElement {
        const state = useLiveList(
          { url: scripted.url, WebSocket, token: props.token, reconnect: { initialDelayMs: 20 } },
          { id: "rooms", collection: "rooms", limit: 3 },
        );
        return createElement("p", null, state.ready ? state.items.map((item) => item.id).join(",") : "loading");
      }
      let renderer!: ReactTestRenderer;
      await act(async () => {
        renderer = TestRenderer.create(createElement(Rooms, { token: tokens[0]! }));
      });
      const connection = await scripted.nextConnection();
      connection.welcome("s1", "required");
      expect(await connection.next()).toEqual({ op: "auth", token: tokens[0] });
      connection.send({ type: "authed", sub: "alice", role: "reader", expires_at: exp });
      expect(await connection.next()).toMatchObject({ op: "subscribe", sub: "rooms" });
      connection.send({ type: "diffs", sub: "rooms", seq: 1, diffs: [{ Reset: { values: [{ id: "a", fields: {} }] } }] });
      await until(
        () => JSON.stringify(renderer.toJSON()).includes('"a"'),
        () => `rendered ${JSON.stringify(renderer.toJSON())}`,
      );
      // A new token prop: sent at once on the same connection.
      await act(async () => {
        renderer.update(createElement(Rooms, { token: tokens[1]! }));
      });
      expect(await connection.next()).toEqual({ op: "auth", token: tokens[1] });
      expect(scripted.connections).toHaveLength(1);
      // Unmounting closes the client the hook made.
      await act(async () => {
        renderer.unmount();
      });
      expect(await connection.closed).toBe(1000);

      // A tokenProvider the same way.
      let calls = 0;
      function WithProvider(): ReactElement {
        const state = useLiveList(
          { url: scripted.url, WebSocket, tokenProvider: async () => tokens[calls++ % 2]! },
          { id: "rooms", collection: "rooms", limit: 3 },
        );
        return createElement("p", null, state.ready ? "ready" : "loading");
      }
      await act(async () => {
        renderer = TestRenderer.create(createElement(WithProvider));
      });
      const second = await scripted.nextConnection();
      second.welcome("s2", "required");
      expect(await second.next()).toEqual({ op: "auth", token: tokens[0] });
      expect(calls).toBe(1);
      await act(async () => {
        renderer.unmount();
      });
    } finally {
      await scripted.close();
    }
  });
});
