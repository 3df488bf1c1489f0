// Helpers of the tests: a real `ordo serve` on loopback, its HTTP API, a WebSocket
// class whose instances the tests can reach, polling with a deadline, and a scripted
// server (a WebSocket server whose frames a test writes one by one).

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual, promisify } from "node:util";

import WebSocket, { WebSocketServer } from "ws";

import type { Item, LiveList, WindowDefinition } from "../src/index.js";

const here = fileURLToPath(new URL(".", import.meta.url));
export const ORDO_BIN = resolve(here, "..", process.env.ORDO_BIN ?? "../../target/release/ordo");

export function binaryMissingMessage(): string {
  return (
    `the ordo binary is not at ${ORDO_BIN}; build it with ` +
    "`cargo build --release -p ordo-server --bin ordo` at the repository root, or set ORDO_BIN"
  );
}

export class OrdoServer {
  readonly dataDir: string;
  private child: ChildProcess | null = null;
  private output = "";
  port = 0;
  /** Options added to `ordo serve` (auth, say). */
  args: string[] = [];
  /** Sent as `Authorization: Bearer` with every HTTP request, when set. */
  token: string | null = null;

  constructor(dataDir?: string) {
    this.dataDir = dataDir ?? mkdtempSync(join(tmpdir(), "ordo-ts-client-"));
  }

  /**
   * Turns auth on for the next start: a fresh HS256 secret in a file of the data
   * directory, `--auth-secret-file`, and an admin token for the helpers' own requests.
   * Returns the secret file (for `mintToken`).
   */
  async useAuth(): Promise<string> {
    const secretFile = join(this.dataDir, "test-secret");
    writeFileSync(secretFile, randomBytes(32).toString("hex"), { mode: 0o600 });
    this.args = ["--auth-secret-file", secretFile];
    this.token = await mintToken(secretFile, { sub: "test-admin", role: "admin", ttl: 3600 });
    return secretFile;
  }

  get httpUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get wsUrl(): string {
    return `ws://127.0.0.1:${this.port}/v1/ws`;
  }

  /** What the server printed (stdout and stderr), for failure messages. */
  get log(): string {
    return this.output;
  }

  /**
   * Starts `ordo serve` (on `port`, or on the one it had, or on any free one) and
   * resolves once it prints its address. A port still held by the previous process
   * is retried for a while.
   */
  async start(port = this.port, timeoutMs = 60_000): Promise<void> {
    if (!existsSync(ORDO_BIN)) throw new Error(binaryMissingMessage());
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        await this.startOnce(port, deadline);
        return;
      } catch (error) {
        const busy = /cannot listen/.test(String(error));
        if (!busy || Date.now() > deadline) throw error;
        await sleep(200);
      }
    }
  }

  private startOnce(port: number, deadline: number): Promise<void> {
    const child = spawn(
      ORDO_BIN,
      ["serve", "--listen", `127.0.0.1:${port}`, "--data-dir", this.dataDir, ...this.args],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    this.child = child;
    let text = "";
    return new Promise<void>((resolvePromise, reject) => {
      const timer = setTimeout(
        () => {
          child.kill("SIGKILL");
          reject(new Error(`ordo serve printed no address in time; it said:\n${text}`));
        },
        Math.max(1000, deadline - Date.now()),
      );
      const onData = (chunk: Buffer) => {
        text += chunk.toString();
        this.output += chunk.toString();
        const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(text);
        if (match) {
          clearTimeout(timer);
          this.port = Number(match[1]);
          resolvePromise();
        }
      };
      child.stdout!.on("data", onData);
      child.stderr!.on("data", onData);
      child.on("exit", (code, signal) => {
        clearTimeout(timer);
        if (this.child === child) this.child = null;
        reject(new Error(`ordo serve exited (code ${code}, signal ${signal}) before listening; it said:\n${text}`));
      });
    });
  }

  /** Stops the server with `signal` and waits for the process to end. */
  async stop(signal: NodeJS.Signals = "SIGTERM", timeoutMs = 30_000): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = null;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolvePromise) => child.once("exit", () => resolvePromise()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }

  /** Stops the server and removes its data directory. */
  async dispose(): Promise<void> {
    await this.stop("SIGKILL");
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  async request(
    method: string,
    path: string,
    body?: unknown,
    token: string | null = this.token,
  ): Promise<{ status: number; json: unknown }> {
    const headers: Record<string, string> = {};
    const init: RequestInit = { method, headers };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      headers["content-type"] = "application/json";
    }
    if (token !== null) headers.authorization = `Bearer ${token}`;
    const response = await fetch(this.httpUrl + path, init);
    const text = await response.text();
    return { status: response.status, json: text ? JSON.parse(text) : null };
  }

  /** A request that must succeed (2xx). */
  async ok(method: string, path: string, body?: unknown, token: string | null = this.token): Promise<unknown> {
    const { status, json } = await this.request(method, path, body, token);
    if (status < 200 || status >= 300) {
      throw new Error(`${method} ${path} answered ${status}: ${JSON.stringify(json)}`);
    }
    return json;
  }

  /** The one-shot query of a window (as `token`'s identity sees it): what a live list of it must hold. */
  async query(view: WindowDefinition, token: string | null = this.token): Promise<Item[]> {
    const { collection, ...body } = view;
    const path = `/v1/collections/${encodeURIComponent(collection)}/query`;
    const answer = (await this.ok("POST", path, body, token)) as { items: Item[] };
    // Query items and items in diff frames both carry their version (the window digest covers it).
    return answer.items;
  }
}

/** A token from `ordo token` (HS256, signed with the secret in `secretFile`). */
export async function mintToken(
  secretFile: string,
  claims: { sub: string; role?: string; ttl?: number },
): Promise<string> {
  if (!existsSync(ORDO_BIN)) throw new Error(binaryMissingMessage());
  const args = ["token", "--secret-file", secretFile, "--sub", claims.sub];
  if (claims.role !== undefined) args.push("--role", claims.role);
  if (claims.ttl !== undefined) args.push("--ttl", String(claims.ttl));
  const { stdout } = await promisify(execFile)(ORDO_BIN, args, { timeout: 10_000 });
  return stdout.trim();
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolvePromise) => setTimeout(resolvePromise, ms));
}

/** Polls `check` until it returns true; past the deadline, fails with `describe()`. */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  describe: () => string | Promise<string>,
  timeoutMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${await describe()}`);
    await sleep(20);
  }
}

function summary(items: readonly Item[]): string {
  return JSON.stringify(items.map((item) => [item.id, item.fields]));
}

/** Waits until the list holds exactly what a one-shot query of its window returns (as `token` sees it). */
export async function waitForQuery(
  server: OrdoServer,
  list: LiveList,
  label: string,
  timeoutMs = 15_000,
  token: string | null = server.token,
): Promise<void> {
  let expected: Item[] = [];
  let queriedAt = 0;
  await waitFor(
    async () => {
      // The data do not change while we wait; query again now and then all the same.
      if (Date.now() - queriedAt > 1000) {
        expected = await server.query(list.view, token);
        queriedAt = Date.now();
      }
      return isDeepStrictEqual(list.items, expected);
    },
    () =>
      `${label}: list \`${list.id}\` (${JSON.stringify(list.view)}) at seq ${list.seq}, status ${list.status}, ` +
      `error ${list.error?.code ?? "none"}\n  holds    ${summary(list.items)}\n  query is ${summary(expected)}`,
    timeoutMs,
  );
}

/** A tap on the sockets a client makes: what it sent, and a filter for what it receives. */
export interface SocketTap {
  sockets: WebSocket[];
  sent: unknown[][];
  /** Returns true to drop an incoming frame (after JSON.parse) before the client sees it. */
  dropIncoming: ((frame: { type?: string; sub?: string; seq?: number }) => boolean) | null;
  received: unknown[][];
  /** Connect here instead of the client's URL (to hold a reconnection off). */
  redirect: string | null;
}

/**
 * A WebSocket "constructor" for OrdoClient: real `ws` sockets, with every message
 * sent and received recorded per socket and incoming frames optionally dropped.
 */
export function tappedWebSocket(): { ctor: unknown; tap: SocketTap } {
  const tap: SocketTap = { sockets: [], sent: [], dropIncoming: null, received: [], redirect: null };
  const onmessage = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage")!;
  function TappedWebSocket(url: string) {
    const socket = new WebSocket(tap.redirect ?? url);
    const index = tap.sockets.length;
    tap.sockets.push(socket);
    tap.sent.push([]);
    tap.received.push([]);
    const send = socket.send.bind(socket);
    socket.send = ((data: string) => {
      tap.sent[index]!.push(JSON.parse(data));
      send(data);
    }) as typeof socket.send;
    Object.defineProperty(socket, "onmessage", {
      configurable: true,
      get: () => onmessage.get!.call(socket),
      set: (handler: ((event: { data: unknown }) => void) | null) => {
        const wrapped =
          handler &&
          ((event: { data: unknown }) => {
            const frame = JSON.parse(String(event.data));
            if (tap.dropIncoming?.(frame)) return;
            tap.received[index]!.push(frame);
            handler(event);
          });
        onmessage.set!.call(socket, wrapped);
      },
    });
    return socket;
  }
  return { ctor: TappedWebSocket, tap };
}

/** A small deterministic random number generator (xorshift). */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0 || 1;
  }
  next(): number {
    let x = this.state;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    this.state = x;
    return x / 0x1_0000_0000;
  }
  below(n: number): number {
    return Math.floor(this.next() * n);
  }
  pick<T>(values: readonly T[]): T {
    return values[this.below(values.length)]!;
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
}

// ---- A scripted server: the tests play the server's side frame by frame ----

/** One connection to a `ScriptedServer`: what the client sent, and the server's side of it. */
export class ScriptedConnection {
  /** Every message the client sent on this connection (after JSON.parse). */
  readonly received: unknown[] = [];
  /** Resolves with the close code once the connection is closed (by either side). */
  readonly closed: Promise<number>;
  private readonly waiting: ((message: unknown) => void)[] = [];
  private read = 0;

  constructor(readonly socket: WebSocket) {
    socket.on("message", (data) => {
      const message = JSON.parse(String(data));
      this.received.push(message);
      this.waiting.shift()?.(message);
    });
    this.closed = new Promise((resolvePromise) => socket.on("close", (code) => resolvePromise(code)));
  }

  /** The next message this test has not read yet, waiting for it if need be. */
  async next(timeoutMs = 5_000): Promise<Record<string, unknown>> {
    if (this.read < this.received.length) return this.received[this.read++] as Record<string, unknown>;
    return new Promise((resolvePromise, reject) => {
      const timer = setTimeout(() => {
        const index = this.waiting.indexOf(take);
        if (index >= 0) this.waiting.splice(index, 1);
        reject(new Error(`no message from the client in ${timeoutMs} ms (it sent ${JSON.stringify(this.received)})`));
      }, timeoutMs);
      const take = (message: unknown) => {
        clearTimeout(timer);
        this.read += 1;
        resolvePromise(message as Record<string, unknown>);
      };
      this.waiting.push(take);
    });
  }

  /** Fails if the client sends anything within `ms`. */
  async nothingFor(ms: number): Promise<void> {
    const before = this.received.length;
    await sleep(ms);
    if (this.received.length !== before) {
      throw new Error(`the client sent ${JSON.stringify(this.received.slice(before))} when it should have waited`);
    }
  }

  send(frame: unknown): void {
    this.socket.send(JSON.stringify(frame));
  }

  sendRaw(text: string): void {
    this.socket.send(text);
  }

  welcome(session: string, auth?: unknown): void {
    this.send({ type: "welcome", protocol: 1, session, limits: { ws_messages_per_second: 100 }, ...(auth === undefined ? {} : { auth }) });
  }

  close(code: number, reason = ""): void {
    this.socket.close(code, reason);
  }
}

/** A WebSocket server on loopback whose every frame the test writes by hand. */
export class ScriptedServer {
  readonly connections: ScriptedConnection[] = [];
  private readonly waiting: ((connection: ScriptedConnection) => void)[] = [];

  private constructor(private readonly server: WebSocketServer) {
    server.on("connection", (socket) => {
      const connection = new ScriptedConnection(socket);
      this.connections.push(connection);
      this.waiting.shift()?.(connection);
    });
  }

  static async start(): Promise<ScriptedServer> {
    const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    await new Promise<void>((resolvePromise) => server.once("listening", () => resolvePromise()));
    return new ScriptedServer(server);
  }

  get url(): string {
    const address = this.server.address() as { port: number };
    return `ws://127.0.0.1:${address.port}/v1/ws`;
  }

  private taken = 0;

  /** The next connection this test has not taken yet, waiting for it if need be. */
  async nextConnection(timeoutMs = 5_000): Promise<ScriptedConnection> {
    if (this.taken < this.connections.length) return this.connections[this.taken++]!;
    return new Promise((resolvePromise, reject) => {
      const timer = setTimeout(() => reject(new Error(`no connection in ${timeoutMs} ms`)), timeoutMs);
      this.waiting.push((connection) => {
        clearTimeout(timer);
        this.taken += 1;
        resolvePromise(connection);
      });
    });
  }

  async close(): Promise<void> {
    for (const client of this.server.clients) client.terminate();
    await new Promise<void>((resolvePromise) => this.server.close(() => resolvePromise()));
  }
}

/** An unsigned JWT-shaped token with these claims (the client reads `exp`; only a server checks signatures). */
export function fakeJwt(claims: Record<string, unknown>): string {
  const part = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64url");
  return `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}.c2lnbmF0dXJl`;
}
