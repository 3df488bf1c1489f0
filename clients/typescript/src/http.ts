// `@ordo/client/http`: HTTP helpers (docs/PROTOCOL.md "HTTP API") for schemas, writes,
// one-shot queries and items, with the same token options as OrdoClient. Uses the
// platform's `fetch`. A separate entry: the main one and the browser bundle (which the
// server's demo embeds byte for byte) stay as they are.

import { OrdoError } from "./errors.js";
import type { Filter, Item, SortKey } from "./types.js";

/** A field of a collection's schema. */
export type FieldSpec = { name: string; type: "bool" | "i64" | "u64" | "f64" | "string" };

/** A collection as the server describes it (`items` only when the caller may read every row). */
export type CollectionInfo = { name: string; fields: FieldSpec[]; items?: number };

/** A precondition on an op: the whole batch is refused (409 `conflict`) when it fails. */
export type Precondition = { exists: boolean } | { version: number };

/**
 * One op of a batch. `payload: null` clears the payload; leaving it out keeps it.
 * `increment`, `set_max` and `set_min` are applied atomically by the server.
 */
export type BatchOp =
  | {
      op: "upsert";
      id: string;
      fields?: Record<string, unknown>;
      payload?: unknown;
      increment?: Record<string, number>;
      set_max?: Record<string, unknown>;
      set_min?: Record<string, unknown>;
      if?: Precondition;
    }
  | { op: "remove"; id: string; if?: Precondition };

/** A field to add to a collection: without `default` (or with `null`) the field is null in existing items. */
export type NewField = FieldSpec & { default?: unknown };

/** A collection after a schema change, with the `seq` of the change. */
export type SchemaChangeResult = CollectionInfo & { seq: number };

export type DropResult = { seq: number; dropped: string };

export type WriteResult = { seq: number; upserted: number; removed: number };

export type DeleteResult = { seq: number; removed: boolean };

/** A one-shot query: a view and a window (`limit` at most 1 000). Unknown keys are passed on. */
export type QueryOptions = {
  filter?: Filter | null;
  sort?: SortKey[];
  offset?: number;
  limit?: number;
  fields?: string[];
  payload?: boolean;
  [key: string]: unknown;
};

/** `write_seq` (the last batch the answer reflects) when the server sends it. */
export type QueryResult<T = Item> = { total: number; offset: number; items: T[]; write_seq?: number };

/** An item as `GET .../items/{id}` answers it (`version`: the seq of the last batch that changed it). */
export type StoredItem = Item & { version?: number };

export type OrdoHttpOptions = {
  /** A fixed token for `Authorization: Bearer`. */
  token?: string;
  /** Called for a token (once, then again after a 401). */
  tokenProvider?: () => string | Promise<string>;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
};

/**
 * An error answer: the server's stable `code` (OrdoError), its HTTP `status`, and for
 * a refused op of a batch (`conflict`) the op's index.
 */
export class OrdoHttpError extends OrdoError {
  readonly status: number;
  readonly op?: number;

  constructor(status: number, code: string, message: string, op?: number) {
    super(code, message);
    this.name = "OrdoHttpError";
    this.status = status;
    if (op !== undefined) this.op = op;
  }
}

const path = (...segments: string[]) => segments.map(encodeURIComponent).join("/");

/** Options of a write: see `OrdoHttp.write`. */
export interface WriteOptions {
  idempotencyKey?: string;
}

const idempotency = (options: WriteOptions): Record<string, string> =>
  options.idempotencyKey === undefined ? {} : { "idempotency-key": options.idempotencyKey };

/**
 * Requests that change nothing, so that sending one again (to another node) is safe:
 * GET and HEAD, and the one-shot query (a POST that only reads).
 */
export function isIdempotent(method: string, urlPath: string): boolean {
  const verb = method.toUpperCase();
  if (verb === "GET" || verb === "HEAD") return true;
  return verb === "POST" && /^\/v1\/collections\/[^/]+\/query(\?|$)/.test(urlPath);
}

export class OrdoHttp {
  private readonly bases: string[];
  /** The node in use: a connection failure moves it to the next one (round robin). */
  private idx = 0;
  private readonly fetchFn: typeof fetch;
  private token: string | undefined;
  private readonly tokenProvider: (() => string | Promise<string>) | undefined;

  /**
   * `baseUrl`: the server, `http://host:port`, or the URLs of several nodes of one
   * cluster. A request that cannot reach its node (the connection fails) moves the
   * client to the next node; a request that changes nothing (GET, query) is then sent
   * again there, once per node, and so is one a node answers 503 (lagging, or behind a
   * `min_seq`). Writes are never sent again: the node may have applied one before the
   * connection broke, so they reject with the connection's error and the caller decides.
   */
  constructor(baseUrl: string | readonly string[], options: OrdoHttpOptions = {}) {
    const bases = (typeof baseUrl === "string" ? [baseUrl] : [...baseUrl]).map((url) => url.replace(/\/+$/, ""));
    if (bases.length === 0 || bases.some((url) => typeof url !== "string" || url === "")) {
      throw new TypeError("OrdoHttp needs at least one node URL");
    }
    this.bases = bases;
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.token = options.token;
    this.tokenProvider = options.tokenProvider;
  }

  /** The node requests go to now. */
  get currentUrl(): string {
    return this.bases[this.idx]!;
  }

  /** `PUT /v1/collections/{name}`: creates it, or finds it with this very schema. */
  createCollection(name: string, fields: FieldSpec[]): Promise<CollectionInfo> {
    return this.request("PUT", `/v1/collections/${path(name)}`, { fields });
  }

  collection(name: string): Promise<CollectionInfo> {
    return this.request("GET", `/v1/collections/${path(name)}`);
  }

  /**
   * `POST /v1/collections/{name}/fields` (admin): appends a field; every existing item
   * gets `default`. Live subscriptions that did not name their fields get a Reset with it.
   */
  addField(collection: string, field: NewField): Promise<SchemaChangeResult> {
    return this.request("POST", `/v1/collections/${path(collection)}/fields`, field);
  }

  /**
   * `DELETE /v1/collections/{name}/fields/{field}` (admin): subscriptions whose filter or
   * sort reads the field end (`ended`, reason `field_removed`).
   */
  removeField(collection: string, field: string): Promise<SchemaChangeResult> {
    return this.request("DELETE", `/v1/collections/${path(collection, "fields", field)}`);
  }

  /** `DELETE /v1/collections/{name}` (admin): its subscriptions end (`ended`, reason `collection_dropped`). */
  dropCollection(collection: string): Promise<DropResult> {
    return this.request("DELETE", `/v1/collections/${path(collection)}`);
  }

  /**
   * `POST /v1/collections/{name}/batch`: applied whole or not at all; resolves once durable.
   * `options.idempotencyKey` (1 to 128 of `[A-Za-z0-9_.:-]`, a UUID say) is sent as
   * `Idempotency-Key`: calling `write` again with the same key and ops after an answer was
   * lost resolves to the first answer without writing again (on the same node, within 24 h:
   * docs/PROTOCOL.md, "Idempotency keys"). The client never sends a write again itself.
   */
  write(collection: string, ops: BatchOp[], options: WriteOptions = {}): Promise<WriteResult> {
    return this.request("POST", `/v1/collections/${path(collection)}/batch`, { ops }, idempotency(options));
  }

  query<T = Item>(collection: string, query: QueryOptions): Promise<QueryResult<T>> {
    return this.request("POST", `/v1/collections/${path(collection)}/query`, query);
  }

  /** The item, or null when there is none (a missing collection rejects). */
  async getItem(collection: string, id: string): Promise<StoredItem | null> {
    try {
      return await this.request<StoredItem>("GET", `/v1/collections/${path(collection, "items", id)}`);
    } catch (error) {
      if (error instanceof OrdoHttpError && error.code === "not_found") return null;
      throw error;
    }
  }

  /** `options.idempotencyKey`: as for `write`. */
  deleteItem(collection: string, id: string, options: WriteOptions = {}): Promise<DeleteResult> {
    return this.request("DELETE", `/v1/collections/${path(collection, "items", id)}`, undefined, idempotency(options));
  }

  /**
   * Any request, the answer's JSON on success. A 401 with a provider is retried once with
   * a fresh token. Failover across nodes: see the constructor.
   */
  async request<T>(method: string, urlPath: string, body?: unknown, headers: Record<string, string> = {}): Promise<T> {
    if (this.token === undefined && this.tokenProvider) this.token = await this.tokenProvider();
    const retry = isIdempotent(method, urlPath);
    let response: Response | null = null;
    for (let tries = 1; ; tries++) {
      const base = this.bases[this.idx]!;
      try {
        response = await this.send(base, method, urlPath, body, headers);
        if (response.status === 401 && this.tokenProvider) {
          this.token = await this.tokenProvider();
          response = await this.send(base, method, urlPath, body, headers);
        }
      } catch (error) {
        // No answer from this node: the next request goes to the next one.
        if (this.bases[this.idx] === base) this.idx = (this.idx + 1) % this.bases.length;
        if (!retry || tries >= this.bases.length) throw error;
        continue;
      }
      if (response.status === 503 && retry && tries < this.bases.length) {
        if (this.bases[this.idx] === base) this.idx = (this.idx + 1) % this.bases.length;
        await response.text().catch(() => "");
        continue;
      }
      break;
    }
    const text = await response.text();
    let json: unknown;
    try {
      json = text === "" ? null : JSON.parse(text);
    } catch {
      json = null;
    }
    if (!response.ok) {
      const error = (json as { error?: { code?: unknown; message?: unknown; op?: unknown } } | null)?.error;
      const code = typeof error?.code === "string" ? error.code : "unknown";
      const message = typeof error?.message === "string" ? error.message : text;
      throw new OrdoHttpError(response.status, code, message, typeof error?.op === "number" ? error.op : undefined);
    }
    return json as T;
  }

  private send(
    base: string,
    method: string,
    urlPath: string,
    body: unknown,
    extraHeaders: Record<string, string>,
  ): Promise<Response> {
    const headers: Record<string, string> = { ...extraHeaders };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.token !== undefined) headers.authorization = `Bearer ${this.token}`;
    return this.fetchFn(`${base}${urlPath}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  }
}
