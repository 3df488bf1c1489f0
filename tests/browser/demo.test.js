// The web demo in a real browser: `ordo serve --demo` on loopback (auth on: the
// page signs in as a demo user with a token from POST /demo/token), /demo in
// Debian's headless Chromium (driven by playwright-core, no browser download),
// and after every user action the memberships on screen must equal a one-shot
// query (POST /v1/collections/members/query, with the signed-in user's token) of
// the view the page says it shows. The chat itself: alice, bob and carol side by
// side, alice's message moving the room to the top of bob's list with an unread
// badge while carol sees nothing of it, bob reading it. Also: switching users,
// the page at phone width (390 px), and a page of another origin opening a
// WebSocket (refused, then allowed with --allow-origin).
//
//   ORDO_BIN                 the server binary (default: target/release/ordo; this test builds nothing)
//   CHROMIUM_BIN             the browser (default: /usr/bin/chromium)
//   ORDO_UPDATE_SCREENSHOTS  1: write the screenshots (demo-room-list.png, demo-second-user.png,
//                            demo-phone.png) to docs/ (default: target/browser-test/)
//
// Run with `node --test` (tests/browser/run.sh installs what it needs first).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createServer } from "node:http";
import { mkdtempSync, mkdirSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
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

/** Starts `ordo serve --demo` (plus `args`) on a free port; resolves once it printed its address. */
async function startServer(args = []) {
  const dataDir = mkdtempSync(join(tmpdir(), "ordo-browser-"));
  const child = spawn(
    ORDO_BIN,
    ["serve", "--demo", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--durability", "relaxed", ...args],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
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

/** A request to `target` (the demo's server by default), with `token` as a bearer token when given. */
async function http(method, path, body, { token = null, target = server } = {}) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const response = await fetch(target.base + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
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

/** A demo user's token, from POST /demo/token (as the page gets it), kept a minute. */
const demoTokens = new Map();
async function demoToken(user, target = server) {
  const key = `${target.base} ${user}`;
  const kept = demoTokens.get(key);
  if (kept && Date.now() - kept.at < 60_000) return kept.token;
  const { status, body } = await http("POST", "/demo/token", { user }, { target });
  assert.equal(status, 200, `POST /demo/token for ${user}: ${JSON.stringify(body)}`);
  assert.equal(body.sub, user);
  assert.equal(body.role, "reader");
  assert.equal(typeof body.token, "string");
  demoTokens.set(key, { token: body.token, at: Date.now() });
  return body.token;
}

/** An admin token, minted with `ordo token` and the demo's secret (DATA_DIR/demo-secret). */
async function adminToken() {
  const secretFile = join(server.dataDir, "demo-secret");
  assert.ok(existsSync(secretFile), `no ${secretFile}: ordo serve --demo keeps its secret there`);
  const { stdout } = await promisify(execFile)(ORDO_BIN, [
    "token", "--secret-file", secretFile, "--role", "admin", "--sub", "ops", "--ttl", "3600",
  ]);
  return stdout.trim();
}

/** What `on` (the main page by default) shows now: its user, its view and the membership ids on screen, in one go. */
function readScreen(on = page) {
  return on.evaluate(() => ({
    user: window.ordoDemo.user,
    view: window.ordoDemo.currentView(),
    ids: window.ordoDemo.idsOnScreen(),
  }));
}

/** The one-shot query of `view` as `user` sees it (the server's rule: readers read their own memberships). */
async function queryAs(user, view, fields = view.fields) {
  const { status, body } = await http(
    "POST",
    "/v1/collections/members/query",
    { filter: view.filter, sort: view.sort, offset: view.offset, limit: view.limit, fields, payload: false },
    { token: await demoToken(user) },
  );
  assert.equal(status, 200, `the query as ${user} failed: ${JSON.stringify(body)}`);
  return body;
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
async function expectScreenEqualsQuery(label, { matchesInARow = 1, on = page } = {}) {
  const deadline = Date.now() + SETTLE_MS;
  let last;
  let matches = 0;
  for (;;) {
    const { user, view, ids } = await readScreen(on);
    const body = await queryAs(user, view);
    const expected = body.items.map((item) => item.id);
    if (ids.length === expected.length && ids.every((id, index) => id === expected[index])) {
      matches += 1;
      if (matches >= matchesInARow) return { user, view, ids, query: body };
      await sleep(50);
      continue;
    }
    matches = 0;
    last = { user, view, ids, expected };
    if (Date.now() > deadline) break;
    await sleep(100);
  }
  const firstDifference = last.ids.findIndex((id, index) => id !== last.expected[index]);
  assert.deepEqual(
    last.ids,
    last.expected,
    `${label}: the screen (${last.ids.length} rows) differs from ${last.user}'s query of ${JSON.stringify(last.view)} ` +
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

const names = (query) => query.items.map((item) => item.fields["room.name"]);
const unreadOf = (item) => item.fields["room.last_seq"] - item.fields.read_upto;
/** The room a membership id names (`user:room`). */
const roomOf = (membershipId) => membershipId.slice(membershipId.indexOf(":") + 1);

/** Opens `user`'s demo page in a page of its own (a second browser window, as a second person would). */
async function openPageAs(user) {
  const other = await browser.newPage({ viewport: { width: 900, height: 800 } });
  other.on("pageerror", (error) => pageErrors.push(`${user}: ${error}`));
  await other.goto(`${server.base}/demo?user=${user}`);
  await other.waitForSelector(`#signed-in[data-sub="${user}"]`, { timeout: SETTLE_MS });
  await other.waitForSelector("#rooms [data-id]", { timeout: SETTLE_MS });
  return other;
}

/** The id of `user`'s membership of the room named `name`, from a query as `user`. */
async function membershipNamed(user, name) {
  const view = { filter: { field: "room.name", op: "eq", value: name }, sort: [], offset: 0, limit: 1 };
  const { items } = await queryAs(user, view, ["room.name"]);
  assert.equal(items.length, 1, `${user} has no room named ${name}`);
  return items[0].id;
}

/** The badge and place of `room` in the list on `on`. */
function rowOf(on, room) {
  return on.evaluate((room) => {
    const rows = [...document.querySelectorAll("#rooms [data-room]")];
    const index = rows.findIndex((row) => row.dataset.room === room);
    if (index < 0) return null;
    const row = rows[index];
    return { index, unread: row.classList.contains("unread"), badge: row.querySelector(".badge").textContent };
  }, room);
}

test("the demo page keeps its room list equal to the server's view", async (t) => {
  const response = await page.goto(`${server.base}/demo`);
  assert.equal(response.status(), 200);
  await page.waitForSelector("#rooms [data-id]", { timeout: SETTLE_MS });

  await t.test("auth is on: the page signed in as alice with a demo token and shows it", async () => {
    // Without a token the server answers 401.
    const anonymous = await http("POST", "/v1/collections/members/query", { limit: 1 });
    assert.equal(anonymous.status, 401, JSON.stringify(anonymous.body));
    await page.waitForSelector('#signed-in[data-sub="alice"]', { timeout: SETTLE_MS });
    const label = await page.textContent("#signed-in");
    assert.match(label, /Signed in as alice/);
    assert.match(label, /reader/);
    assert.equal(await page.inputValue("#user-select"), "alice");
    assert.deepEqual(
      await page.evaluate(() => ({ sub: window.ordoDemo.identity?.sub, role: window.ordoDemo.identity?.role })),
      { sub: "alice", role: "reader" },
    );
  });

  await t.test("live: the first page follows the simulator's writes", async () => {
    // The simulator writes 20 messages/s by default, into rooms of alice too: frames arrive.
    await waitFor("diff frames from the simulator", () => page.evaluate(() => window.ordoDemo.stats.framesTotal >= 3));
    const { ids, view } = await expectScreenEqualsQuery("live, first page", { matchesInARow: 3 });
    assert.equal(ids.length, PAGE);
    assert.deepEqual(view.sort, [{ field: "room.recency", dir: "desc" }]);
    assert.equal(view.filter, null);
  });

  await t.test("the rate control is read-only; an admin token stops the simulator", async () => {
    assert.equal(await page.isDisabled("#rate"), true, "the rate slider takes input");
    assert.ok(await page.isVisible("#rate-hint"), "no hint on the read-only rate");
    assert.match(await page.textContent("#rate-hint"), /admin token/);
    // POST /demo/simulator: 401 without a token, 403 for a reader, done for an admin.
    assert.equal((await http("POST", "/demo/simulator", { rate: 0 })).status, 401);
    assert.equal((await http("POST", "/demo/simulator", { rate: 0 }, { token: await demoToken("alice") })).status, 403);
    const admin = await http("POST", "/demo/simulator", { rate: 0 }, { token: await adminToken() });
    assert.equal(admin.status, 200, JSON.stringify(admin.body));
    await waitFor("rate 0 on the server", async () => (await http("GET", "/demo/simulator")).body.rate === 0);
    await waitFor("rate 0 on the page", async () => (await page.textContent("#rate-number")).trim() === "0");
    // Let the last tick's write land, then nothing moves any more.
    await sleep(300);
    const { sent } = (await http("GET", "/demo/simulator")).body;
    await sleep(300);
    assert.equal((await http("GET", "/demo/simulator")).body.sent, sent, "the simulator still writes at rate 0");
    await expectScreenEqualsQuery("after the simulator stopped");
  });

  await t.test("scrolling grows the window to the end of alice's rooms", async () => {
    await page.hover("#scroller");
    await page.mouse.wheel(0, 5000);
    await waitFor("a window of 100", async () => (await readScreen()).view.limit >= 2 * PAGE);
    const { ids, query } = await expectScreenEqualsQuery("after one scroll");
    assert.ok(ids.length > PAGE && ids.length === query.total, `${ids.length} rows of ${query.total} after scrolling`);
    assert.match(await page.textContent("#list-footer"), /End of the list/);
  });

  await t.test("search is a case-insensitive substring of the room's name, non-ASCII included", async () => {
    await typeSearch("CAFÉ");
    const { query, view } = await expectScreenEqualsQuery('search "CAFÉ"');
    assert.equal(view.limit, PAGE, "a new view starts from the first page");
    assert.ok(query.items.length > 0, "no room matches café");
    for (const name of names(query)) assert.ok(name.toLowerCase().includes("café"), name);
    const shown = await page.locator("#rooms .room-name").allTextContents();
    assert.ok(shown.length > 0 && shown.every((name) => name.toLowerCase().includes("café")), shown.join(", "));

    await typeSearch("ωmega");
    const omega = await expectScreenEqualsQuery('search "ωmega"');
    assert.ok(omega.query.items.length > 0 && names(omega.query).every((name) => name.includes("Ωmega")));
    await page.fill("#search", "");
    await waitFor("the search cleared", async () => !JSON.stringify((await readScreen()).view.filter).includes("contains"));
  });

  await t.test("filter chips: DMs, Unread (a field compared with a field through the reference), Favourites", async () => {
    await page.click('[data-chip="dms"]');
    const dms = await expectScreenEqualsQuery("DMs");
    assert.deepEqual(dms.view.filter, { field: "room.dm", op: "eq", value: true });
    assert.ok(dms.query.items.length > 0 && dms.query.items.every((item) => item.fields["room.dm"]));

    await page.click('[data-chip="unread"]');
    const unread = await expectScreenEqualsQuery("Unread");
    assert.deepEqual(unread.view.filter, { field: "room.last_seq", op: "gt", value: { field: "read_upto" } });
    assert.ok(unread.query.items.length > 0 && unread.query.items.every((item) => unreadOf(item) > 0));
    const badges = await page.locator("#rooms .badge").allTextContents();
    assert.deepEqual(badges, unread.query.items.map((item) => String(unreadOf(item))), "the badges are the unread counts");

    await page.click('[data-chip="favourites"]');
    const favourites = await expectScreenEqualsQuery("Favourites");
    assert.ok(favourites.query.items.every((item) => item.fields.favourite));
    await page.click('[data-chip="all"]');
    await expectScreenEqualsQuery("All again");
  });

  await t.test("the sort toggle orders by the room's name, ignoring case", async () => {
    await page.click('[data-sort="name"]');
    const byName = await expectScreenEqualsQuery("All by name");
    assert.deepEqual(byName.view.sort, [{ field: "room.name", dir: "asc", case_insensitive: true }]);
    await page.click('[data-sort="activity"]');
    await expectScreenEqualsQuery("All by activity");
  });

  await t.test("two people side by side: alice's message tops bob's list, unread; carol sees nothing of it", async () => {
    const bobPage = await openPageAs("bob");
    const carolPage = await openPageAs("carol");
    try {
      const dmOfAlice = await membershipNamed("alice", "alice & bob");
      const dm = roomOf(dmOfAlice);
      // Bob reads the DM first, so that its badge is alice's message alone.
      await bobPage.evaluate((room) => window.ordoDemo.openRoom(room), dm);
      await waitFor("bob's DM read", async () => (await rowOf(bobPage, dm))?.unread === false);
      // The back button shows at phone width only; closing the room is the same click.
      await bobPage.evaluate(() => document.getElementById("back").click());

      await page.click(`#rooms [data-room="${dm}"]`);
      await page.waitForSelector('#room-view[data-open="true"]', { timeout: SETTLE_MS });
      await waitFor("alice's DM messages on screen", async () =>
        (await page.evaluate(() => window.ordoDemo.messageIdsOnScreen().length)) > 0,
      );
      await page.fill("#message-text", "hello bob, from the browser");
      await page.click("#composer button");

      // Alice's list: the DM on top, read. Bob's: on top, with a badge of 1. Carol's: not there.
      await waitFor("the DM on top of alice's list", async () => (await rowOf(page, dm))?.index === 0);
      await waitFor("the DM on top of bob's list, unread", async () => {
        const row = await rowOf(bobPage, dm);
        return row?.index === 0 && row.unread && row.badge === "1";
      });
      await expectScreenEqualsQuery("bob, after alice's message", { on: bobPage });
      await expectScreenEqualsQuery("alice, after her message");
      assert.equal((await rowOf(page, dm)).unread, false, "alice's own message is unread for her");
      await waitFor("alice's message in her room view", async () =>
        (await page.locator("#messages .message .text").allTextContents()).includes("hello bob, from the browser"),
      );
      await expectScreenEqualsQuery("carol", { on: carolPage });
      assert.equal(await rowOf(carolPage, dm), null, "carol's list holds a room she is not in");
      const messages = { filter: { field: "room", op: "eq", value: dm }, sort: [{ field: "seq" }], tail: true, limit: 5 };
      const refused = await http("POST", "/v1/collections/messages/query", messages, { token: await demoToken("carol") });
      assert.equal(refused.status, 403, JSON.stringify(refused.body));
      const sent = await http("POST", "/demo/send", { room: dm, text: "let me in" }, { token: await demoToken("carol") });
      assert.equal(sent.status, 403, JSON.stringify(sent.body));

      // Bob opens it: the badge goes, the message is there.
      await bobPage.click(`#rooms [data-room="${dm}"]`);
      await waitFor("bob's DM read again", async () => (await rowOf(bobPage, dm))?.unread === false);
      await waitFor("alice's message in bob's room view", async () =>
        (await bobPage.locator("#messages .message .text").allTextContents()).includes("hello bob, from the browser"),
      );
      await expectScreenEqualsQuery("bob, after reading", { on: bobPage });
      await page.mouse.move(0, 0);
      await page.evaluate(() => (document.getElementById("scroller").scrollTop = 0));
      await page.screenshot({ path: join(SCREENSHOT_DIR, "demo-room-list.png") });
      await bobPage.screenshot({ path: join(SCREENSHOT_DIR, "demo-second-user.png") });

      // The star: a favourite is the user's own write, and the Favourites chip shows it.
      await page.click("#favourite");
      await page.click('[data-chip="favourites"]');
      await waitFor("the DM among alice's favourites", async () => (await rowOf(page, dm)) !== null);
      await expectScreenEqualsQuery("Favourites with the DM");
      await page.click('[data-chip="all"]');
    } finally {
      await bobPage.close();
      await carolPage.close();
    }
  });

  await t.test("switching users: bob's list is bob's memberships, sharing some rooms with alice", async () => {
    const alice = await expectScreenEqualsQuery("alice, all by activity");
    await page.selectOption("#user-select", "bob");
    await page.waitForSelector('#signed-in[data-sub="bob"]', { timeout: SETTLE_MS });
    assert.match(await page.textContent("#signed-in"), /Signed in as bob/);
    await waitFor("bob's rooms on screen", async () => (await readScreen()).user === "bob");
    const bob = await expectScreenEqualsQuery("bob, all by activity");
    assert.equal(bob.ids.length, PAGE);
    const owners = await queryAs("bob", bob.view, ["owner"]);
    assert.ok(owners.items.every((item) => item.fields.owner === "bob"), "bob's query holds memberships of others");
    const aliceRooms = new Set(alice.ids.map(roomOf));
    const shared = bob.ids.map(roomOf).filter((room) => aliceRooms.has(room));
    assert.ok(shared.length > 0 && shared.length < PAGE, `alice and bob share ${shared.length} rooms on screen`);
    await page.click('[data-chip="dms"]');
    await expectScreenEqualsQuery("bob, DMs");
    await page.click('[data-chip="all"]');
    await page.selectOption("#user-select", "alice");
    await page.waitForSelector('#signed-in[data-sub="alice"]', { timeout: SETTLE_MS });
    const back = await expectScreenEqualsQuery("alice again");
    assert.equal(back.user, "alice");
  });

  await t.test("at phone width (390 px) the list gets the width, a room replaces it, nothing scrolls sideways", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await sleep(300);
    const layout = () =>
      page.evaluate(() => {
        const root = document.documentElement;
        const rect = (selector) => document.querySelector(selector).getBoundingClientRect().toJSON();
        const wide = [...document.querySelectorAll("body *")]
          .filter((element) => element.getClientRects().length > 0)
          .filter((element) => element.getBoundingClientRect().right > root.clientWidth + 1)
          .map((element) => `${element.tagName.toLowerCase()}#${element.id}.${element.className}`);
        const names = [...document.querySelectorAll("#rooms .room-name")].slice(0, 20).map((element) => ({
          text: element.textContent,
          width: element.clientWidth,
          clipped: element.scrollWidth > element.clientWidth,
        }));
        return { scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, wide, list: rect(".list-column"),
                 room: rect(".room-view"), panel: rect(".panel"), names };
      });
    const list = await layout();
    assert.equal(list.clientWidth, 390);
    assert.ok(list.scrollWidth <= list.clientWidth, `the document scrolls sideways: ${list.scrollWidth} px wide`);
    assert.deepEqual(list.wide, [], "elements reach past the right edge");
    assert.ok(list.list.width >= 360, `the list is ${list.list.width} px wide`);
    assert.ok(list.names.length > 0, "no room names");
    for (const name of list.names) assert.ok(name.width >= 180, `room name ${JSON.stringify(name.text)} is ${name.width} px wide`);
    await page.mouse.move(0, 0);
    await page.screenshot({ path: join(SCREENSHOT_DIR, "demo-phone.png") });
    await expectScreenEqualsQuery("at 390 px");
    // A room takes the list's place; back returns to the list.
    const first = (await readScreen()).ids[0];
    await page.click(`#rooms [data-id="${first}"]`);
    await page.waitForSelector('#room-view[data-open="true"]', { timeout: SETTLE_MS });
    const open = await layout();
    assert.deepEqual(open.wide, [], "elements reach past the right edge with a room open");
    assert.ok(open.room.width >= 360 && open.list.width === 0, `room ${open.room.width} px, list ${open.list.width} px`);
    await page.click("#back");
    // Closed, the room view is hidden at this width: attached, not visible.
    await page.waitForSelector('#room-view[data-open="false"]', { state: "attached", timeout: SETTLE_MS });
    await expectScreenEqualsQuery("at 390 px, back to the list");
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await t.test("live again: the screen follows 500 messages/s", async () => {
    const answer = await http("POST", "/demo/simulator", { rate: 500 }, { token: await adminToken() });
    assert.deepEqual(answer.body, { rate: 500 });
    const framesBefore = await page.evaluate(() => window.ordoDemo.stats.framesTotal);
    await waitFor("frames at 500 messages/s", async () =>
      (await page.evaluate(() => window.ordoDemo.stats.framesTotal)) > framesBefore + 10,
    );
    await expectScreenEqualsQuery("live at 500 messages/s", { matchesInARow: 3 });
    await http("POST", "/demo/simulator", { rate: 0 }, { token: await adminToken() });
  });

  assert.deepEqual(pageErrors, [], "the page logged errors");
});

/** A page of another origin (a Node server on another loopback port) that opens a WebSocket to Ordo. */
const OTHER_ORIGIN_PAGE = `<!doctype html>
<meta charset="utf-8">
<title>another origin</title>
<script>
  // Opens a WebSocket to \`url\`, signs in with \`token\`, subscribes to 3 memberships;
  // resolves with what happened.
  window.tryOrdo = (url, token) => new Promise((resolve) => {
    let opened = false;
    const socket = new WebSocket(url);
    const done = (result) => { resolve(result); try { socket.close(); } catch {} };
    const timer = setTimeout(() => done({ result: "timeout", opened }), 10000);
    socket.onopen = () => { opened = true; };
    socket.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      if (frame.type === "welcome") socket.send(JSON.stringify({ op: "auth", token }));
      else if (frame.type === "authed") socket.send(JSON.stringify({ op: "subscribe", sub: "x", collection: "members", limit: 3 }));
      else if (frame.type === "diffs") { clearTimeout(timer); done({ result: "works", rooms: frame.diffs[0].Reset.values.length }); }
      else if (frame.type === "error") { clearTimeout(timer); done({ result: "error", code: frame.code }); }
    };
    socket.onclose = (event) => { if (!opened) { clearTimeout(timer); resolve({ result: "refused", code: event.code }); } };
  });
</script>
<p>another origin</p>`;

/** Serves OTHER_ORIGIN_PAGE on a free loopback port; resolves with its origin and a stop function. */
async function startOtherOrigin() {
  const other = createServer((request, response) => {
    response.writeHead(200, { "content-type": "text/html; charset=utf-8" });
    response.end(OTHER_ORIGIN_PAGE);
  });
  await new Promise((done) => other.listen(0, "127.0.0.1", done));
  const origin = `http://127.0.0.1:${other.address().port}`;
  return { origin, stop: () => new Promise((done) => other.close(done)) };
}

test("a page of another origin: its WebSocket is refused, unless the server allows the origin", async () => {
  const other = await startOtherOrigin();
  let allowing;
  const foreign = await browser.newPage();
  try {
    await foreign.goto(`${other.origin}/`);
    const wsUrl = (target) => `${target.base.replace(/^http/, "ws")}/v1/ws`;

    // The demo's server allows its own origin only.
    const refused = await foreign.evaluate(([url, token]) => window.tryOrdo(url, token), [wsUrl(server), await demoToken("alice")]);
    assert.equal(refused.result, "refused", `a WebSocket from ${other.origin} was not refused: ${JSON.stringify(refused)}`);

    // A second server that allows that origin.
    allowing = await startServer(["--allow-origin", other.origin]);
    const works = await foreign.evaluate(([url, token]) => window.tryOrdo(url, token), [
      wsUrl(allowing),
      await demoToken("bob", allowing),
    ]);
    assert.equal(works.result, "works", `a WebSocket from an allowed origin: ${JSON.stringify(works)}`);
    assert.equal(works.rooms, 3);
  } finally {
    await foreign.close();
    await other.stop();
    if (allowing) await stopServer(allowing);
  }
});
