// src/auth.ts
function decodeBase64Url(text) {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const padded = base64 + "=".repeat((4 - base64.length % 4) % 4);
  const binary = atob(padded);
  const bytes = new Uint8Array(binary.length);
  for (let index = 0; index < binary.length; index++) bytes[index] = binary.charCodeAt(index);
  return new TextDecoder().decode(bytes);
}
function jwtClaims(token) {
  const parts = token.split(".");
  if (parts.length !== 3 || parts[1] === "") return null;
  try {
    const claims = JSON.parse(decodeBase64Url(parts[1]));
    return claims !== null && typeof claims === "object" && !Array.isArray(claims) ? claims : null;
  } catch {
    return null;
  }
}
function jwtTimes(token) {
  const claims = jwtClaims(token);
  const time = (value) => typeof value === "number" && Number.isFinite(value) ? value : null;
  return { exp: time(claims?.exp), iat: time(claims?.iat) };
}
var MAX_REFRESH_MARGIN_MS = 6e4;
var MIN_REFRESH_DELAY_MS = 1e3;
function refreshDelayMs(exp, iat, nowMs) {
  if (exp === null) return null;
  const expMs = exp * 1e3;
  const lifetimeMs = Math.max(0, expMs - (iat !== null ? iat * 1e3 : nowMs));
  const at = expMs - Math.min(MAX_REFRESH_MARGIN_MS, lifetimeMs / 5);
  return Math.min(2147483647, Math.max(MIN_REFRESH_DELAY_MS, at - nowMs));
}

// src/emitter.ts
var Emitter = class {
  constructor() {
    this.listeners = /* @__PURE__ */ new Map();
  }
  on(event, listener) {
    let set = this.listeners.get(event);
    if (!set) {
      set = /* @__PURE__ */ new Set();
      this.listeners.set(event, set);
    }
    set.add(listener);
    return () => {
      set.delete(listener);
    };
  }
  /** Calls every listener of `event`; a listener that throws does not stop the others. */
  emit(event, value) {
    const set = this.listeners.get(event);
    if (!set || set.size === 0) return;
    for (const listener of [...set]) {
      try {
        listener(value);
      } catch (error) {
        setTimeout(() => {
          throw error;
        }, 0);
      }
    }
  }
  count(event) {
    return this.listeners.get(event)?.size ?? 0;
  }
};

// src/errors.ts
var OrdoError = class extends Error {
  constructor(code, message, sub) {
    super(message);
    this.name = "OrdoError";
    this.code = code;
    if (sub !== void 0) this.sub = sub;
  }
};

// src/nodes.ts
var NodeRotation = class {
  constructor(urls, initialDelayMs, maxDelayMs, random = Math.random) {
    this.initialDelayMs = initialDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.random = random;
    this.idx = 0;
    /** Failures since the last good connection, in the current round (0..urls.length). */
    this.failsInRound = 0;
    /** Full rounds failed since the last good connection: the backoff's exponent. */
    this.rounds = 0;
    const list = typeof urls === "string" ? [urls] : [...urls];
    if (list.length === 0) throw new TypeError("`url` needs at least one node URL");
    for (const url of list) {
      if (typeof url !== "string" || url === "") throw new TypeError(`not a node URL: ${String(url)}`);
    }
    this.urls = list;
  }
  /** The URL of the node in use (or being tried). */
  get current() {
    return this.urls[this.idx];
  }
  /** Every node URL, in rotation order. */
  get all() {
    return this.urls;
  }
  /** Full rounds failed since the last good connection. */
  get failedRounds() {
    return this.rounds;
  }
  /**
   * The node in use failed (lost, refused, or unusable): moves to the next one and
   * returns the delay in ms before connecting to it. Within a round the delay is a
   * jitter below `initialDelayMs / 2` (so the clients of a dead node do not all land at
   * once); ending a round it is the backoff: half to all of
   * `min(maxDelayMs, initialDelayMs * 2^rounds)`.
   */
  fail() {
    this.idx = (this.idx + 1) % this.urls.length;
    this.failsInRound += 1;
    if (this.failsInRound < this.urls.length) return this.random() * (this.initialDelayMs / 2);
    this.failsInRound = 0;
    const ceiling = Math.min(this.maxDelayMs, this.initialDelayMs * 2 ** Math.min(this.rounds, 30));
    this.rounds += 1;
    return ceiling / 2 + this.random() * (ceiling / 2);
  }
  /** The node in use took the connection (handshake done): the next failure starts a fresh round. */
  succeeded() {
    this.failsInRound = 0;
    this.rounds = 0;
  }
};

// src/diffs.ts
function bad(message) {
  return new OrdoError("invalid_diffs", message);
}
function checkIndex(kind, index, bound) {
  if (typeof index !== "number" || !Number.isInteger(index) || index < 0 || index > bound) {
    throw bad(`${kind}: index ${String(index)} is out of range for a list of ${kind === "Insert" ? bound : bound + 1} items`);
  }
  return index;
}
function checkItem(kind, value) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw bad(`${kind}: an item is not an object`);
  const { id, fields } = value;
  if (typeof id !== "string") throw bad(`${kind}: an item without a string \`id\``);
  if (fields === null || typeof fields !== "object" || Array.isArray(fields)) {
    throw bad(`${kind}: item \`${id}\` has no \`fields\` object`);
  }
  return value;
}
function checkItems(kind, values) {
  if (!Array.isArray(values)) throw bad(`${kind}: \`values\` is not an array`);
  for (const value of values) checkItem(kind, value);
  return values;
}
function applyDiffs(items, diffs) {
  const out = items.slice();
  for (const diff of diffs) {
    if (diff === null || typeof diff !== "object") throw bad(`a diff is not an object: ${JSON.stringify(diff)}`);
    const keys = Object.keys(diff);
    if (keys.length !== 1) throw bad(`a diff has ${keys.length} keys, not 1: ${JSON.stringify(diff)}`);
    const kind = keys[0];
    const body = diff[kind];
    if (body === null || typeof body !== "object") throw bad(`${kind}: the body is not an object`);
    switch (kind) {
      case "Append":
        for (const value of checkItems(kind, body.values)) out.push(value);
        break;
      case "Clear":
        out.length = 0;
        break;
      case "PushFront":
        out.unshift(checkItem(kind, body.value));
        break;
      case "PushBack":
        out.push(checkItem(kind, body.value));
        break;
      case "PopFront":
        if (out.length === 0) throw bad("PopFront on an empty list");
        out.shift();
        break;
      case "PopBack":
        if (out.length === 0) throw bad("PopBack on an empty list");
        out.pop();
        break;
      case "Insert":
        out.splice(checkIndex(kind, body.index, out.length), 0, checkItem(kind, body.value));
        break;
      case "Set":
        out[checkIndex(kind, body.index, out.length - 1)] = checkItem(kind, body.value);
        break;
      case "Remove":
        out.splice(checkIndex(kind, body.index, out.length - 1), 1);
        break;
      case "Truncate": {
        const length = body.length;
        if (typeof length !== "number" || !Number.isInteger(length) || length < 0 || length > out.length) {
          throw bad(`Truncate: length ${String(length)} is past the end of a list of ${out.length} items`);
        }
        out.length = length;
        break;
      }
      case "Reset":
        out.length = 0;
        for (const value of checkItems(kind, body.values)) out.push(value);
        break;
      default:
        throw bad(`unknown diff kind \`${kind}\``);
    }
  }
  return out;
}

// src/digest.ts
var PRIME_LOW = 435;
var TWO_32 = 4294967296;
var encoder = new TextEncoder();
var Fnv64 = class {
  constructor() {
    // The offset basis 0xcbf29ce484222325.
    this.high = 3421674724;
    this.low = 2216829733;
  }
  byte(value) {
    const low = (this.low ^ value) >>> 0;
    const lowProduct = low * PRIME_LOW;
    const carry = Math.floor(lowProduct / TWO_32);
    this.low = lowProduct >>> 0;
    this.high = Math.imul(this.high, PRIME_LOW) + carry + (low << 8 >>> 0) >>> 0;
  }
  u32(value) {
    for (let shift = 0; shift < 32; shift += 8) this.byte(value >>> shift & 255);
  }
  hex() {
    return this.high.toString(16).padStart(8, "0") + this.low.toString(16).padStart(8, "0");
  }
};
function halves(version) {
  if (typeof version === "bigint") {
    return [Number(version & 0xffffffffn), Number(version >> 32n & 0xffffffffn)];
  }
  return [version % TWO_32 >>> 0, Math.floor(version / TWO_32) >>> 0];
}
function windowDigest(rows) {
  const hash = new Fnv64();
  rows.forEach((row, position) => {
    const id = encoder.encode(row.id);
    hash.u32(position);
    hash.u32(id.length);
    for (const byte of id) hash.byte(byte);
    const [low, high] = halves(row.version ?? 0);
    hash.u32(low);
    hash.u32(high);
  });
  return hash.hex();
}

// src/protocol.ts
function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}
function isSeq(value) {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}
var ProtocolState = class {
  /** Seeds the state: for each subscription id, its list and the last `seq` applied (0: none yet). */
  constructor(seed) {
    /** The session of the connection, from `welcome` (then `resumed`). */
    this.session = null;
    this.subs = /* @__PURE__ */ new Map();
    if (seed) {
      for (const [sub, state] of Object.entries(seed)) this.seed(sub, state.items, state.seq);
    }
  }
  /** Adds (or replaces) a subscription with a list and its last `seq`; `subscribing` when `seq` is 0. */
  seed(sub, items, seq) {
    this.subs.set(sub, { items: items.slice(), seq, phase: seq === 0 ? "subscribing" : "live", total: null, writeSeq: null });
  }
  /** The client sends `subscribe`: a new subscription with an empty list. */
  subscribe(sub) {
    const record = this.subs.get(sub);
    if (record?.phase === "closing") {
      record.items = [];
      record.phase = "restarting";
      return;
    }
    this.seed(sub, [], 0);
  }
  /**
   * The client sends `unsubscribe` then `subscribe` again for `sub` (after a gap):
   * its list stays as it is until the new subscription's first frame (a Reset) replaces it.
   */
  restart(sub) {
    const record = this.subs.get(sub);
    if (record) record.phase = "restarting";
  }
  /** The client sends `unsubscribe`: frames are ignored until `unsubscribed` removes it. */
  unsubscribe(sub) {
    const record = this.subs.get(sub);
    if (record) record.phase = "closing";
  }
  /** Forgets a subscription at once (the client closed it while disconnected). */
  forget(sub) {
    this.subs.delete(sub);
  }
  has(sub) {
    return this.subs.has(sub);
  }
  get(sub) {
    const record = this.subs.get(sub);
    return record && {
      items: record.items,
      seq: record.seq,
      phase: record.phase,
      total: record.total,
      write_seq: record.writeSeq
    };
  }
  /** The ids of every subscription held (in any phase). */
  ids() {
    return [...this.subs.keys()];
  }
  /** The lists of every subscription that is not closing, by id. */
  lists() {
    const out = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.items;
    return out;
  }
  /** The last `seq` applied, for every subscription that is not closing. */
  seqs() {
    const out = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.seq;
    return out;
  }
  /** The last `total` known (null: none yet), for every subscription that is not closing. */
  totals() {
    const out = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.total;
    return out;
  }
  /**
   * The connection dropped; the client is about to send `resume`. Closing subscriptions
   * are forgotten (the resume does not list them, so the server closes them), restarting
   * ones start over from `seq` 0. Returns the `last_seq` of each subscription to list.
   */
  prepareResume() {
    const out = [];
    for (const [sub, record] of [...this.subs]) {
      if (record.phase === "closing") {
        this.subs.delete(sub);
        continue;
      }
      if (record.phase === "restarting") {
        record.seq = 0;
        record.phase = "subscribing";
      }
      out.push({ sub, last_seq: record.seq });
    }
    return out;
  }
  /**
   * The connection dropped before any `welcome` of a new session could be used for a
   * resume (no session yet): every subscription will be sent as a fresh `subscribe`.
   * Closing ones are forgotten; the others restart from `seq` 0 and keep their lists
   * until their first Reset.
   */
  prepareResubscribe() {
    const out = [];
    for (const [sub, record] of [...this.subs]) {
      if (record.phase === "closing") {
        this.subs.delete(sub);
        continue;
      }
      record.seq = 0;
      record.phase = "subscribing";
      out.push(sub);
    }
    return out;
  }
  /** Handles one server frame (after `JSON.parse`) and returns what it means. */
  handleFrame(frame) {
    if (!isObject(frame) || typeof frame.type !== "string") {
      return [this.unreadable(frame, `a frame without a type: ${preview(frame)}`)];
    }
    switch (frame.type) {
      case "authed":
        return this.onAuthed(frame);
      case "auth_expired":
        return [{ kind: "auth_expired", grace_secs: isSeq(frame.grace_secs) ? frame.grace_secs : 0 }];
      case "welcome":
        return this.onWelcome(frame);
      case "diffs":
        return this.onDiffs(frame);
      case "error":
        return this.onError(frame);
      case "unsubscribed":
        return this.onUnsubscribed(frame);
      case "ended":
        return this.onEnded(frame);
      case "resumed":
        return this.onResumed(frame);
      default:
        return [];
    }
  }
  /**
   * The event for a frame that cannot be read (`frame` is what `JSON.parse` gave, or
   * undefined when it gave nothing): which lists it may have concerned.
   */
  unreadable(frame, message) {
    const sub = isObject(frame) && typeof frame.sub === "string" ? frame.sub : void 0;
    if (sub !== void 0 && this.subs.has(sub)) return { kind: "protocol", message, resubscribe: "sub", sub };
    return { kind: "protocol", message, resubscribe: "all" };
  }
  onWelcome(frame) {
    if (typeof frame.session !== "string") {
      return [{ kind: "protocol", message: "a welcome without a session", resubscribe: "none" }];
    }
    const auth = readAuth(frame.auth);
    this.session = frame.session;
    const protocol = typeof frame.protocol === "number" ? frame.protocol : 0;
    const limits = isObject(frame.limits) ? frame.limits : {};
    return [{ kind: "welcome", session: frame.session, protocol, limits, auth }];
  }
  onAuthed(frame) {
    const identity = readIdentity(frame);
    if (identity === null) {
      return [{ kind: "protocol", message: `an authed frame without sub, role or expires_at: ${preview(frame)}`, resubscribe: "none" }];
    }
    return [{ kind: "authed", ...identity }];
  }
  onDiffs(frame) {
    const { sub, seq, diffs } = frame;
    if (typeof sub !== "string" || !isSeq(seq) || !Array.isArray(diffs)) {
      return [this.unreadable(frame, `a diffs frame without a sub, a seq or diffs: ${preview(frame)}`)];
    }
    const record = this.subs.get(sub);
    if (!record || record.phase === "closing" || record.phase === "restarting") return [];
    if (seq !== record.seq + 1) {
      return [{ kind: "gap", sub, expected_seq: record.seq + 1, got_seq: seq }];
    }
    let items;
    try {
      items = applyDiffs(record.items, diffs);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      return [{ kind: "invalid_diffs", sub, seq, message }];
    }
    if (frame.digest !== void 0) {
      const got = windowDigest(items);
      if (frame.digest !== got) {
        return [{ kind: "digest_mismatch", sub, seq, expected: String(frame.digest), got }];
      }
    }
    record.items = items;
    record.seq = seq;
    record.phase = "live";
    if (isSeq(frame.total)) record.total = frame.total;
    record.writeSeq = isSeq(frame.write_seq) ? frame.write_seq : null;
    const reset = diffs.some((diff) => isObject(diff) && "Reset" in diff);
    return [
      { kind: "change", sub, seq, diffs, items, reset, total: record.total, write_seq: record.writeSeq }
    ];
  }
  onError(frame) {
    const code = typeof frame.code === "string" ? frame.code : "internal";
    const message = typeof frame.message === "string" ? frame.message : code;
    if (typeof frame.sub !== "string") return [{ kind: "error", code, message }];
    const sub = frame.sub;
    const record = this.subs.get(sub);
    const event = { kind: "error", code, message, sub };
    if (!record) return [event];
    switch (record.phase) {
      case "subscribing":
        this.subs.delete(sub);
        return [{ ...event, refused: "subscribe" }];
      case "live":
        return [{ ...event, refused: "request" }];
      case "restarting":
        if (code === "unknown_subscription") {
          record.seq = 0;
          record.phase = "subscribing";
        }
        return [event];
      case "closing":
        if (code === "unknown_subscription") this.subs.delete(sub);
        return [event];
    }
  }
  onUnsubscribed(frame) {
    if (typeof frame.sub !== "string") return [this.unreadable(frame, "an unsubscribed frame without a sub")];
    const sub = frame.sub;
    const record = this.subs.get(sub);
    if (record?.phase === "restarting") {
      record.seq = 0;
      record.phase = "subscribing";
      return [];
    }
    this.subs.delete(sub);
    return [{ kind: "unsubscribed", sub }];
  }
  onEnded(frame) {
    if (typeof frame.sub !== "string") return [this.unreadable(frame, "an ended frame without a sub")];
    const sub = frame.sub;
    const reason = typeof frame.reason === "string" ? frame.reason : "unknown";
    const message = typeof frame.message === "string" ? frame.message : reason;
    const record = this.subs.get(sub);
    if (!record) return [];
    if (record.phase === "restarting") {
      return [];
    }
    this.subs.delete(sub);
    return [{ kind: "ended", sub, reason, message }];
  }
  onResumed(frame) {
    if (typeof frame.session === "string") this.session = frame.session;
    const replayed = [];
    const reset = [];
    const failed = [];
    const entries = Array.isArray(frame.subs) ? frame.subs : [];
    for (const entry of entries) {
      if (!isObject(entry) || typeof entry.sub !== "string") continue;
      if (isObject(entry.error)) {
        const code = typeof entry.error.code === "string" ? entry.error.code : "internal";
        const message = typeof entry.error.message === "string" ? entry.error.message : code;
        failed.push({ sub: entry.sub, code, message });
        this.subs.delete(entry.sub);
      } else if (entry.reset === true) {
        reset.push(entry.sub);
      } else {
        replayed.push(entry.sub);
      }
    }
    return [{ kind: "resumed", session: this.session ?? "", replayed, reset, failed }];
  }
};
function preview(value) {
  let text;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = "(unprintable)";
  }
  return text.length > 200 ? `${text.slice(0, 200)}\u2026` : text;
}
function readIdentity(value) {
  const { sub, role, expires_at } = value;
  if (typeof sub !== "string" || typeof role !== "string" || typeof expires_at !== "number" || !Number.isFinite(expires_at)) {
    return null;
  }
  return { sub, role, expires_at };
}
function readAuth(value) {
  if (value === void 0 || value === null || value === "none") return "none";
  if (isObject(value)) return readIdentity(value) ?? "required";
  return "required";
}
function lossError(event) {
  if (event.kind === "digest_mismatch") {
    return new OrdoError(
      "digest_mismatch",
      `subscription \`${event.sub}\`: after seq ${event.seq} the list's digest is ${event.got}, the server's ${event.expected}; re-subscribing`,
      event.sub
    );
  }
  if (event.kind === "gap") {
    return new OrdoError(
      "gap",
      `subscription \`${event.sub}\` expected seq ${event.expected_seq} but got ${event.got_seq}; re-subscribing`,
      event.sub
    );
  }
  return new OrdoError(
    "invalid_diffs",
    `subscription \`${event.sub}\`: the diffs of seq ${event.seq} do not apply (${event.message}); re-subscribing`,
    event.sub
  );
}

// src/types.ts
var PROTOCOL_VERSION = 1;

// src/client.ts
var DEFAULT_INITIAL_DELAY_MS = 250;
var DEFAULT_MAX_DELAY_MS = 1e4;
var SEND_BURST = 100;
var DEFAULT_MESSAGES_PER_SECOND = 100;
var HANDSHAKE_TIMEOUT_MS = 2e4;
var MAX_WINDOW_LIMIT = 1e3;
var CLOSE_UNAUTHORIZED = 4401;
var MAX_WINDOW_OFFSET = 4294967295;
function copyDefinition(definition) {
  const copy = { collection: definition.collection, limit: definition.limit };
  if (definition.tail === true) copy.tail = true;
  else copy.offset = definition.offset ?? 0;
  if (definition.filter !== void 0) copy.filter = definition.filter;
  if (definition.sort !== void 0) copy.sort = definition.sort;
  if (definition.fields !== void 0) copy.fields = definition.fields.slice();
  if (definition.payload !== void 0) copy.payload = definition.payload;
  return copy;
}
function checkRange(offset, limit) {
  if (!Number.isInteger(offset) || offset < 0 || offset > MAX_WINDOW_OFFSET) {
    throw new RangeError(`offset must be an integer in 0..=${MAX_WINDOW_OFFSET}, not ${offset}`);
  }
  if (!Number.isInteger(limit) || limit < 0 || limit > MAX_WINDOW_LIMIT) {
    throw new RangeError(`limit must be an integer in 0..=${MAX_WINDOW_LIMIT}, not ${limit}`);
  }
}
function viewKey(filter, sort) {
  return JSON.stringify([filter ?? null, sort ?? []]);
}
var LiveList = class {
  /** Made by `OrdoClient.subscribe`; not meant to be called directly. */
  constructor(client, id, definition) {
    this.client = client;
    this._items = [];
    this._seq = 0;
    this._status = "subscribing";
    this._error = null;
    this._total = null;
    this._writeSeq = null;
    /** The greatest `write_seq` applied so far: the `min_seq` of every later subscribe or resume of this list. */
    this._floorSeq = null;
    this._ended = null;
    this.emitter = new Emitter();
    this.settled = false;
    /** @internal The definition before the last window change sent, to restore if it is refused. */
    this.beforeChange = null;
    /** @internal A window change waits for the first frame (or the next connection). */
    this.changePending = false;
    /** @internal Frames whose window digest was not the list's (see `digestMismatches`). */
    this._digestMismatches = 0;
    this.id = id;
    this.definition = copyDefinition(definition);
    this.sentDefinition = copyDefinition(definition);
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => {
    });
  }
  /** The list's contents: a new array after every change, so it can be compared by identity. */
  get items() {
    return this._items;
  }
  /** The `seq` of the last frame applied (0: none yet). */
  get seq() {
    return this._seq;
  }
  /** `subscribing` until the first frame, `live` after it, `closed` once closed or refused. */
  get status() {
    return this._status;
  }
  /** The last error reported for this list, or null. */
  get error() {
    return this._error;
  }
  /**
   * How many frames had a window digest other than the list's once applied: each was
   * dropped, reported as an `error` event with code `digest_mismatch`, and the list
   * subscribed again. 0 on a healthy connection.
   */
  get digestMismatches() {
    return this._digestMismatches;
  }
  /** The number of items in the whole view (not just the window), as of the last frame that said; null before. */
  get total() {
    return this._total;
  }
  /** The last write (batch `seq`) the list reflects (a write's answer has its `seq`); null before the first frame. */
  get writeSeq() {
    return this._writeSeq;
  }
  /**
   * The greatest `write_seq` this list has applied (null: none yet). Every later
   * subscribe or resume of it (after a reconnection, on this node or another) asks for
   * `min_seq` = this, so the list never goes back in time.
   */
  get floorSeq() {
    return this._floorSeq;
  }
  /** Why the server ended the subscription (`status` is then `ended`), or null. */
  get ended() {
    return this._ended;
  }
  /** The window as the caller last set it. */
  get view() {
    return copyDefinition(this.definition);
  }
  on(event, listener) {
    return this.emitter.on(event, listener);
  }
  /** Moves or grows the window ("load more"). The change reaches the list as diffs. */
  setRange(offset, limit) {
    if (this._status === "closed" || this._status === "ended") return;
    checkRange(offset, limit);
    this.definition = { ...this.definition, offset, limit, tail: false };
    this.client._windowChanged(this);
  }
  /** Changes the filter and the sort, keeping the range. Keys left out are kept as they are. */
  setView(view) {
    if (this._status === "closed" || this._status === "ended") return;
    const next = { ...this.definition };
    if (view.filter !== void 0) next.filter = view.filter;
    if (view.sort !== void 0) next.sort = view.sort;
    this.definition = next;
    this.client._windowChanged(this);
  }
  /** Unsubscribes. The list keeps its last items; `ready` rejects with `closed` if it was pending. */
  close() {
    if (this._status === "closed" || this._status === "ended") return;
    this.client._closeList(this);
  }
  /** @internal */
  _applyChange(seq, change) {
    this._items = change.items;
    this._seq = seq;
    this._total = change.total;
    this._writeSeq = change.write_seq;
    if (change.write_seq !== null && (this._floorSeq === null || change.write_seq > this._floorSeq)) {
      this._floorSeq = change.write_seq;
    }
    if (this._status === "subscribing") this._status = "live";
    if (!this.settled) {
      this.settled = true;
      this.resolveReady();
    }
    this.emitter.emit("change", change);
  }
  /** @internal Reports an error; `fatal` closes the list (a refused subscribe). */
  _fail(error, fatal) {
    this._error = error;
    if (fatal) this._markClosed(error);
    this.emitter.emit("error", error);
  }
  /** @internal */
  _markClosed(error) {
    this._status = "closed";
    if (!this.settled) {
      this.settled = true;
      this.rejectReady(error);
    }
  }
  /** @internal The server ended the subscription: the list keeps its last items. */
  _markEnded(ended) {
    this._ended = ended;
    this._status = "ended";
    if (!this.settled) {
      this.settled = true;
      this.rejectReady(new OrdoError(ended.reason, ended.message, ended.sub));
    }
    this.emitter.emit("ended", ended);
  }
  /** @internal The subscription is being recovered (after a gap): frames resume with a Reset. */
  _restarting() {
    if (this._status === "live") this._status = "subscribing";
  }
  /** @internal */
  _definitionKey(definition) {
    return {
      range: definition.tail === true ? `tail:${definition.limit}` : `${definition.offset ?? 0}:${definition.limit}`,
      view: viewKey(definition.filter, definition.sort)
    };
  }
};
var OrdoClient = class {
  constructor(options) {
    /** The node whose connection last completed its handshake (null: none yet). */
    this.servedBy = null;
    this.core = new ProtocolState();
    this.lists = /* @__PURE__ */ new Map();
    this.emitter = new Emitter();
    this.socket = null;
    /** The socket has had its `welcome`: `auth` may go out. */
    this.welcomed = false;
    /** The socket has had its `welcome` (and `authed`, when the server wants a token): every message may go out. */
    this.handshaken = false;
    /** The `welcome`'s session, kept while `auth` is answered. */
    this.welcomeSession = null;
    /** An `auth` is on its way (or its token is being fetched). */
    this.authPending = false;
    /** Bumped at every token request: an answer for an older one is dropped. */
    this.authGeneration = 0;
    this.refreshTimer = null;
    /** The last token sent: its `exp` sets the next refresh. */
    this.lastToken = null;
    this._identity = null;
    this._state = "connecting";
    /** The session to name in the next `resume`. */
    this.resumeSession = null;
    this.reconnectTimer = null;
    this.handshakeTimer = null;
    this.nextId = 0;
    this.outbox = [];
    this.tokens = SEND_BURST;
    this.tokensAt = 0;
    this.messagesPerSecond = DEFAULT_MESSAGES_PER_SECOND;
    this.drainTimer = null;
    this.Socket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.Socket !== "function") {
      throw new TypeError(
        "no WebSocket: pass one as `new OrdoClient({ url, WebSocket })` (in Node < 22, the `ws` package's)"
      );
    }
    this.initialDelayMs = Math.max(1, options.reconnect?.initialDelayMs ?? DEFAULT_INITIAL_DELAY_MS);
    this.maxDelayMs = Math.max(this.initialDelayMs, options.reconnect?.maxDelayMs ?? DEFAULT_MAX_DELAY_MS);
    this.reconnectEnabled = options.reconnect?.enabled ?? true;
    this.nodes = new NodeRotation(options.url, this.initialDelayMs, this.maxDelayMs);
    this.token = options.token;
    this.tokenProvider = options.tokenProvider;
    if (this.token !== void 0 && typeof this.token !== "string") throw new TypeError("`token` must be a string");
    if (this.tokenProvider !== void 0 && typeof this.tokenProvider !== "function") {
      throw new TypeError("`tokenProvider` must be a function returning a token");
    }
    this.connect();
  }
  /** The session of the current (or last) connection, from `welcome` then `resumed`. */
  get session() {
    return this.core.session;
  }
  get state() {
    return this._state;
  }
  /** The URL of the node in use (or being connected to). */
  get currentUrl() {
    return this.nodes.current;
  }
  /** Every node URL the client was given, in rotation order. */
  get urls() {
    return this.nodes.all;
  }
  /** Who the server says the connection is (from `authed`), or null (no auth, or not yet). */
  get identity() {
    return this._identity;
  }
  on(event, listener) {
    return this.emitter.on(event, listener);
  }
  /** Subscribes to a window. The list fills at its first frame (`ready`). */
  subscribe(view) {
    if (this._state === "closed") throw new OrdoError("closed", "the client is closed");
    const { id: chosen, ...definition } = view;
    if (typeof definition.collection !== "string" || definition.collection === "") {
      throw new TypeError("subscribe needs a collection");
    }
    checkRange(definition.offset ?? 0, definition.limit);
    let id = chosen;
    if (id === void 0) {
      do
        id = `s${++this.nextId}`;
      while (this.lists.has(id));
    } else if (this.lists.has(id)) {
      throw new OrdoError("subscription_exists", `subscription \`${id}\` exists on this client`, id);
    }
    const list = new LiveList(this, id, definition);
    this.lists.set(id, list);
    this.core.subscribe(id);
    if (this.handshaken) this.sendSubscribe(list);
    return list;
  }
  /**
   * Gets a token now (from `tokenProvider`) and sends it on the live connection, as the
   * refresh before expiry does. Nothing happens without a provider or a connection.
   * The token must be for the same identity (else the server answers `forbidden`).
   */
  refreshToken() {
    if (this.tokenProvider && this.handshaken && this._identity !== null) void this.authenticate();
  }
  /** Closes the connection for good: every list stops (pending `ready`s reject with `closed`). */
  close() {
    if (this._state === "closed") return;
    this.clearTimers();
    const socket = this.socket;
    this.detachSocket();
    if (socket) {
      try {
        socket.close(1e3, "client closed");
      } catch {
      }
    }
    const error = new OrdoError("closed", "the client was closed");
    for (const list of this.lists.values()) list._markClosed(error);
    this.lists.clear();
    this.setState("closed");
  }
  // ---- Connection ----
  connect() {
    this.reconnectTimer = null;
    const url = this.nodes.current;
    let socket;
    try {
      socket = new this.Socket(url);
    } catch (error) {
      this.emitter.emit("error", new OrdoError("connect", `cannot connect to ${url}: ${String(error)}`));
      this.onSocketGone(void 0);
      return;
    }
    this.socket = socket;
    this.handshaken = false;
    this.handshakeTimer = setTimeout(() => {
      this.handshakeTimer = null;
      if (this.socket !== socket || this.handshaken) return;
      try {
        socket.close();
      } catch {
      }
      this.emitter.emit("error", new OrdoError("protocol", `no welcome (or no authed) from ${url} in ${HANDSHAKE_TIMEOUT_MS} ms`));
      this.onSocketGone(void 0);
    }, HANDSHAKE_TIMEOUT_MS);
    socket.onmessage = (event) => {
      if (this.socket === socket) this.onMessage(event.data);
    };
    socket.onclose = (event) => {
      if (this.socket === socket) this.onSocketGone(event?.code);
    };
    socket.onerror = () => {
    };
  }
  detachSocket() {
    if (this.handshakeTimer !== null) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    const socket = this.socket;
    if (socket) {
      socket.onmessage = null;
      socket.onclose = null;
      socket.onopen = null;
      socket.onerror = () => {
      };
    }
    this.socket = null;
    this.welcomed = false;
    this.handshaken = false;
    this.welcomeSession = null;
    this.authPending = false;
    this.authGeneration += 1;
    if (this.refreshTimer !== null) clearTimeout(this.refreshTimer);
    this.refreshTimer = null;
    this.outbox = [];
  }
  clearTimers() {
    if (this.reconnectTimer !== null) clearTimeout(this.reconnectTimer);
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.reconnectTimer = null;
    this.drainTimer = null;
  }
  onSocketGone(code) {
    this.detachSocket();
    if (code === CLOSE_UNAUTHORIZED && this._state !== "closed") {
      this.emitter.emit(
        "error",
        new OrdoError("unauthorized", "the server closed the connection for want of a valid token (close code 4401)")
      );
    }
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.drainTimer = null;
    if (this._state === "closed") return;
    if (!this.reconnectEnabled) {
      const error = new OrdoError("closed", `the connection closed (code ${code ?? "none"})`);
      for (const list of this.lists.values()) list._fail(error, true);
      this.lists.clear();
      this.setState("closed");
      return;
    }
    this.scheduleReconnect();
  }
  /**
   * Connects again, to the next node (round robin), after a jitter within a round of the
   * nodes or the backoff's delay (exponential, capped, with jitter) once a round failed.
   */
  scheduleReconnect() {
    this.setState("reconnecting");
    const delay = this.nodes.fail();
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }
  setState(state) {
    if (this._state === state) return;
    this._state = state;
    this.emitter.emit("state", state);
  }
  // ---- Sending ----
  send(message) {
    if (!this.socket || !this.handshaken) return;
    this.outbox.push(JSON.stringify(message));
    this.drain();
  }
  /** `auth` goes out as soon as the `welcome` came (before anything else at connection). */
  sendAuth(token) {
    if (!this.socket || !this.welcomed) return;
    this.outbox.push(JSON.stringify({ op: "auth", token }));
    this.drain();
  }
  /** Sends what the rate allows; the rest waits (the server refuses messages past its rate). */
  drain() {
    const socket = this.socket;
    if (!socket) return;
    const now = Date.now();
    this.tokens = Math.min(SEND_BURST, this.tokens + (now - this.tokensAt) / 1e3 * this.messagesPerSecond);
    this.tokensAt = now;
    while (this.outbox.length > 0 && this.tokens >= 1) {
      const text = this.outbox.shift();
      this.tokens -= 1;
      try {
        socket.send(text);
      } catch {
        return;
      }
    }
    if (this.outbox.length > 0 && this.drainTimer === null) {
      const wait = Math.ceil((1 - this.tokens) / this.messagesPerSecond * 1e3);
      this.drainTimer = setTimeout(() => {
        this.drainTimer = null;
        this.drain();
      }, Math.max(1, wait));
    }
  }
  sendSubscribe(list) {
    list.sentDefinition = copyDefinition(list.definition);
    list.beforeChange = null;
    list.changePending = false;
    const message = { op: "subscribe", sub: list.id, ...list.sentDefinition };
    if (list.floorSeq !== null) message.min_seq = list.floorSeq;
    this.send(message);
  }
  /** @internal A list's window changed: tell the server now if it can take it. */
  _windowChanged(list) {
    if (!this.handshaken || this.core.get(list.id)?.phase !== "live") {
      list.changePending = true;
      return;
    }
    this.sendWindowChange(list);
  }
  sendWindowChange(list) {
    list.changePending = false;
    const wanted = list._definitionKey(list.definition);
    const sent = list._definitionKey(list.sentDefinition);
    if (wanted.view === sent.view && wanted.range === sent.range) return;
    list.beforeChange = copyDefinition(list.sentDefinition);
    if (wanted.view !== sent.view) {
      this.send({
        op: "set_view",
        sub: list.id,
        filter: list.definition.filter ?? null,
        sort: list.definition.sort ?? []
      });
    }
    if (wanted.range !== sent.range) {
      const { tail, offset, limit } = list.definition;
      this.send(
        tail === true ? { op: "set_range", sub: list.id, tail: true, limit } : { op: "set_range", sub: list.id, offset: offset ?? 0, limit }
      );
    }
    list.sentDefinition = copyDefinition(list.definition);
  }
  /** @internal */
  _closeList(list) {
    this.lists.delete(list.id);
    const phase = this.core.get(list.id)?.phase;
    if (this.handshaken && phase !== void 0) {
      this.core.unsubscribe(list.id);
      this.send({ op: "unsubscribe", sub: list.id });
    } else {
      this.core.forget(list.id);
    }
    list._markClosed(new OrdoError("closed", `subscription \`${list.id}\` was closed`, list.id));
  }
  // ---- Receiving ----
  onMessage(data) {
    if (typeof data !== "string") {
      this.onUnreadable(void 0, "the server sent a binary frame");
      return;
    }
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      this.onUnreadable(void 0, `the server sent a frame that is not JSON: ${data.length > 200 ? `${data.slice(0, 200)}\u2026` : data}`);
      return;
    }
    let events;
    try {
      events = this.core.handleFrame(frame);
    } catch (error) {
      this.onUnreadable(frame, `a frame this client could not handle: ${describe(error)}`);
      return;
    }
    for (const event of events) {
      try {
        this.onEvent(event);
      } catch (error) {
        this.onUnreadable(frame, `a frame this client could not handle: ${describe(error)}`);
        return;
      }
    }
  }
  /** A frame that could not be read: report it, and re-subscribe what it may have concerned. */
  onUnreadable(frame, message) {
    this.onEvent(this.core.unreadable(frame, message));
  }
  onEvent(event) {
    switch (event.kind) {
      case "welcome":
        this.onWelcome(event);
        return;
      case "authed":
        this.onAuthed(event);
        return;
      case "auth_expired":
        if (this.tokenProvider) {
          void this.authenticate();
        } else {
          this.emitter.emit(
            "error",
            new OrdoError("auth_expired", "the token expired and cannot be refreshed without a `tokenProvider`")
          );
        }
        return;
      case "resumed":
        this.resumeSession = event.session;
        for (const failure of event.failed) {
          const list = this.lists.get(failure.sub);
          if (!list) continue;
          if (this.behindList(list, failure.code, failure.message)) continue;
          this.lists.delete(failure.sub);
          list._fail(new OrdoError(failure.code, failure.message, failure.sub), true);
        }
        return;
      case "change": {
        const list = this.lists.get(event.sub);
        if (!list) return;
        list._applyChange(event.seq, {
          diffs: event.diffs,
          items: event.items,
          reset: event.reset,
          total: event.total,
          write_seq: event.write_seq
        });
        if (list.changePending && this.lists.get(event.sub) === list && this.handshaken) this.sendWindowChange(list);
        return;
      }
      case "gap":
      case "invalid_diffs":
      case "digest_mismatch": {
        const list = this.lists.get(event.sub);
        if (!list) return;
        if (event.kind === "digest_mismatch") list._digestMismatches += 1;
        list._fail(lossError(event), false);
        if (this.lists.get(event.sub) !== list || !this.handshaken) return;
        this.restartList(list);
        return;
      }
      case "error": {
        const error = new OrdoError(event.code, event.message, event.sub);
        const list = event.sub === void 0 ? void 0 : this.lists.get(event.sub);
        if (!list) {
          this.emitter.emit("error", error);
          if (event.sub === void 0 && (event.code === "unauthorized" || event.code === "forbidden")) {
            this.onAuthRefused();
          }
          return;
        }
        if (event.refused === "subscribe") {
          if (this.behindList(list, event.code, event.message)) return;
          this.lists.delete(list.id);
          list._fail(error, true);
          return;
        }
        if (event.refused === "request" && list.beforeChange) {
          list.definition = list.beforeChange;
          list.sentDefinition = copyDefinition(list.beforeChange);
          list.beforeChange = null;
        }
        list._fail(error, false);
        return;
      }
      case "unsubscribed":
        return;
      case "ended": {
        const ended = { sub: event.sub, reason: event.reason, message: event.message };
        const list = this.lists.get(event.sub);
        if (list) {
          this.lists.delete(event.sub);
          list._markEnded(ended);
        }
        this.emitter.emit("ended", ended);
        return;
      }
      case "protocol":
        this.onProtocolError(event);
        return;
    }
  }
  /**
   * An unreadable frame: it may have carried a list's data, so that list (or every
   * list, when the frame named none that can be trusted) subscribes again and starts
   * over from a Reset. The connection and the other lists go on.
   */
  onProtocolError(event) {
    const error = new OrdoError("protocol", event.message, event.sub);
    const named = event.resubscribe === "sub" && event.sub !== void 0 ? this.lists.get(event.sub) : void 0;
    if (named) named._fail(error, false);
    else this.emitter.emit("error", error);
    if (event.resubscribe === "none") return;
    if (!this.handshaken) {
      if (this.socket) this.restartConnection(true);
      return;
    }
    if (named && this.isSettled(named.id)) {
      this.restartList(named);
      return;
    }
    for (const sub of this.core.ids()) {
      if (!this.isSettled(sub) || !this.lists.has(sub)) {
        this.restartConnection(false);
        return;
      }
    }
    for (const list of this.lists.values()) this.restartList(list);
  }
  /**
   * A refused subscribe or resume entry that another node may take: `lagging` (the node
   * is too far behind its cluster's log to take subscribers), or, for a list that has
   * shown data, `seq_not_reached` (this node has not caught up with what the list showed).
   * The list keeps its items (status `subscribing`), and the client moves to the next
   * node, where it resumes (the same node again with one URL, after the backoff). Returns
   * false for any other refusal, handled as before.
   */
  behindList(list, code, message) {
    const behind = code === "lagging" || code === "seq_not_reached" && list.floorSeq !== null;
    if (!behind || !this.reconnectEnabled) return false;
    list._fail(new OrdoError(code, message, list.id), false);
    list._restarting();
    this.core.subscribe(list.id);
    this.restartConnection(true, "node behind");
    return true;
  }
  /** The subscription is live or being subscribed: no `unsubscribed` is awaited for it. */
  isSettled(sub) {
    const phase = this.core.get(sub)?.phase;
    return phase === "live" || phase === "subscribing";
  }
  /** Recovers a list: a fresh subscription under the same id, whose first frame is a Reset. */
  restartList(list) {
    this.core.restart(list.id);
    list._restarting();
    this.send({ op: "unsubscribe", sub: list.id });
    this.sendSubscribe(list);
  }
  /**
   * Drops the connection and connects again (after the backoff's delay, even when
   * reconnection is disabled: this is no lost connection): with `resume`, or
   * subscribing every list afresh.
   */
  restartConnection(resume, reason = "unreadable frame") {
    const socket = this.socket;
    if (!socket) return;
    if (!resume) this.resumeSession = null;
    this.detachSocket();
    try {
      socket.close(1e3, reason);
    } catch {
    }
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.drainTimer = null;
    this.scheduleReconnect();
  }
  onWelcome(event) {
    if (event.protocol !== PROTOCOL_VERSION) {
      this.emitter.emit(
        "error",
        new OrdoError("protocol", `the server speaks protocol ${event.protocol}; this client speaks ${PROTOCOL_VERSION}`)
      );
    }
    const rate = event.limits.ws_messages_per_second;
    if (typeof rate === "number" && rate > 0) this.messagesPerSecond = rate * 0.9;
    this.tokens = SEND_BURST;
    this.tokensAt = Date.now();
    this.welcomed = true;
    this.welcomeSession = event.session;
    if (typeof event.auth === "object") this.setIdentity(event.auth);
    const hasToken = this.tokenProvider !== void 0 || this.token !== void 0;
    if (event.auth !== "none" && hasToken) {
      void this.authenticate();
      return;
    }
    if (event.auth === "required") {
      this.emitter.emit(
        "error",
        new OrdoError("unauthorized", "the server requires a token: pass `token` or `tokenProvider` to OrdoClient")
      );
    }
    this.onReady(event.session);
  }
  /** Gets a token (the provider's, or the fixed one) and sends `auth`. */
  async authenticate() {
    const socket = this.socket;
    if (!socket || !this.welcomed) return;
    const generation = ++this.authGeneration;
    this.authPending = true;
    if (this.refreshTimer !== null) clearTimeout(this.refreshTimer);
    this.refreshTimer = null;
    let token;
    try {
      token = this.tokenProvider ? await this.tokenProvider() : this.token;
      if (typeof token !== "string" || token === "") throw new TypeError(`not a token: ${String(token)}`);
    } catch (error) {
      if (this.socket !== socket || generation !== this.authGeneration) return;
      this.emitter.emit("error", new OrdoError("unauthorized", `the token provider failed: ${describe(error)}`));
      this.onAuthRefused();
      return;
    }
    if (this.socket !== socket || generation !== this.authGeneration) return;
    this.lastToken = token;
    this.sendAuth(token);
  }
  onAuthed(event) {
    if (!this.welcomed) return;
    this.authPending = false;
    this.setIdentity({ sub: event.sub, role: event.role, expires_at: event.expires_at });
    this.scheduleRefresh(event.expires_at);
    if (!this.handshaken && this.welcomeSession !== null) this.onReady(this.welcomeSession);
  }
  /**
   * A token was refused (`unauthorized`, `forbidden`) or could not be had. At connection:
   * connect again with backoff (asking the provider again). At a refresh: the connection
   * keeps its previous token; the server's `auth_expired` brings another try.
   */
  onAuthRefused() {
    if (!this.authPending) return;
    this.authPending = false;
    if (this.handshaken) return;
    const socket = this.socket;
    if (!socket) return;
    try {
      socket.close(1e3, "token refused");
    } catch {
    }
    this.onSocketGone(void 0);
  }
  setIdentity(identity) {
    this._identity = identity;
    this.emitter.emit("auth", identity);
  }
  /** The next refresh, from the token's own `exp` (or the server's `expires_at`). */
  scheduleRefresh(expiresAt) {
    if (this.refreshTimer !== null) clearTimeout(this.refreshTimer);
    this.refreshTimer = null;
    if (!this.tokenProvider) return;
    const times = this.lastToken === null ? { exp: null, iat: null } : jwtTimes(this.lastToken);
    const delay = refreshDelayMs(times.exp ?? expiresAt, times.iat, Date.now());
    if (delay === null) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = null;
      if (this.handshaken) void this.authenticate();
    }, delay);
  }
  /** The connection may carry everything: resume, or subscribe every list. */
  onReady(session) {
    this.handshaken = true;
    this.nodes.succeeded();
    const url = this.nodes.current;
    if (this.servedBy !== null && this.servedBy !== url) this.emitter.emit("failover", { from: this.servedBy, to: url });
    this.servedBy = url;
    if (this.handshakeTimer !== null) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    const previous = this.resumeSession;
    if (previous !== null && this.lists.size > 0) {
      const subs = [];
      for (const { sub, last_seq } of this.core.prepareResume()) {
        const list = this.lists.get(sub);
        if (!list) {
          this.core.forget(sub);
          continue;
        }
        list.sentDefinition = copyDefinition(list.definition);
        list.beforeChange = null;
        list.changePending = false;
        const entry = { sub, ...list.sentDefinition, last_seq };
        if (list.floorSeq !== null) entry.min_seq = list.floorSeq;
        subs.push(entry);
      }
      this.send({ op: "resume", session: previous, subs });
    } else {
      this.resumeSession = session;
      for (const sub of this.core.prepareResubscribe()) {
        const list = this.lists.get(sub);
        if (list) this.sendSubscribe(list);
        else this.core.forget(sub);
      }
    }
    this.setState("open");
  }
};
function describe(error) {
  return error instanceof Error ? error.message : String(error);
}
export {
  LiveList,
  NodeRotation,
  OrdoClient,
  OrdoError,
  PROTOCOL_VERSION,
  ProtocolState,
  applyDiffs,
  windowDigest
};
