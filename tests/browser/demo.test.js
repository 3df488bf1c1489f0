// The web demo in a real browser: `ordo serve --demo` on loopback, /demo in
// Debian's headless Chromium (driven by playwright-core, no browser download),
// and after every user action the room ids on screen must equal a one-shot query
// (POST /v1/collections/rooms/query) of the view the page says it shows.
//
//   ORDO_BIN                 the server binary (default: target/release/ordo; this test builds nothing)
//   CHROMIUM_BIN             the browser (default: /usr/bin/chromium)
//   ORDO_UPDATE_SCREENSHOTS  1: write the screenshots to docs/ (default: target/browser-test/)
//
// Run with `node --test` (tests/browser/run.sh installs what it needs first).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const ORDO_BIN = resolve(REPO, process.env.ORDO_BIN ?? "target/release/ordo");
const CHROMIUM_BIN = process.env.CHROMIUM_BIN ?? "/usr/bin/chromium";
const SCREENSHOT_DIR =
  process.env.ORDO_UPDATE_SCREENSHOTS === "1" ? join(REPO, "docs") : join(REPO, "target", "browser-test");
// How long the screen may lag behind the server before a comparison fails.
const SETTLE_MS = 15_000;
const PAGE = 50;
const MAX_WINDOW = 1000;

let server; // { child, base, dataDir }
let browser;
let page;
const pageErrors = [];

before(async () => {
  assert.ok(existsSync(ORDO_BIN), `no server binary at ${ORDO_BIN}: build it (cargo build --release -p ordo-server --bin ordo) or set ORDO_BIN`);
  assert.ok(existsSync(CHROMIUM_BIN), `no browser at ${CHROMIUM_BIN}: apt-get install chromium, or set CHROMIUM_BIN`);
  mkdirSync(SCREENSHOT_DIR, { recursive: true });
  server = await startServer();
  browser = await chromium.launch({ executablePath: CHROMIUM_BIN, headless: true, args: ["--no-sandbox"] });
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (error) => pageErrors.push(String(error)));
  page.on("console", (message) => {
    if (message.type() === "error") pageErrors.push(message.text());
  });
});

after(async () => {
  await browser?.close();
  if (server) await stopServer(server);
});

/** Starts `ordo serve --demo` on a free port; resolves once it printed its address. */
async function startServer() {
  const dataDir = mkdtempSync(join(tmpdir(), "ordo-browser-"));
  const child = spawn(ORDO_BIN, ["serve", "--demo", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--durability", "relaxed"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const base = await new Promise((resolvePort, reject) => {
    const timer = setTimeout(() => reject(new Error("ordo did not print its address within 60 s")), 60_000);
    child.once("exit", (code) => reject(new Error(`ordo exited with ${code} before listening`)));
    lines.on("line", (line) => {
      const match = line.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (match) {
        clearTimeout(timer);
        resolvePort(match[1]);
      }
    });
  });
  // Keep reading stdout so the server never blocks on a full pipe.
  lines.on("line", () => {});
  return { child, base, dataDir };
}

async function stopServer({ child, dataDir }) {
  if (child.exitCode === null) {
    const exited = new Promise((done) => child.once("exit", done));
    child.kill("SIGINT");
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  }
  rmSync(dataDir, { recursive: true, force: true });
}

async function http(method, path, body) {
  const response = await fetch(server.base + path, { method, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: response.status, body: json };
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

/** What the page shows now: its view and the room ids on screen, read in one go. */
function readScreen() {
  return page.evaluate(() => ({ view: window.ordoDemo.currentView(), ids: window.ordoDemo.idsOnScreen() }));
}

/**
 * Waits until the ids on screen equal a one-shot query of the page's current view
 * (the screen may lag a frame behind the server while writes go on), then returns
 * the query's answer. Fails with the last difference after SETTLE_MS.
 *
 * While the simulator writes, a screen one message behind can equal a query of a
 * *wrong* window by chance (a new room on top shifts everything by one), so live
 * checks ask for several matches in a row; the exact checks run at rate 0.
 */
async function expectScreenEqualsQuery(label, { matchesInARow = 1 } = {}) {
  const deadline = Date.now() + SETTLE_MS;
  let last;
  let matches = 0;
  for (;;) {
    const { view, ids } = await readScreen();
    const { status, body } = await http("POST", "/v1/collections/rooms/query", {
      filter: view.filter,
      sort: view.sort,
      offset: view.offset,
      limit: view.limit,
      fields: ["name", "recency", "unread", "dm", "favourite"],
      payload: false,
    });
    assert.equal(status, 200, `${label}: the query failed: ${JSON.stringify(body)}`);
    const expected = body.items.map((item) => item.id);
    if (ids.length === expected.length && ids.every((id, index) => id === expected[index])) {
      matches += 1;
      if (matches >= matchesInARow) return { view, ids, query: body };
      await sleep(50);
      continue;
    }
    matches = 0;
    last = { view, ids, expected };
    if (Date.now() > deadline) break;
    await sleep(100);
  }
  const firstDifference = last.ids.findIndex((id, index) => id !== last.expected[index]);
  assert.deepEqual(
    last.ids,
    last.expected,
    `${label}: the screen (${last.ids.length} rows) differs from the query of ${JSON.stringify(last.view)} ` +
      `(${last.expected.length} items), first at index ${firstDifference}`,
  );
}

async function waitFor(label, predicate, timeoutMs = SETTLE_MS) {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${label}`);
    await sleep(100);
  }
}

async function typeSearch(text) {
  await page.fill("#search", "");
  await page.type("#search", text, { delay: 20 });
  await waitFor(`the search "${text}" in the page's view`, async () => {
    const { view } = await readScreen();
    return JSON.stringify(view.filter ?? {}).includes(JSON.stringify(text));
  });
}

const names = (query) => query.items.map((item) => item.fields.name);

test("the demo page keeps its room list equal to the server's view", async (t) => {
  const response = await page.goto(`${server.base}/demo`);
  assert.equal(response.status(), 200);
  await page.waitForSelector("#rooms [data-id]", { timeout: SETTLE_MS });

  await t.test("live: the first page follows the simulator's writes", async () => {
    // The simulator writes 20 messages/s by default: frames must be arriving.
    await waitFor("diff frames from the simulator", () =>
      page.evaluate(() => window.ordoDemo.stats.framesTotal >= 5),
    );
    const { ids, view } = await expectScreenEqualsQuery("live, first page", { matchesInARow: 3 });
    assert.equal(ids.length, PAGE);
    assert.deepEqual(view.sort, [{ field: "recency", dir: "desc" }]);
    assert.equal(view.filter, null);
    await sleep(1500); // let the live panel count a full second
    await page.mouse.move(0, 0); // no hover highlight in the picture
    await page.screenshot({ path: join(SCREENSHOT_DIR, "demo-room-list.png") });
  });

  await t.test("the rate control stops the simulator", async () => {
    await page.click('[data-rate="0"]');
    await waitFor("rate 0 on the server", async () => (await http("GET", "/demo/simulator")).body.rate === 0);
    // Let the last tick's write land, then nothing moves any more.
    await sleep(300);
    const { sent } = (await http("GET", "/demo/simulator")).body;
    await sleep(300);
    assert.equal((await http("GET", "/demo/simulator")).body.sent, sent, "the simulator still writes at rate 0");
    await expectScreenEqualsQuery("after the simulator stopped");
  });

  await t.test("scrolling grows the window by pages, up to the server's limit", async () => {
    await page.hover("#scroller");
    await page.mouse.wheel(0, 5000);
    await waitFor("a window of 100", async () => (await readScreen()).view.limit >= 2 * PAGE);
    const { ids } = await expectScreenEqualsQuery("after one scroll");
    assert.ok(ids.length >= 2 * PAGE, `${ids.length} rows after scrolling`);
    // Keep scrolling to the bottom until the window stops growing.
    for (let step = 0; step < 40; step++) {
      const { view } = await readScreen();
      if (view.limit >= MAX_WINDOW) break;
      await page.evaluate(() => {
        const scroller = document.getElementById("scroller");
        scroller.scrollTop = scroller.scrollHeight;
      });
      await waitFor("the next page", async () => {
        const screen = await readScreen();
        return screen.view.limit > view.limit && screen.ids.length === screen.view.limit;
      });
    }
    const { view, ids: allIds } = await expectScreenEqualsQuery("the largest window");
    assert.equal(view.limit, MAX_WINDOW);
    assert.equal(allIds.length, MAX_WINDOW);
    await page.evaluate(() => {
      const scroller = document.getElementById("scroller");
      scroller.scrollTop = scroller.scrollHeight;
    });
    await sleep(300);
    assert.equal((await readScreen()).view.limit, MAX_WINDOW, "the window grew past the server's limit");
  });

  await t.test("search is a case-insensitive substring, non-ASCII included", async () => {
    await typeSearch("émile");
    const { query, view } = await expectScreenEqualsQuery('search "émile"');
    assert.equal(view.limit, PAGE, "a new view starts from the first page");
    assert.ok(query.items.length > 0, "no room matches émile");
    for (const name of names(query)) assert.ok(name.toLowerCase().includes("émile"), name);
    assert.ok(names(query).some((name) => name.includes("Émile")), "the capitalised É must match too");
    const shown = await page.locator("#rooms .room-name").allTextContents();
    assert.ok(shown.length > 0 && shown.every((name) => name.includes("Émile")), shown.join(", "));
    await page.mouse.move(0, 0);
    await page.screenshot({ path: join(SCREENSHOT_DIR, "demo-search.png") });

    await typeSearch("ωmega");
    const omega = await expectScreenEqualsQuery('search "ωmega"');
    assert.ok(omega.query.items.length > 0 && names(omega.query).every((name) => name.includes("Ωmega")));

    await typeSearch("東京");
    const tokyo = await expectScreenEqualsQuery('search "東京"');
    assert.ok(tokyo.query.items.length > 0 && names(tokyo.query).every((name) => name.includes("東京")));
  });

  await t.test("filter chips combine with the search", async () => {
    await typeSearch("é");
    await page.click('[data-chip="dms"]');
    const dms = await expectScreenEqualsQuery('DMs + "é"');
    assert.deepEqual(dms.view.filter, { all: [{ field: "dm", op: "eq", value: true }, { field: "name", contains: "é" }] });
    assert.ok(dms.query.items.length > 0 && dms.query.items.every((item) => item.fields.dm));

    await page.fill("#search", "");
    await waitFor("the search cleared", async () => !JSON.stringify((await readScreen()).view.filter).includes("contains"));
    await page.click('[data-chip="unread"]');
    const unread = await expectScreenEqualsQuery("Unread");
    assert.ok(unread.query.items.length > 0 && unread.query.items.every((item) => item.fields.unread > 0));

    await page.click('[data-chip="favourites"]');
    const favourites = await expectScreenEqualsQuery("Favourites");
    assert.ok(favourites.query.items.length > 0 && favourites.query.items.every((item) => item.fields.favourite));
  });

  await t.test("clicking a room marks it read, and it leaves the Unread view", async () => {
    await page.click('[data-chip="unread"]');
    const before = await expectScreenEqualsQuery("Unread, before the click");
    const first = before.ids[0];
    await page.click(`#rooms [data-id="${first}"]`);
    await waitFor("the room gone from Unread", async () => !(await readScreen()).ids.includes(first));
    await expectScreenEqualsQuery("Unread, after the click");
    const room = await http("GET", `/v1/collections/rooms/items/${encodeURIComponent(first)}`);
    assert.equal(room.body.fields.unread, 0);
  });

  await t.test("the sort toggle orders by name, ignoring case", async () => {
    await page.click('[data-chip="all"]');
    await page.click('[data-sort="name"]');
    const byName = await expectScreenEqualsQuery("All by name");
    assert.deepEqual(byName.view.sort, [{ field: "name", dir: "asc", case_insensitive: true }]);
    await page.click('[data-sort="activity"]');
    await expectScreenEqualsQuery("All by activity");
  });

  await t.test("live again: the screen follows 500 messages/s", async () => {
    const answer = await http("POST", "/demo/simulator", { rate: 500 });
    assert.deepEqual(answer.body, { rate: 500 });
    const framesBefore = await page.evaluate(() => window.ordoDemo.stats.framesTotal);
    await waitFor("frames at 500 messages/s", async () =>
      (await page.evaluate(() => window.ordoDemo.stats.framesTotal)) > framesBefore + 10,
    );
    await expectScreenEqualsQuery("live at 500 messages/s", { matchesInARow: 3 });
    await http("POST", "/demo/simulator", { rate: 0 });
  });

  assert.deepEqual(pageErrors, [], "the page logged errors");
});
