// The demo page: one live subscription to a window of `rooms`, rendered as a chat
// room list. Every control changes the subscription (set_view / set_range); the
// server sends the diffs that keep `list.items` equal to the window, and the page
// renders `list.items`, reusing each row's element by room id.
//
// The server runs with auth (`ordo serve --demo`): the page signs in as one of the
// demo's users with a token from `POST /demo/token`, through the client's
// `tokenProvider` (asked again before the token expires). Each user reads only the
// rooms it owns; switching users makes a new connection.

import { OrdoClient } from "/demo/ordo-client.js";

const COLLECTION = "rooms";
const PAGE = 50;
// The server's window limit (`max_window_limit`, docs/PROTOCOL.md).
const MAX_WINDOW = 1000;
// Load more when the user is this close to the bottom of the list.
const LOAD_MORE_PX = 400;
// Typing sends at most one set_view per pause: a connection may send 100 messages/s.
const SEARCH_DEBOUNCE_MS = 150;
const USERS = ["alice", "bob"];
const USER_KEY = "ordo-demo-user";

const CHIP_FILTERS = {
  all: null,
  unread: { field: "unread", op: "gt", value: 0 },
  dms: { field: "dm", op: "eq", value: true },
  favourites: { field: "favourite", op: "eq", value: true },
};
const SORTS = {
  activity: [{ field: "recency", dir: "desc" }],
  name: [{ field: "name", dir: "asc", case_insensitive: true }],
};

const $ = (id) => document.getElementById(id);
const elements = {
  rooms: $("rooms"),
  scroller: $("scroller"),
  footer: $("list-footer"),
  search: $("search"),
  connection: $("connection"),
  error: $("error"),
  viewJson: $("view-json"),
  rate: $("rate"),
  rateNumber: $("rate-number"),
  rateHint: $("rate-hint"),
  simulator: $("simulator"),
  simulatorStatus: $("simulator-status"),
  signedIn: $("signed-in"),
  userSwitch: document.querySelector(".user-switch"),
};

const controls = { chip: "all", search: "", sort: "activity", limit: PAGE };

function filterFor({ chip, search }) {
  const parts = [];
  if (CHIP_FILTERS[chip]) parts.push(CHIP_FILTERS[chip]);
  if (search) parts.push({ field: "name", contains: search });
  if (parts.length === 0) return null;
  return parts.length === 1 ? parts[0] : { all: parts };
}

/** The window the page shows: the body of a one-shot query of the same view. */
function currentView() {
  return { filter: filterFor(controls), sort: SORTS[controls.sort], offset: 0, limit: controls.limit };
}

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/ws`;

// ---- signing in ---------------------------------------------------------------

/** Who the page is (or is becoming): the demo user, the client and list made for it, its last token. */
const account = { user: null, token: null, identity: null };
let client = null;
let list = null;

function savedUser() {
  const asked = new URLSearchParams(location.search).get("user");
  if (USERS.includes(asked)) return asked;
  try {
    const saved = localStorage.getItem(USER_KEY);
    if (USERS.includes(saved)) return saved;
  } catch {
    // Storage may be off; alice it is.
  }
  return USERS[0];
}

/** The client's tokenProvider: a fresh demo token for `user` (called at every connection and before expiry). */
async function demoToken(user) {
  const response = await fetch("/demo/token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ user }),
  });
  if (!response.ok) throw new Error(`POST /demo/token answered ${response.status}: ${await response.text()}`);
  const { token } = await response.json();
  if (account.user === user) account.token = token;
  return token;
}

/** Signs in as `user`: a new connection whose list has the page's current view. */
function signIn(user) {
  if (client) client.close();
  account.user = user;
  account.token = null;
  account.identity = null;
  try {
    localStorage.setItem(USER_KEY, user);
  } catch {
    // Not kept, then.
  }
  for (const button of document.querySelectorAll("[data-user]")) {
    button.setAttribute("aria-pressed", String(button.dataset.user === user));
  }
  showAccount();
  document.body.dataset.ready = "false";
  // Another user has other rooms: start from the first page, with an empty list.
  controls.limit = PAGE;
  elements.scroller.scrollTop = 0;
  for (const row of rows.values()) row.element.remove();
  rows.clear();
  elements.footer.textContent = "connecting…";
  stats.newestRecencyShown = 0;
  showView();

  elements.connection.dataset.state = "connecting";
  elements.connection.textContent = "connecting";
  const mine = new OrdoClient({ url: wsUrl, tokenProvider: () => demoToken(user) });
  client = mine;
  // A previous client's events (its close, say) no longer show.
  mine.on("state", (state) => {
    if (client !== mine) return;
    elements.connection.dataset.state = state;
    elements.connection.textContent = state;
    // Open without an identity: the server runs without auth.
    if (state === "open" && mine.identity === null) showAccount();
  });
  mine.on("auth", (identity) => {
    if (client !== mine) return;
    account.identity = identity;
    showAccount();
  });
  mine.on("error", (error) => {
    if (client === mine) showError(`${error.code ?? "error"}: ${error.message}`);
  });

  list = mine.subscribe({ collection: COLLECTION, ...currentView(), payload: true });
  const shown = list;
  list.on("change", ({ diffs }) => {
    const now = performance.now();
    const nDiffs = Array.isArray(diffs) ? diffs.length : 0;
    stats.framesTotal += 1;
    stats.diffsTotal += nDiffs;
    stats.recent.push([now, nDiffs]);
    stats.firstUnrenderedAt ??= now;
    scheduleRender();
  });
  list.on("error", (error) => showError(`${error.code ?? "error"}: ${error.message}`));
  list.ready.then(
    () => {
      if (list === shown) document.body.dataset.ready = "true";
    },
    (error) => {
      if (list === shown && error.code !== "closed") showError(`subscribing failed: ${error.code}: ${error.message}`);
    },
  );
}

function showAccount() {
  const { identity, user } = account;
  const label = elements.signedIn;
  label.replaceChildren();
  elements.userSwitch.hidden = false;
  if (identity) {
    const name = document.createElement("strong");
    name.id = "user-name";
    name.textContent = identity.sub;
    const role = document.createElement("span");
    role.className = "role";
    role.textContent = identity.role;
    label.append("Signed in as ", name, " ", role);
    label.dataset.sub = identity.sub;
  } else if (client?.state === "open") {
    label.append("No sign-in: the server runs without auth");
    delete label.dataset.sub;
    elements.userSwitch.hidden = true;
  } else {
    const name = document.createElement("strong");
    name.id = "user-name";
    name.textContent = user ?? "…";
    label.append("Signing in as ", name, "…");
    delete label.dataset.sub;
  }
}

for (const button of document.querySelectorAll("[data-user]")) {
  button.addEventListener("click", () => {
    if (button.dataset.user !== account.user) signIn(button.dataset.user);
  });
}

// ---- statistics -------------------------------------------------------------

const stats = {
  framesTotal: 0,
  diffsTotal: 0,
  recent: [], // [arrival ms, n diffs] of the last second's frames
  firstUnrenderedAt: null,
  renderLatencyMs: null,
  writeLatencyMs: null,
  newestRecencyShown: 0,
  renders: 0,
};

function showError(text, kind = "error") {
  elements.error.textContent = text;
  elements.error.dataset.kind = kind;
  elements.error.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => (elements.error.hidden = true), 6000);
}

setInterval(() => {
  const now = performance.now();
  while (stats.recent.length && stats.recent[0][0] < now - 1000) stats.recent.shift();
  $("stat-frames-per-second").textContent = stats.recent.length;
  $("stat-diffs-per-second").textContent = stats.recent.reduce((sum, [, n]) => sum + n, 0);
  $("stat-diffs-total").textContent = stats.diffsTotal.toLocaleString("en");
  $("stat-render-latency").textContent = stats.renderLatencyMs === null ? "–" : `${stats.renderLatencyMs.toFixed(1)} ms`;
  $("stat-write-latency").textContent = stats.writeLatencyMs === null ? "–" : `${Math.round(stats.writeLatencyMs)} ms`;
}, 250);

// ---- rendering --------------------------------------------------------------

const rows = new Map(); // room id -> { element, signature }
let renderScheduled = false;

function scheduleRender() {
  if (renderScheduled) return;
  renderScheduled = true;
  requestAnimationFrame(() => {
    renderScheduled = false;
    render(list.items);
  });
}

function signature(item) {
  const f = item.fields ?? {};
  return `${f.name}\u0000${f.recency}\u0000${f.unread}\u0000${f.dm}\u0000${f.favourite}\u0000${item.payload?.last_message ?? ""}`;
}

function render(items) {
  const container = elements.rooms;
  const keep = new Set();
  let previous = null;
  let newestRecency = 0;
  for (const item of items) {
    let row = rows.get(item.id);
    if (!row) {
      row = { element: createRow(item.id), signature: "" };
      rows.set(item.id, row);
    }
    const itemSignature = signature(item);
    if (row.signature !== itemSignature) {
      fillRow(row.element, item);
      row.signature = itemSignature;
    }
    keep.add(item.id);
    const expected = previous ? previous.nextSibling : container.firstChild;
    if (expected !== row.element) container.insertBefore(row.element, expected);
    previous = row.element;
    newestRecency = Math.max(newestRecency, item.fields?.recency ?? 0);
  }
  for (const [id, row] of rows) {
    if (!keep.has(id)) {
      row.element.remove();
      rows.delete(id);
    }
  }
  if (stats.firstUnrenderedAt !== null) {
    stats.renderLatencyMs = performance.now() - stats.firstUnrenderedAt;
    stats.firstUnrenderedAt = null;
  }
  if (newestRecency > stats.newestRecencyShown) {
    // Only a message newer than anything shown so far says how late the screen is.
    if (stats.newestRecencyShown > 0) stats.writeLatencyMs = Date.now() - newestRecency;
    stats.newestRecencyShown = newestRecency;
  }
  stats.renders += 1;
  $("stat-window").textContent = controls.limit;
  $("stat-items").textContent = items.length;
  updateFooter(items.length);
  maybeLoadMore();
}

function createRow(id) {
  const element = document.createElement("li");
  element.className = "room";
  element.dataset.id = id;
  element.innerHTML = `
    <div class="avatar"></div>
    <div class="room-body">
      <div class="room-line"><span class="room-name"></span><span class="room-time"></span></div>
      <div class="room-line"><span class="room-last"></span><span class="badge"></span></div>
    </div>`;
  return element;
}

function fillRow(element, item) {
  const { name = "", recency = 0, unread = 0, dm = false, favourite = false } = item.fields ?? {};
  element.classList.toggle("dm", !!dm);
  element.classList.toggle("unread", unread > 0);
  const avatar = element.querySelector(".avatar");
  avatar.textContent = firstLetter(name);
  avatar.style.background = `hsl(${hue(item.id)} 55% 52%)`;
  const nameElement = element.querySelector(".room-name");
  nameElement.textContent = name ?? "";
  if (favourite) {
    const star = document.createElement("span");
    star.className = "star";
    star.textContent = "★";
    star.title = "Favourite";
    nameElement.prepend(star);
  }
  const time = element.querySelector(".room-time");
  time.dataset.recency = recency ?? 0;
  time.textContent = timeAgo(recency);
  element.querySelector(".room-last").textContent = item.payload?.last_message ?? "";
  element.querySelector(".badge").textContent = unread > 99 ? "99+" : String(unread ?? 0);
}

function firstLetter(name) {
  const letter = [...(name ?? "").replace(/^[^\p{L}\p{N}]+/u, "")][0] ?? "#";
  return letter.toLocaleUpperCase();
}

function hue(id) {
  let hash = 0;
  for (let index = 0; index < id.length; index++) hash = (hash * 31 + id.charCodeAt(index)) | 0;
  return Math.abs(hash) % 360;
}

function timeAgo(recency) {
  if (!recency) return "";
  const seconds = Math.max(0, (Date.now() - recency) / 1000);
  if (seconds < 5) return "now";
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

// "now" turns into "12 s": refresh the labels without touching anything else.
setInterval(() => {
  for (const time of elements.rooms.querySelectorAll(".room-time")) {
    time.textContent = timeAgo(Number(time.dataset.recency));
  }
}, 5000);

function updateFooter(nItems) {
  const footer = elements.footer;
  if (nItems < controls.limit) footer.textContent = nItems === 0 ? "No rooms match." : `End of the list: ${nItems} rooms.`;
  else if (controls.limit >= MAX_WINDOW) footer.textContent = `${MAX_WINDOW} rooms: the largest window a subscription can have.`;
  else footer.textContent = "Loading more…";
}

// ---- infinite scroll --------------------------------------------------------

function maybeLoadMore() {
  const { scroller } = elements;
  const nearBottom = scroller.scrollTop + scroller.clientHeight > scroller.scrollHeight - LOAD_MORE_PX;
  // Grow only once the window is full: a window the view cannot fill has no more to give,
  // and a request in flight has not filled it yet.
  if (nearBottom && list.items.length >= controls.limit && controls.limit < MAX_WINDOW) {
    controls.limit = Math.min(controls.limit + PAGE, MAX_WINDOW);
    list.setRange(0, controls.limit);
    showView();
  }
}

elements.scroller.addEventListener("scroll", maybeLoadMore, { passive: true });

// ---- controls ---------------------------------------------------------------

let appliedView = JSON.stringify({ filter: filterFor(controls), sort: SORTS[controls.sort] });

function applyView() {
  const next = { filter: filterFor(controls), sort: SORTS[controls.sort] };
  const key = JSON.stringify(next);
  if (key === appliedView) return;
  appliedView = key;
  // Shrink first: the new view's diffs then cover one page, not the grown window.
  if (controls.limit !== PAGE) {
    controls.limit = PAGE;
    list.setRange(0, PAGE);
  }
  list.setView(next);
  elements.scroller.scrollTop = 0;
  showView();
}

function showView() {
  elements.viewJson.textContent = JSON.stringify({ collection: COLLECTION, ...currentView() }, null, 1);
  $("stat-window").textContent = controls.limit;
}

for (const button of document.querySelectorAll("[data-chip]")) {
  button.addEventListener("click", () => {
    controls.chip = button.dataset.chip;
    for (const other of document.querySelectorAll("[data-chip]")) other.setAttribute("aria-pressed", String(other === button));
    applyView();
  });
}

for (const button of document.querySelectorAll("[data-sort]")) {
  button.addEventListener("click", () => {
    controls.sort = button.dataset.sort;
    for (const other of document.querySelectorAll("[data-sort]")) other.setAttribute("aria-pressed", String(other === button));
    applyView();
  });
}

let searchTimer = null;
elements.search.addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => {
    // The server limits a needle to 256 bytes; `maxlength` keeps it at 64 characters.
    controls.search = elements.search.value.trim();
    applyView();
  }, SEARCH_DEBOUNCE_MS);
});

// Clicking a room marks it read: a plain HTTP write; the subscription brings the change.
// The demo's users are readers, whom the server refuses writes: say so instead of asking.
elements.rooms.addEventListener("click", async (event) => {
  const row = event.target.closest("[data-id]");
  if (!row) return;
  const role = account.identity?.role;
  if (role === "reader") {
    showError(`${account.identity.sub} is a reader: marking a room read takes a writer or admin token.`, "note");
    return;
  }
  const headers = { "content-type": "application/json" };
  if (account.identity && account.token) headers.authorization = `Bearer ${account.token}`;
  const response = await fetch(`/v1/collections/${COLLECTION}/batch`, {
    method: "POST",
    headers,
    body: JSON.stringify({ ops: [{ op: "upsert", id: row.dataset.id, fields: { unread: 0 } }] }),
  });
  if (!response.ok) showError(`marking read failed: ${response.status} ${await response.text()}`);
});

// ---- simulator --------------------------------------------------------------

// Read-only: `GET /demo/simulator` is public, setting the rate takes an admin token.
let simulatorOn = true;
let lastSent = null;

async function refreshSimulator() {
  if (!simulatorOn) return;
  try {
    const response = await fetch("/demo/simulator");
    if (response.status === 404) {
      simulatorOn = false;
      elements.simulator.classList.add("off");
      elements.rateHint.hidden = true;
      elements.simulatorStatus.textContent = "Off: start the server with `ordo serve --demo` for live traffic.";
      return;
    }
    const { rate, sent } = await response.json();
    const perSecond = lastSent === null ? null : (sent - lastSent.sent) / ((performance.now() - lastSent.at) / 1000);
    lastSent = { sent, at: performance.now() };
    elements.rate.value = rate;
    elements.rateNumber.value = String(rate);
    elements.rateNumber.textContent = String(rate);
    elements.simulatorStatus.textContent =
      `${sent.toLocaleString("en")} messages written` + (perSecond === null ? "" : `, ${Math.round(perSecond)} / s`);
  } catch (error) {
    elements.simulatorStatus.textContent = `simulator: ${error.message}`;
  }
}

refreshSimulator();
setInterval(refreshSimulator, 1000);

// ---- for the browser test and the console -----------------------------------

window.ordoDemo = {
  get client() {
    return client;
  },
  get list() {
    return list;
  },
  /** The demo user the page signed in as (or is signing in as). */
  get user() {
    return account.user;
  },
  /** Who the server says the connection is (`authed`), or null. */
  get identity() {
    return account.identity;
  },
  signIn,
  currentView,
  idsOnScreen: () => [...elements.rooms.querySelectorAll("[data-id]")].map((row) => row.dataset.id),
  stats,
};
signIn(savedUser());
