// Failover gap of OrdoClient with two independent `ordo serve` nodes: SIGKILL of the node in
// use -> the first frame (a Reset) from the other node, default reconnect options. Not a test.
// Run: npm run build && ORDO_BIN=<path to ordo> RUNS=9 node bench/failover-gap.mjs
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "ws";
import { OrdoClient } from "../dist/index.js";

const BIN = process.env.ORDO_BIN;
function start() {
  const dir = mkdtempSync(join(tmpdir(), "gap-"));
  const child = spawn(BIN, ["serve", "--listen", "127.0.0.1:0", "--data-dir", dir], { stdio: ["ignore", "pipe", "pipe"] });
  return new Promise((resolve) => {
    let text = "";
    const on = (c) => { text += c; const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(text); if (m) resolve({ child, dir, port: Number(m[1]) }); };
    child.stdout.on("data", on); child.stderr.on("data", on);
  });
}
async function ok(port, method, path, body) {
  const r = await fetch(`http://127.0.0.1:${port}${path}`, { method, headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(await r.text());
  return r.json();
}
const gaps = [];
for (let run = 0; run < Number(process.env.RUNS ?? 9); run++) {
  const [a, b] = await Promise.all([start(), start()]);
  for (const n of [a, b]) {
    await ok(n.port, "PUT", "/v1/collections/notes", { fields: [{ name: "rank", type: "u64" }] });
    await ok(n.port, "POST", "/v1/collections/notes/batch", { ops: Array.from({ length: 50 }, (_, i) => ({ op: "upsert", id: `n${i}`, fields: { rank: i } })) });
  }
  const client = new OrdoClient({ url: [`ws://127.0.0.1:${a.port}/v1/ws`, `ws://127.0.0.1:${b.port}/v1/ws`], WebSocket });
  const list = client.subscribe({ collection: "notes", sort: [{ field: "rank", dir: "desc" }], limit: 20 });
  await list.ready;
  let killedAt = 0;
  const got = new Promise((resolve) => list.on("change", (c) => { if (killedAt && c.reset) resolve(performance.now() - killedAt); }));
  killedAt = performance.now();
  a.child.kill("SIGKILL");
  gaps.push(await got);
  client.close();
  b.child.kill("SIGKILL");
  await new Promise((r) => setTimeout(r, 200));
  rmSync(a.dir, { recursive: true, force: true }); rmSync(b.dir, { recursive: true, force: true });
}
gaps.sort((x, y) => x - y);
console.log("gaps ms", gaps.map((g) => g.toFixed(1)).join(" "), "median", gaps[Math.floor(gaps.length / 2)].toFixed(1), "max", gaps.at(-1).toFixed(1));
process.exit(0);
