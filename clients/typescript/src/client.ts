import { jwtTimes, refreshDelayMs } from "./auth.js";
import { Emitter } from "./emitter.js";
import { OrdoError } from "./errors.js";
import { NodeRotation } from "./nodes.js";
import { type EndedReason, lossError, ProtocolState, type ProtocolEvent } from "./protocol.js";
import {
  PROTOCOL_VERSION,
  type AuthIdentity,
  type ClientMessage,
  type Filter,
  type Item,
  type ResumeEntry,
  type SortKey,
  type SubscribeOptions,
  type VectorDiff,
  type ViewSpec,
  type WindowDefinition,
} from "./types.js";

/** The connection's state. */
export type ConnectionState = "connecting" | "open" | "reconnecting" | "closed";

export interface ReconnectOptions {
  /** Delay before the first reconnection attempt (before jitter); default 250 ms. */
  initialDelayMs?: number;
  /** Cap of the exponential backoff; default 10 000 ms. */
  maxDelayMs?: number;
  /** `false`: a lost connection closes the client; default `true`. */
  enabled?: boolean;
}

export interface OrdoClientOptions {
  /**
   * The WebSocket URL, such as `ws://127.0.0.1:7070/v1/ws`, or the URLs of several nodes
   * of one cluster: the client uses the first, and on a lost connection (or a failed
   * connect) moves to the next, round robin (README "Several nodes").
   */
  url: string | readonly string[];
  /**
   * A WebSocket constructor (the browser's, Node's, or the `ws` package's);
   * defaults to `globalThis.WebSocket`.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  WebSocket?: any;
  reconnect?: ReconnectOptions;
  /**
   * A token (a JWT) for a server with auth: sent in an `auth` message after the
   * `welcome`, at every (re)connection. It cannot be refreshed: prefer `tokenProvider`.
   */
  token?: string;
  /**
   * Returns a token (a JWT) for a server with auth. Called at every (re)connection,
   * before the token expires (at `exp - min(60 s, lifetime / 5)`, read from the
   * token) and when the server says it expired. Wins over `token`.
   */
  tokenProvider?: () => string | Promise<string>;
}

/** The client moved to another node: `from` served it before, `to` serves it now (its handshake is done). */
export interface Failover {
  from: string;
  to: string;
}

/** What a list reports after each frame that changed it. */
export interface ListChange {
  /** The diffs of the frame, as the server sent them. */
  diffs: VectorDiff[];
  /** The list after them (a new array). */
  items: readonly Item[];
  /** The frame held a Reset: the whole list was replaced (first frame, resume, recovery). */
  reset: boolean;
  /** The view's length (all its items, not just the window) after this frame; null before the server sent one. */
  total: number | null;
  /** The last write (batch `seq`) the list reflects; null from a server that sends none. */
  write_seq: number | null;
}

/** Where a list stands. */
/** `ended`: the server ended the subscription (`LiveList.ended` says why); it is not re-subscribed. */
export type ListStatus = "subscribing" | "live" | "closed" | "ended";

/** Why the server ended a list's subscription (an `ended` frame). */
export interface ListEnded {
  sub: string;
  /** `collection_dropped`, `field_removed` or `access_ended` (newer servers may send others). */
  reason: EndedReason;
  message: string;
}

/** The subset of the WebSocket interface this client uses. */
interface SocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code?: number; reason?: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
}

const DEFAULT_INITIAL_DELAY_MS = 250;
const DEFAULT_MAX_DELAY_MS = 10_000;
/** The server allows 100 messages per second with a burst of 200; stay below. */
const SEND_BURST = 100;
const DEFAULT_MESSAGES_PER_SECOND = 100;
/** A connection that brings no `welcome` (and `authed`, with auth) in this time is dropped and tried again. */
const HANDSHAKE_TIMEOUT_MS = 20_000;
const MAX_WINDOW_LIMIT = 1000;
/** The close code of a connection without a valid token (expired and not refreshed, or none sent in time). */
const CLOSE_UNAUTHORIZED = 4401;
const MAX_WINDOW_OFFSET = 0xffff_ffff;

type ClientEvents = { state: ConnectionState; error: OrdoError; auth: AuthIdentity; ended: ListEnded; failover: Failover };
type ListEvents = { change: ListChange; error: OrdoError; ended: ListEnded };

function copyDefinition(definition: WindowDefinition): WindowDefinition {
  const copy: WindowDefinition = { collection: definition.collection, limit: definition.limit };
  // A tail window has no offset of its own: the server keeps it at the end.
  if (definition.tail === true) copy.tail = true;
  else copy.offset = definition.offset ?? 0;
  if (definition.filter !== undefined) copy.filter = definition.filter;
  if (definition.sort !== undefined) copy.sort = definition.sort;
  if (definition.fields !== undefined) copy.fields = definition.fields.slice();
  if (definition.payload !== undefined) copy.payload = definition.payload;
  return copy;
}

function checkRange(offset: number, limit: number): void {
  if (!Number.isInteger(offset) || offset < 0 || offset > MAX_WINDOW_OFFSET) {
    throw new RangeError(`offset must be an integer in 0..=${MAX_WINDOW_OFFSET}, not ${offset}`);
  }
  if (!Number.isInteger(limit) || limit < 0 || limit > MAX_WINDOW_LIMIT) {
    throw new RangeError(`limit must be an integer in 0..=${MAX_WINDOW_LIMIT}, not ${limit}`);
  }
}

function viewKey(filter: Filter | null | undefined, sort: SortKey[] | undefined): string {
  return JSON.stringify([filter ?? null, sort ?? []]);
}

/**
 * A live window of a collection: `items` always equals what the server holds in the
 * window, as of the last frame. Made by `OrdoClient.subscribe`.
 */
export class LiveList {
  /** The subscription id (chosen by the caller, or generated). */
  readonly id: string;
  /** A promise that resolves at the first frame (a Reset) and rejects if the subscribe is refused. */
  readonly ready: Promise<void>;

  private _items: readonly Item[] = [];
  private _seq = 0;
  private _status: ListStatus = "subscribing";
  private _error: OrdoError | null = null;
  private _total: number | null = null;
  private _writeSeq: number | null = null;
  /** The greatest `write_seq` applied so far: the `min_seq` of every later subscribe or resume of this list. */
  private _floorSeq: number | null = null;
  private _ended: ListEnded | null = null;
  private readonly emitter = new Emitter<ListEvents>();
  private settled = false;
  private resolveReady!: () => void;
  private rejectReady!: (error: OrdoError) => void;

  /** @internal The definition the caller wants (filter, sort and range included). */
  definition: WindowDefinition;
  /** @internal The definition the server was last told about. */
  sentDefinition: WindowDefinition;
  /** @internal The definition before the last window change sent, to restore if it is refused. */
  beforeChange: WindowDefinition | null = null;
  /** @internal A window change waits for the first frame (or the next connection). */
  changePending = false;

  /** Made by `OrdoClient.subscribe`; not meant to be called directly. */
  constructor(
    private readonly client: OrdoClient,
    id: string,
    definition: WindowDefinition,
  ) {
    this.id = id;
    this.definition = copyDefinition(definition);
    this.sentDefinition = copyDefinition(definition);
    this.ready = new Promise<void>((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    // A caller that never awaits `ready` must not get an unhandled rejection.
    this.ready.catch(() => {});
  }

  /** The list's contents: a new array after every change, so it can be compared by identity. */
  get items(): readonly Item[] {
    return this._items;
  }

  /** The `seq` of the last frame applied (0: none yet). */
  get seq(): number {
    return this._seq;
  }

  /** `subscribing` until the first frame, `live` after it, `closed` once closed or refused. */
  get status(): ListStatus {
    return this._status;
  }

  /** The last error reported for this list, or null. */
  get error(): OrdoError | null {
    return this._error;
  }

  /** @internal Frames whose window digest was not the list's (see `digestMismatches`). */
  _digestMismatches = 0;

  /**
   * How many frames had a window digest other than the list's once applied: each was
   * dropped, reported as an `error` event with code `digest_mismatch`, and the list
   * subscribed again. 0 on a healthy connection.
   */
  get digestMismatches(): number {
    return this._digestMismatches;
  }

  /** The number of items in the whole view (not just the window), as of the last frame that said; null before. */
  get total(): number | null {
    return this._total;
  }

  /** The last write (batch `seq`) the list reflects (a write's answer has its `seq`); null before the first frame. */
  get writeSeq(): number | null {
    return this._writeSeq;
  }

  /**
   * The greatest `write_seq` this list has applied (null: none yet). Every later
   * subscribe or resume of it (after a reconnection, on this node or another) asks for
   * `min_seq` = this, so the list never goes back in time.
   */
  get floorSeq(): number | null {
    return this._floorSeq;
  }

  /** Why the server ended the subscription (`status` is then `ended`), or null. */
  get ended(): ListEnded | null {
    return this._ended;
  }

  /** The window as the caller last set it. */
  get view(): Readonly<WindowDefinition> {
    return copyDefinition(this.definition);
  }

  on(event: "change", listener: (change: ListChange) => void): () => void;
  on(event: "error", listener: (error: OrdoError) => void): () => void;
  on(event: "ended", listener: (ended: ListEnded) => void): () => void;
  on(event: keyof ListEvents, listener: (value: never) => void): () => void {
    return this.emitter.on(event, listener as (value: ListEvents[typeof event]) => void);
  }

  /** Moves or grows the window ("load more"). The change reaches the list as diffs. */
  setRange(offset: number, limit: number): void {
    if (this._status === "closed" || this._status === "ended") return;
    checkRange(offset, limit);
    // An offset ends a tail window's following of the end (PROTOCOL.md, set_range).
    this.definition = { ...this.definition, offset, limit, tail: false };
    this.client._windowChanged(this);
  }

  /** Changes the filter and the sort, keeping the range. Keys left out are kept as they are. */
  setView(view: ViewSpec): void {
    if (this._status === "closed" || this._status === "ended") return;
    const next = { ...this.definition };
    if (view.filter !== undefined) next.filter = view.filter;
    if (view.sort !== undefined) next.sort = view.sort;
    this.definition = next;
    this.client._windowChanged(this);
  }

  /** Unsubscribes. The list keeps its last items; `ready` rejects with `closed` if it was pending. */
  close(): void {
    if (this._status === "closed" || this._status === "ended") return;
    this.client._closeList(this);
  }

  /** @internal */
  _applyChange(seq: number, change: ListChange): void {
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
  _fail(error: OrdoError, fatal: boolean): void {
    this._error = error;
    if (fatal) this._markClosed(error);
    this.emitter.emit("error", error);
  }

  /** @internal */
  _markClosed(error: OrdoError): void {
    this._status = "closed";
    if (!this.settled) {
      this.settled = true;
      this.rejectReady(error);
    }
  }

  /** @internal The server ended the subscription: the list keeps its last items. */
  _markEnded(ended: ListEnded): void {
    this._ended = ended;
    this._status = "ended";
    if (!this.settled) {
      this.settled = true;
      this.rejectReady(new OrdoError(ended.reason, ended.message, ended.sub));
    }
    this.emitter.emit("ended", ended);
  }

  /** @internal The subscription is being recovered (after a gap): frames resume with a Reset. */
  _restarting(): void {
    if (this._status === "live") this._status = "subscribing";
  }

  /** @internal */
  _definitionKey(definition: WindowDefinition): { range: string; view: string } {
    return {
      range: definition.tail === true ? `tail:${definition.limit}` : `${definition.offset ?? 0}:${definition.limit}`,
      view: viewKey(definition.filter, definition.sort),
    };
  }
}

/**
 * A connection to an Ordo server that keeps `LiveList`s in sync, reconnects with
 * exponential backoff and resumes every subscription where it left off.
 */
export class OrdoClient {
  private readonly nodes: NodeRotation;
  /** The node whose connection last completed its handshake (null: none yet). */
  private servedBy: string | null = null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  private readonly Socket: any;
  private readonly initialDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly reconnectEnabled: boolean;
  private readonly token: string | undefined;
  private readonly tokenProvider: (() => string | Promise<string>) | undefined;

  private readonly core = new ProtocolState();
  private readonly lists = new Map<string, LiveList>();
  private readonly emitter = new Emitter<ClientEvents>();
  private socket: SocketLike | null = null;
  /** The socket has had its `welcome`: `auth` may go out. */
  private welcomed = false;
  /** The socket has had its `welcome` (and `authed`, when the server wants a token): every message may go out. */
  private handshaken = false;
  /** The `welcome`'s session, kept while `auth` is answered. */
  private welcomeSession: string | null = null;
  /** An `auth` is on its way (or its token is being fetched). */
  private authPending = false;
  /** Bumped at every token request: an answer for an older one is dropped. */
  private authGeneration = 0;
  private refreshTimer: ReturnType<typeof setTimeout> | null = null;
  /** The last token sent: its `exp` sets the next refresh. */
  private lastToken: string | null = null;
  private _identity: AuthIdentity | null = null;
  private _state: ConnectionState = "connecting";
  /** The session to name in the next `resume`. */
  private resumeSession: string | null = null;
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
  private handshakeTimer: ReturnType<typeof setTimeout> | null = null;
  private nextId = 0;

  private outbox: string[] = [];
  private tokens = SEND_BURST;
  private tokensAt = 0;
  private messagesPerSecond = DEFAULT_MESSAGES_PER_SECOND;
  private drainTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(options: OrdoClientOptions) {
    this.Socket = options.WebSocket ?? (globalThis as { WebSocket?: unknown }).WebSocket;
    if (typeof this.Socket !== "function") {
      throw new TypeError(
        "no WebSocket: pass one as `new OrdoClient({ url, WebSocket })` (in Node < 22, the `ws` package's)",
      );
    }
    this.initialDelayMs = Math.max(1, options.reconnect?.initialDelayMs ?? DEFAULT_INITIAL_DELAY_MS);
    this.maxDelayMs = Math.max(this.initialDelayMs, options.reconnect?.maxDelayMs ?? DEFAULT_MAX_DELAY_MS);
    this.reconnectEnabled = options.reconnect?.enabled ?? true;
    this.nodes = new NodeRotation(options.url, this.initialDelayMs, this.maxDelayMs);
    this.token = options.token;
    this.tokenProvider = options.tokenProvider;
    if (this.token !== undefined && typeof this.token !== "string") throw new TypeError("`token` must be a string");
    if (this.tokenProvider !== undefined && typeof this.tokenProvider !== "function") {
      throw new TypeError("`tokenProvider` must be a function returning a token");
    }
    this.connect();
  }

  /** The session of the current (or last) connection, from `welcome` then `resumed`. */
  get session(): string | null {
    return this.core.session;
  }

  get state(): ConnectionState {
    return this._state;
  }

  /** The URL of the node in use (or being connected to). */
  get currentUrl(): string {
    return this.nodes.current;
  }

  /** Every node URL the client was given, in rotation order. */
  get urls(): readonly string[] {
    return this.nodes.all;
  }

  /** Who the server says the connection is (from `authed`), or null (no auth, or not yet). */
  get identity(): AuthIdentity | null {
    return this._identity;
  }

  on(event: "state", listener: (state: ConnectionState) => void): () => void;
  /**
   * Errors that concern no list: rate limiting, unreadable frames, a protocol version
   * mismatch, a refused token (`unauthorized`, `forbidden`), a connection closed for
   * want of a valid token (`unauthorized`, close code 4401).
   */
  on(event: "error", listener: (error: OrdoError) => void): () => void;
  /** The server accepted a token (at connection or at a refresh): who the connection is. */
  on(event: "auth", listener: (identity: AuthIdentity) => void): () => void;
  /** The server ended a subscription (`ended`): also reported on the list, which then has status `ended`. */
  on(event: "ended", listener: (ended: ListEnded) => void): () => void;
  /** The client is served by another node than before (after a lost node, or a node that lags). */
  on(event: "failover", listener: (failover: Failover) => void): () => void;
  on(event: keyof ClientEvents, listener: (value: never) => void): () => void {
    return this.emitter.on(event, listener as (value: ClientEvents[typeof event]) => void);
  }

  /** Subscribes to a window. The list fills at its first frame (`ready`). */
  subscribe(view: SubscribeOptions): LiveList {
    if (this._state === "closed") throw new OrdoError("closed", "the client is closed");
    const { id: chosen, ...definition } = view;
    if (typeof definition.collection !== "string" || definition.collection === "") {
      throw new TypeError("subscribe needs a collection");
    }
    checkRange(definition.offset ?? 0, definition.limit);
    let id = chosen;
    if (id === undefined) {
      do id = `s${++this.nextId}`;
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
  refreshToken(): void {
    if (this.tokenProvider && this.handshaken && this._identity !== null) void this.authenticate();
  }

  /** Closes the connection for good: every list stops (pending `ready`s reject with `closed`). */
  close(): void {
    if (this._state === "closed") return;
    this.clearTimers();
    const socket = this.socket;
    this.detachSocket();
    if (socket) {
      try {
        socket.close(1000, "client closed");
      } catch {
        // Closing a socket that is still connecting may throw in some implementations.
      }
    }
    const error = new OrdoError("closed", "the client was closed");
    for (const list of this.lists.values()) list._markClosed(error);
    this.lists.clear();
    this.setState("closed");
  }

  // ---- Connection ----

  private connect(): void {
    this.reconnectTimer = null;
    const url = this.nodes.current;
    let socket: SocketLike;
    try {
      socket = new this.Socket(url) as SocketLike;
    } catch (error) {
      this.emitter.emit("error", new OrdoError("connect", `cannot connect to ${url}: ${String(error)}`));
      this.onSocketGone(undefined);
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
        // Closing a socket that is still connecting may throw in some implementations.
      }
      this.emitter.emit("error", new OrdoError("protocol", `no welcome (or no authed) from ${url} in ${HANDSHAKE_TIMEOUT_MS} ms`));
      this.onSocketGone(undefined);
    }, HANDSHAKE_TIMEOUT_MS);
    socket.onmessage = (event) => {
      if (this.socket === socket) this.onMessage(event.data);
    };
    socket.onclose = (event) => {
      if (this.socket === socket) this.onSocketGone(event?.code);
    };
    socket.onerror = () => {
      // A close event follows.
    };
  }

  private detachSocket(): void {
    if (this.handshakeTimer !== null) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    const socket = this.socket;
    if (socket) {
      socket.onmessage = null;
      socket.onclose = null;
      socket.onopen = null;
      // Some implementations (the `ws` package) emit an error when a socket that is
      // still connecting is closed, and throw it if nobody listens.
      socket.onerror = () => {};
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

  private clearTimers(): void {
    if (this.reconnectTimer !== null) clearTimeout(this.reconnectTimer);
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.reconnectTimer = null;
    this.drainTimer = null;
  }

  private onSocketGone(code: number | undefined): void {
    this.detachSocket();
    if (code === CLOSE_UNAUTHORIZED && this._state !== "closed") {
      // The token expired unrefreshed, or none was sent in time: the next connection
      // asks the provider for a fresh one, then resumes.
      this.emitter.emit(
        "error",
        new OrdoError("unauthorized", "the server closed the connection for want of a valid token (close code 4401)"),
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
    // 1001 (server stopping), 4001 (slow), 4401 (token expired), a dropped TCP connection: all resume.
    this.scheduleReconnect();
  }

  /**
   * Connects again, to the next node (round robin), after a jitter within a round of the
   * nodes or the backoff's delay (exponential, capped, with jitter) once a round failed.
   */
  private scheduleReconnect(): void {
    this.setState("reconnecting");
    const delay = this.nodes.fail();
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }

  private setState(state: ConnectionState): void {
    if (this._state === state) return;
    this._state = state;
    this.emitter.emit("state", state);
  }

  // ---- Sending ----

  private send(message: ClientMessage): void {
    if (!this.socket || !this.handshaken) return;
    this.outbox.push(JSON.stringify(message));
    this.drain();
  }

  /** `auth` goes out as soon as the `welcome` came (before anything else at connection). */
  private sendAuth(token: string): void {
    if (!this.socket || !this.welcomed) return;
    this.outbox.push(JSON.stringify({ op: "auth", token } satisfies ClientMessage));
    this.drain();
  }

  /** Sends what the rate allows; the rest waits (the server refuses messages past its rate). */
  private drain(): void {
    const socket = this.socket;
    if (!socket) return;
    const now = Date.now();
    this.tokens = Math.min(SEND_BURST, this.tokens + ((now - this.tokensAt) / 1000) * this.messagesPerSecond);
    this.tokensAt = now;
    while (this.outbox.length > 0 && this.tokens >= 1) {
      const text = this.outbox.shift()!;
      this.tokens -= 1;
      try {
        socket.send(text);
      } catch {
        // The socket is closing; its close event brings a resume.
        return;
      }
    }
    if (this.outbox.length > 0 && this.drainTimer === null) {
      const wait = Math.ceil(((1 - this.tokens) / this.messagesPerSecond) * 1000);
      this.drainTimer = setTimeout(() => {
        this.drainTimer = null;
        this.drain();
      }, Math.max(1, wait));
    }
  }

  private sendSubscribe(list: LiveList): void {
    list.sentDefinition = copyDefinition(list.definition);
    list.beforeChange = null;
    list.changePending = false;
    const message: ClientMessage = { op: "subscribe", sub: list.id, ...list.sentDefinition };
    // Never older than what the list already showed (it may be another node's answer).
    if (list.floorSeq !== null) message.min_seq = list.floorSeq;
    this.send(message);
  }

  /** @internal A list's window changed: tell the server now if it can take it. */
  _windowChanged(list: LiveList): void {
    if (!this.handshaken || this.core.get(list.id)?.phase !== "live") {
      // Sent at the first frame, or carried by the next subscribe or resume.
      list.changePending = true;
      return;
    }
    this.sendWindowChange(list);
  }

  private sendWindowChange(list: LiveList): void {
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
        sort: list.definition.sort ?? [],
      });
    }
    if (wanted.range !== sent.range) {
      const { tail, offset, limit } = list.definition;
      this.send(
        tail === true
          ? { op: "set_range", sub: list.id, tail: true, limit }
          : { op: "set_range", sub: list.id, offset: offset ?? 0, limit },
      );
    }
    list.sentDefinition = copyDefinition(list.definition);
  }

  /** @internal */
  _closeList(list: LiveList): void {
    this.lists.delete(list.id);
    const phase = this.core.get(list.id)?.phase;
    if (this.handshaken && phase !== undefined) {
      this.core.unsubscribe(list.id);
      this.send({ op: "unsubscribe", sub: list.id });
    } else {
      // Not connected: the next resume does not list it, so the server closes it.
      this.core.forget(list.id);
    }
    list._markClosed(new OrdoError("closed", `subscription \`${list.id}\` was closed`, list.id));
  }

  // ---- Receiving ----

  private onMessage(data: unknown): void {
    if (typeof data !== "string") {
      this.onUnreadable(undefined, "the server sent a binary frame");
      return;
    }
    let frame: unknown;
    try {
      frame = JSON.parse(data);
    } catch {
      this.onUnreadable(undefined, `the server sent a frame that is not JSON: ${data.length > 200 ? `${data.slice(0, 200)}…` : data}`);
      return;
    }
    let events: ProtocolEvent[];
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
  private onUnreadable(frame: unknown, message: string): void {
    this.onEvent(this.core.unreadable(frame, message));
  }

  private onEvent(event: ProtocolEvent): void {
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
            new OrdoError("auth_expired", "the token expired and cannot be refreshed without a `tokenProvider`"),
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
          write_seq: event.write_seq,
        });
        // Window changes made before the first frame go out now.
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
        const list = event.sub === undefined ? undefined : this.lists.get(event.sub);
        if (!list) {
          this.emitter.emit("error", error);
          if (event.sub === undefined && (event.code === "unauthorized" || event.code === "forbidden")) {
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
          // A refused set_range or set_view leaves the subscription as it was.
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
        // Not re-subscribed: the id is free for a new `subscribe`.
        const ended: ListEnded = { sub: event.sub, reason: event.reason, message: event.message };
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
  private onProtocolError(event: Extract<ProtocolEvent, { kind: "protocol" }>): void {
    const error = new OrdoError("protocol", event.message, event.sub);
    const named = event.resubscribe === "sub" && event.sub !== undefined ? this.lists.get(event.sub) : undefined;
    if (named) named._fail(error, false);
    else this.emitter.emit("error", error);
    if (event.resubscribe === "none") return;
    if (!this.handshaken) {
      // Before the connection is ready (the frame may have been the `welcome` or
      // `authed`): start it again; nothing was applied on it yet.
      if (this.socket) this.restartConnection(true);
      return;
    }
    if (named && this.isSettled(named.id)) {
      this.restartList(named);
      return;
    }
    // Every list. One already being re-subscribed or closed waits for an `unsubscribed`
    // that may have been this very frame: only a new connection can tell, so then
    // every list is subscribed afresh on one.
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
  private behindList(list: LiveList, code: string, message: string): boolean {
    const behind = code === "lagging" || (code === "seq_not_reached" && list.floorSeq !== null);
    if (!behind || !this.reconnectEnabled) return false;
    list._fail(new OrdoError(code, message, list.id), false);
    list._restarting();
    // The refusal removed it from the core: it is subscribed afresh on the next connection.
    this.core.subscribe(list.id);
    this.restartConnection(true, "node behind");
    return true;
  }

  /** The subscription is live or being subscribed: no `unsubscribed` is awaited for it. */
  private isSettled(sub: string): boolean {
    const phase = this.core.get(sub)?.phase;
    return phase === "live" || phase === "subscribing";
  }

  /** Recovers a list: a fresh subscription under the same id, whose first frame is a Reset. */
  private restartList(list: LiveList): void {
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
  private restartConnection(resume: boolean, reason = "unreadable frame"): void {
    const socket = this.socket;
    if (!socket) return;
    if (!resume) this.resumeSession = null;
    this.detachSocket();
    try {
      socket.close(1000, reason);
    } catch {
      // Closing a socket that is still connecting may throw in some implementations.
    }
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.drainTimer = null;
    this.scheduleReconnect();
  }

  private onWelcome(event: Extract<ProtocolEvent, { kind: "welcome" }>): void {
    if (event.protocol !== PROTOCOL_VERSION) {
      this.emitter.emit(
        "error",
        new OrdoError("protocol", `the server speaks protocol ${event.protocol}; this client speaks ${PROTOCOL_VERSION}`),
      );
    }
    const rate = event.limits.ws_messages_per_second;
    if (typeof rate === "number" && rate > 0) this.messagesPerSecond = rate * 0.9;
    this.tokens = SEND_BURST;
    this.tokensAt = Date.now();
    this.welcomed = true;
    this.welcomeSession = event.session;
    if (typeof event.auth === "object") this.setIdentity(event.auth);
    const hasToken = this.tokenProvider !== undefined || this.token !== undefined;
    if (event.auth !== "none" && hasToken) {
      // `auth` first; `resume` or the subscribes once `authed` comes.
      void this.authenticate();
      return;
    }
    if (event.auth === "required") {
      this.emitter.emit(
        "error",
        new OrdoError("unauthorized", "the server requires a token: pass `token` or `tokenProvider` to OrdoClient"),
      );
    }
    this.onReady(event.session);
  }

  /** Gets a token (the provider's, or the fixed one) and sends `auth`. */
  private async authenticate(): Promise<void> {
    const socket = this.socket;
    if (!socket || !this.welcomed) return;
    const generation = ++this.authGeneration;
    this.authPending = true;
    if (this.refreshTimer !== null) clearTimeout(this.refreshTimer);
    this.refreshTimer = null;
    let token: string;
    try {
      token = this.tokenProvider ? await this.tokenProvider() : this.token!;
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

  private onAuthed(event: Extract<ProtocolEvent, { kind: "authed" }>): void {
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
  private onAuthRefused(): void {
    if (!this.authPending) return;
    this.authPending = false;
    if (this.handshaken) return;
    const socket = this.socket;
    if (!socket) return;
    try {
      socket.close(1000, "token refused");
    } catch {
      // Closing a socket that is still connecting may throw in some implementations.
    }
    this.onSocketGone(undefined);
  }

  private setIdentity(identity: AuthIdentity): void {
    this._identity = identity;
    this.emitter.emit("auth", identity);
  }

  /** The next refresh, from the token's own `exp` (or the server's `expires_at`). */
  private scheduleRefresh(expiresAt: number): void {
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
  private onReady(session: string): void {
    this.handshaken = true;
    this.nodes.succeeded();
    const url = this.nodes.current;
    if (this.servedBy !== null && this.servedBy !== url) this.emitter.emit("failover", { from: this.servedBy, to: url });
    this.servedBy = url;
    if (this.handshakeTimer !== null) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    const previous = this.resumeSession;
    if (previous !== null && this.lists.size > 0) {
      // One `resume`, first: every list with its current definition and last seq.
      const subs: ResumeEntry[] = [];
      for (const { sub, last_seq } of this.core.prepareResume()) {
        const list = this.lists.get(sub);
        if (!list) {
          this.core.forget(sub);
          continue;
        }
        list.sentDefinition = copyDefinition(list.definition);
        list.beforeChange = null;
        list.changePending = false;
        const entry: ResumeEntry = { sub, ...list.sentDefinition, last_seq };
        // A node that does not know the session (another node's, or one it lost) resets
        // every entry: `min_seq` makes it wait until it has what the list already showed.
        if (list.floorSeq !== null) entry.min_seq = list.floorSeq;
        subs.push(entry);
      }
      this.send({ op: "resume", session: previous, subs });
      // `resumed` names the session to use next time; until then the old one stays.
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
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
