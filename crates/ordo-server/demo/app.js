// The demo page: a chat's room list. The signed-in user's list is one live
// subscription to a window of its `members`, sorted by the rooms' activity read
// through the `room` reference (`room.recency`), so a message to a room is one
// write, and the server moves that room in every member's list. Every control
// changes the subscription (set_view / set_range); the page renders `list.items`,
// reusing each row's element by id.
//
// Opening a room subscribes to its last messages (a tail window of `messages`
// pinned to the room: the server lets a member read them, and ends the
// subscription if the membership ends), marks the room read (the user may set
// `read_upto` of its own membership, nothing else) and offers a composer:
// `POST /demo/send` is the app's backend, which writes the message and the room.
//
// The server runs with auth (`ordo serve --demo`): the page signs in as one of the
// demo's users with a token from `POST /demo/token`, through the client's
// `tokenProvider` (asked again before the token expires).

import { OrdoClient } from "/demo/ordo-client.js";

const COLLECTION = "members";
const PAGE = 50;
// The server's window limit (`max_window_limit`, docs/PROTOCOL.md).
const MAX_WINDOW = 1000;
// Load more when the user is this close to the bottom of the list.
const LOAD_MORE_PX = 400;
// Typing sends at most one set_view per pause: a connection may send 100 messages/s.
const SEARCH_DEBOUNCE_MS = 150;
// A room shows this many of its last messages.
const ROOM_TAIL = 30;
const USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"];
const USER_KEY = "ordo-demo-user";
const LIST_FIELDS = ["read_upto", "favourite", "room.name", "room.preview", "room.recency", "room.last_seq", "room.dm"];

const CHIP_FILTERS = {
  all: null,
  // Field against field: a room is unread when its last message is past the member's read mark.
  unread: { field: "room.last_seq", op: "gt", value: { field: "read_upto" } },
  favourites: { field: "favourite", op: "eq", value: true },
  dms: { field: "room.dm", op: "eq", value: true },
};
const SORTS = {
  activity: [{ field: "room.recency", dir: "desc" }],
  name: [{ field: "room.name", dir: "asc", case_insensitive: true }],
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
  userSelect: $("user-select"),
  roomView: $("room-view"),
  roomTitle: $("room-title"),
  roomHint: $("room-hint"),
  messages: $("messages"),
  composer: $("composer"),
  messageText: $("message-text"),
  favourite: $("favourite"),
  back: $("back"),
};

const controls = { chip: "all", search: "", sort: "activity", limit: PAGE };

function filterFor({ chip, search }) {
  const parts = [];
  if (CHIP_FILTERS[chip]) parts.push(CHIP_FILTERS[chip]);
  if (search) parts.push({ field: "room.name", contains: search });
  if (parts.length === 0) return null;
  return parts.length === 1 ? parts[0] : { all: parts };
}

/** The window the page shows: the body of a one-shot query of the same view. */
function currentView() {
  return { filter: filterFor(controls), sort: SORTS[controls.sort], offset: 0, limit: controls.limit, fields: LIST_FIELDS };
}

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/ws`;

// ---- signing in ---------------------------------------------------------------

/** Who the page is (or is becoming): the demo user, its last token and the identity the server gave. */
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

/** A request with the signed-in user's token, as the page's own writes go. */
async function authorizedFetch(path, body) {
  const token = account.token ?? (await demoToken(account.user));
  return fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
  });
}

/** Signs in as `user`: a new connection whose list has the page's current view. */
function signIn(user) {
  if (client) client.close();
  closeRoom();
  account.user = user;
  account.token = null;
  account.identity = null;
  try {
    localStorage.setItem(USER_KEY, user);
  } catch {
    // Not kept, then.
  }
  elements.userSelect.value = user;
  showAccount();
  document.body.dataset.ready = "false";
  // Another user has other rooms: start from the first page, with an empty list.
  controls.limit = PAGE;
  elements.scroller.scrollTop = 0;
  for (const row of rows.values()) row.element.remove();
  rows.clear();
  elements.footer.textContent = "connecting…";
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
  });
  mine.on("auth", (identity) => {
    if (client !== mine) return;
    account.identity = identity;
    showAccount();
  });
  mine.on("error", (error) => {
    if (client === mine) showError(`${error.code ?? "error"}: ${error.message}`);
  });

  list = mine.subscribe({ collection: COLLECTION, ...currentView(), payload: false });
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
  const name = document.createElement("strong");
  name.id = "user-name";
  if (identity) {
    name.textContent = identity.sub;
    const role = document.createElement("span");
    role.className = "role";
    role.textContent = identity.role;
    label.append("Signed in as ", name, " ", role);
    label.dataset.sub = identity.sub;
  } else {
    name.textContent = user ?? "…";
    label.append("Signing in as ", name, "…");
    delete label.dataset.sub;
  }
}

elements.userSelect.addEventListener("change", () => {
  if (elements.userSelect.value !== account.user) signIn(elements.userSelect.value);
});

// ---- statistics -------------------------------------------------------------

const stats = {
  framesTotal: 0,
  diffsTotal: 0,
  recent: [], // [arrival ms, n diffs] of the last second's frames
  firstUnrenderedAt: null,
  renderLatencyMs: null,
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
}, 250);

// ---- the room list ------------------------------------------------------------

const rows = new Map(); // membership id -> { element, signature }
let renderScheduled = false;

function scheduleRender() {
  if (renderScheduled) return;
  renderScheduled = true;
  requestAnimationFrame(() => {
    renderScheduled = false;
    render(list.items);
  });
}

/** A room's unread count, from projected fields: its last message's number minus the member's read mark. */
function unreadOf(fields) {
  return Math.max(0, (fields["room.last_seq"] ?? 0) - (fields.read_upto ?? 0));
}

function signature(item) {
  const f = item.fields ?? {};
  return LIST_FIELDS.map((name) => String(f[name])).join("\u0000");
}

function render(items) {
  const container = elements.rooms;
  const keep = new Set();
  let previous = null;
  for (const item of items) {
    let row = rows.get(item.id);
    if (!row) {
      row = { element: createRow(item), signature: "" };
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
  stats.renders += 1;
  $("stat-window").textContent = controls.limit;
  $("stat-items").textContent = items.length;
  updateFooter(items.length);
  maybeLoadMore();
  followOpenRoom(items);
}

/** The room a membership id names (`user:room`). */
function roomOf(membershipId) {
  return membershipId.slice(membershipId.indexOf(":") + 1);
}

function createRow(item) {
  const element = document.createElement("li");
  element.className = "room";
  element.dataset.id = item.id;
  element.dataset.room = roomOf(item.id);
  element.innerHTML = `
    <div class="avatar"></div>
    <div class="room-body">
      <div class="room-line"><span class="room-name"></span><span class="room-time"></span></div>
      <div class="room-line"><span class="room-last"></span><span class="badge"></span></div>
    </div>`;
  return element;
}

function fillRow(element, item) {
  const fields = item.fields ?? {};
  const name = fields["room.name"] ?? "";
  const recency = fields["room.recency"] ?? 0;
  const unread = unreadOf(fields);
  element.classList.toggle("dm", !!fields["room.dm"]);
  element.classList.toggle("unread", unread > 0);
  element.classList.toggle("open", element.dataset.room === openRoom.id);
  const avatar = element.querySelector(".avatar");
  avatar.textContent = firstLetter(name);
  avatar.style.background = `hsl(${hue(element.dataset.room)} 55% 52%)`;
  const nameElement = element.querySelector(".room-name");
  nameElement.textContent = name;
  if (fields.favourite) {
    const star = document.createElement("span");
    star.className = "star";
    star.textContent = "★";
    star.title = "Favourite";
    nameElement.prepend(star);
  }
  const time = element.querySelector(".room-time");
  time.dataset.recency = recency;
  time.textContent = timeAgo(recency);
  element.querySelector(".room-last").textContent = fields["room.preview"] ?? "";
  element.querySelector(".badge").textContent = unread > 99 ? "99+" : String(unread);
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

function timeAgo(ms) {
  if (!ms) return "";
  const seconds = Math.max(0, (Date.now() - ms) / 1000);
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

elements.rooms.addEventListener("click", (event) => {
  const row = event.target.closest("[data-id]");
  if (row) openRoomOf(row.dataset.id);
});

// ---- the open room ------------------------------------------------------------

/** The room on screen: its id, its membership, its messages' live list, the read mark last sent. */
const openRoom = { id: null, membership: null, messages: null, markedUpto: 0 };

function membershipItem(membershipId) {
  return list?.items.find((item) => item.id === membershipId) ?? null;
}

function openRoomOf(membershipId) {
  closeRoom();
  const item = membershipItem(membershipId);
  openRoom.id = roomOf(membershipId);
  openRoom.membership = membershipId;
  elements.roomView.dataset.open = "true";
  document.body.classList.add("room-open");
  elements.roomTitle.textContent = item?.fields?.["room.name"] ?? openRoom.id;
  elements.roomHint.hidden = true;
  // A chat followed from PostgreSQL is read-only here: messages are INSERTs there.
  elements.composer.hidden = followsPostgres;
  elements.favourite.hidden = followsPostgres;
  for (const row of rows.values()) row.element.classList.toggle("open", row.element.dataset.room === openRoom.id);
  // The room's messages: pinned to the room (the server lets only its members read them), the last ROOM_TAIL.
  const messages = client.subscribe({
    collection: "messages",
    filter: { field: "room", op: "eq", value: openRoom.id },
    sort: [{ field: "seq", dir: "asc" }],
    tail: true,
    limit: ROOM_TAIL,
    fields: ["seq", "author", "text", "time"],
    payload: false,
  });
  openRoom.messages = messages;
  messages.on("change", () => {
    if (openRoom.messages === messages) renderMessages(messages.items);
  });
  messages.on("ended", (ended) => {
    if (openRoom.messages === messages) showError(`this room's messages ended: ${ended.reason ?? "ended"}`, "note");
  });
  messages.on("error", (error) => showError(`${error.code ?? "error"}: ${error.message}`));
  if (item) followOpenRoom(list.items);
}

function closeRoom() {
  openRoom.messages?.close();
  Object.assign(openRoom, { id: null, membership: null, messages: null, markedUpto: 0 });
  elements.roomView.dataset.open = "false";
  document.body.classList.remove("room-open");
  elements.roomTitle.textContent = "No room open";
  elements.messages.replaceChildren();
  elements.roomHint.hidden = false;
  elements.composer.hidden = true;
  elements.favourite.hidden = true;
  for (const row of rows.values()) row.element.classList.remove("open");
}

/** Keeps the open room read while it is open (a write of the user's own read mark), and its star current. */
function followOpenRoom(items) {
  if (!openRoom.membership) return;
  const item = items.find((candidate) => candidate.id === openRoom.membership);
  if (!item) return;
  const fields = item.fields ?? {};
  elements.favourite.setAttribute("aria-pressed", String(!!fields.favourite));
  elements.favourite.textContent = fields.favourite ? "★" : "☆";
  const lastSeq = fields["room.last_seq"] ?? 0;
  if (!followsPostgres && lastSeq > (fields.read_upto ?? 0) && lastSeq > openRoom.markedUpto) {
    openRoom.markedUpto = lastSeq;
    writeMembership({ set_max: { read_upto: lastSeq } });
  }
}

/** The user's own membership of the open room: the only writes its token may make. */
async function writeMembership(change) {
  const op = { op: "upsert", id: openRoom.membership, ...change };
  const response = await authorizedFetch(`/v1/collections/${COLLECTION}/batch`, { ops: [op] });
  if (!response.ok) showError(`writing the membership failed: ${response.status} ${await response.text()}`);
}

function renderMessages(items) {
  const container = elements.messages;
  const atBottom = container.scrollTop + container.clientHeight >= container.scrollHeight - 8;
  container.replaceChildren(
    ...items.map((item) => {
      const { author = "", text = "", time = 0 } = item.fields ?? {};
      const line = document.createElement("li");
      line.className = "message";
      line.classList.toggle("mine", author === account.user);
      line.dataset.id = item.id;
      const who = document.createElement("span");
      who.className = "author";
      who.textContent = author;
      const body = document.createElement("span");
      body.className = "text";
      body.textContent = text;
      const when = document.createElement("time");
      when.textContent = timeAgo(time);
      line.append(who, body, when);
      return line;
    }),
  );
  if (atBottom) container.scrollTop = container.scrollHeight;
}

elements.back.addEventListener("click", closeRoom);

elements.favourite.addEventListener("click", () => {
  if (!openRoom.membership) return;
  const favourite = elements.favourite.getAttribute("aria-pressed") !== "true";
  writeMembership({ fields: { favourite } });
});

elements.composer.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = elements.messageText.value.trim();
  if (!text || !openRoom.id) return;
  elements.messageText.value = "";
  // The app's backend writes the message and the room: the user may not write either.
  const response = await authorizedFetch("/demo/send", { room: openRoom.id, text });
  if (!response.ok) showError(`sending failed: ${response.status} ${await response.text()}`);
});

// ---- simulator --------------------------------------------------------------

// Read-only: `GET /demo/simulator` is public, setting the rate takes an admin token.
let simulatorOn = true;
let lastSent = null;
// Whether the chat follows PostgreSQL (`make pg-demo`): then no simulator, no composer, no writes.
let followsPostgres = false;

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
    const { rate, sent, follows_postgres: followed } = await response.json();
    if (followed) {
      followsPostgres = true;
      simulatorOn = false;
      elements.simulator.classList.add("off");
      elements.rateHint.hidden = true;
      elements.composer.hidden = true;
      elements.favourite.hidden = true;
      elements.simulatorStatus.textContent =
        "Off: this chat follows PostgreSQL. A message is an INSERT there (`make pg-demo` prints the psql command).";
      return;
    }
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
  /** The open room's messages (a live list), or null. */
  get messages() {
    return openRoom.messages;
  },
  /** The demo user the page signed in as (or is signing in as). */
  get user() {
    return account.user;
  },
  /** Who the server says the connection is (`authed`), or null. */
  get identity() {
    return account.identity;
  },
  /** The signed-in user's current token (for the test's one-shot queries). */
  get token() {
    return account.token;
  },
  signIn,
  currentView,
  openRoom: (roomId) => openRoomOf(`${account.user}:${roomId}`),
  idsOnScreen: () => [...elements.rooms.querySelectorAll("[data-id]")].map((row) => row.dataset.id),
  messageIdsOnScreen: () => [...elements.messages.querySelectorAll("[data-id]")].map((line) => line.dataset.id),
  stats,
};
signIn(savedUser());
