// The browser bundle (dist/ordo-client.js, made by `npm run build`) is one ES module
// with no imports, and works with a standard WebSocket found on globalThis: here
// Node's own (behind --experimental-websocket on Node 20), in a child process.

import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import type { WindowDefinition } from "../src/index.js";
import { OrdoServer } from "./helpers.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const BUNDLE = resolve(here, "../dist/ordo-client.js");
/** The copy `ordo serve` embeds for its demo page (so running the demo needs no Node). */
const DEMO_COPY = resolve(here, "../../../crates/ordo-server/demo/ordo-client.js");
const server = new OrdoServer();

beforeAll(async () => {
  await server.start(0);
  await server.ok("PUT", "/v1/collections/notes", { fields: [{ name: "rank", type: "i64" }] });
  await server.ok("POST", "/v1/collections/notes/batch", {
    ops: Array.from({ length: 12 }, (_, n) => ({ op: "upsert", id: `n${n}`, fields: { rank: (n * 5) % 12 } })),
  });
});

afterAll(async () => {
  await server.dispose();
});

describe("dist/ordo-client.js", () => {
  it("exists (run `npm run build`) and imports nothing", () => {
    expect(existsSync(BUNDLE), `${BUNDLE} is missing: run \`npm run build\` first`).toBe(true);
    const text = readFileSync(BUNDLE, "utf8");
    expect(text).not.toMatch(/^\s*import\s/m);
    expect(text).not.toMatch(/\bimport\s*\(/);
    expect(text).not.toMatch(/\brequire\s*\(/);
    expect(text).not.toMatch(/react/i);
  });

  it("is the copy the server's demo page embeds", () => {
    const same = existsSync(DEMO_COPY) && readFileSync(DEMO_COPY, "utf8") === readFileSync(BUNDLE, "utf8");
    expect(same, `${DEMO_COPY} differs from the bundle: run \`npm run demo-bundle\` and rebuild ordo`).toBe(true);
  });

  it("subscribes with the global WebSocket", async () => {
    const view: WindowDefinition = { collection: "notes", sort: [{ field: "rank", dir: "desc" }], limit: 4 };
    const script = `
      const { OrdoClient } = await import(${JSON.stringify(pathToFileURL(BUNDLE).href)});
      const client = new OrdoClient({ url: ${JSON.stringify(server.wsUrl)} });
      const list = client.subscribe(${JSON.stringify(view)});
      await list.ready;
      console.log(JSON.stringify({ state: client.state, items: list.items }));
      client.close();
    `;
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [
        // Node 22 and later have a global WebSocket without the flag.
        ...(typeof (globalThis as { WebSocket?: unknown }).WebSocket === "undefined" ? ["--experimental-websocket"] : []),
        "--no-warnings",
        "--input-type=module",
        "-e",
        script,
      ],
      { timeout: 30_000 },
    );
    const result = JSON.parse(stdout.trim().split("\n").pop()!);
    expect(result.state).toBe("open");
    expect(result.items).toStrictEqual(await server.query(view));
  });
});
