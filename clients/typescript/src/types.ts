// Wire types of the Ordo protocol, version 1 (docs/PROTOCOL.md).

/** The protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;

/** A JSON value as it appears on the wire. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A field value: the schema's types are bool, i64, u64, f64 and string. */
export type FieldValue = null | boolean | number | string;

/** An item on the wire. `payload` is absent when the subscription asked for `payload: false`. */
export type Item = {
  id: string;
  /** The `seq` of the last write that changed the item (absent from servers older than the window digest). */
  version?: number;
  fields: Record<string, unknown>;
  payload?: unknown;
};

/** One diff, exactly as serde_json writes an `eyeball_im::VectorDiff<Item>`. */
export type VectorDiff =
  | { Append: { values: Item[] } }
  | { Clear: Record<string, never> }
  | { PushFront: { value: Item } }
  | { PushBack: { value: Item } }
  | { PopFront: Record<string, never> }
  | { PopBack: Record<string, never> }
  | { Insert: { index: number; value: Item } }
  | { Set: { index: number; value: Item } }
  | { Remove: { index: number } }
  | { Truncate: { length: number } }
  | { Reset: { values: Item[] } };

/** The names of the eleven diff kinds. */
export type VectorDiffKind =
  | "Append"
  | "Clear"
  | "PushFront"
  | "PushBack"
  | "PopFront"
  | "PopBack"
  | "Insert"
  | "Set"
  | "Remove"
  | "Truncate"
  | "Reset";

export type CompareOp = "eq" | "ne" | "lt" | "le" | "gt" | "ge";

/** A filter (PROTOCOL.md "Views and windows"); `null` or absent matches every item. */
export type Filter =
  | { field: string; op: CompareOp; value: FieldValue }
  /** Two fields of the same item: `{ field: "room.last_seq", op: "gt", value: { field: "read_upto" } }`. */
  | { field: string; op: CompareOp; value: { field: string } }
  | { field: string; in: FieldValue[] }
  | { field: string; is_null: boolean }
  | { field: string; contains: string; accent_insensitive?: boolean }
  | { field: string; prefix: string; accent_insensitive?: boolean }
  | { all: Filter[] }
  | { any: Filter[] }
  | { not: Filter };

/**
 * One sort key; `dir` defaults to `asc`. The item id breaks every tie. `collation` is a
 * BCP 47 locale ("fr", "sv", "de-u-co-phonebk"; "root" for the root collation).
 */
export type SortKey = { field: string; dir?: "asc" | "desc"; case_insensitive?: boolean; collation?: string };

/** A filter and a sort: what `set_view` changes. */
export type ViewSpec = { filter?: Filter | null; sort?: SortKey[] };

/** A window of a view, as `subscribe` takes it (without the subscription id). */
export type WindowDefinition = {
  collection: string;
  filter?: Filter | null;
  sort?: SortKey[];
  offset?: number;
  /** The last `limit` rows, the window staying at the end of the view (instead of `offset`). */
  tail?: boolean;
  limit: number;
  fields?: string[];
  payload?: boolean;
};

/** What `OrdoClient.subscribe` takes: a window definition and an optional subscription id. */
export type SubscribeOptions = WindowDefinition & { id?: string };

// ---- Server → client frames ----

/** Who a connection is, as the server says in `authed` (and in `welcome` when the token came with the upgrade). */
export type AuthIdentity = { sub: string; role: string; expires_at: number };

/**
 * `welcome.auth`: `"none"` (the server runs without auth: send no `auth`), `"required"`
 * (send `auth` first), or the identity the connection already has (a token in the
 * upgrade request). Servers without auth leave it out, which means `"none"`.
 */
export type WelcomeAuth = "none" | "required" | AuthIdentity;

export type WelcomeFrame = {
  type: "welcome";
  protocol: number;
  session: string;
  limits?: Record<string, unknown>;
  auth?: WelcomeAuth;
};

/** The answer to `auth`: the token is accepted (`expires_at`: its `exp`, unix seconds). */
export type AuthedFrame = { type: "authed" } & AuthIdentity;

/** The connection's token has expired: a valid `auth` within `grace_secs` keeps the connection. */
export type AuthExpiredFrame = { type: "auth_expired"; grace_secs: number };

export type DiffsFrame = { type: "diffs"; sub: string; seq: number; diffs: VectorDiff[] };

export type ErrorFrame = { type: "error"; code: string; message?: string; sub?: string };

export type UnsubscribedFrame = { type: "unsubscribed"; sub: string };

/** One subscription's outcome in a `resumed` frame. */
export type ResumedSub =
  | { sub: string; replayed: number }
  | { sub: string; reset: true }
  | { sub: string; error: { code: string; message?: string } };

export type ResumedFrame = { type: "resumed"; session: string; subs: ResumedSub[] };

export type ServerFrame =
  | WelcomeFrame
  | DiffsFrame
  | ErrorFrame
  | UnsubscribedFrame
  | ResumedFrame
  | AuthedFrame
  | AuthExpiredFrame;

// ---- Client → server messages ----

/** `min_seq`: answer only once the node has applied that batch (PROTOCOL.md "Read your writes"). */
export type SubscribeOp = { op: "subscribe"; sub: string; min_seq?: number } & WindowDefinition;
export type SetRangeOp = { op: "set_range"; sub: string; offset?: number; tail?: boolean; limit: number };
export type SetViewOp = { op: "set_view"; sub: string; filter: Filter | null; sort: SortKey[] };
export type UnsubscribeOp = { op: "unsubscribe"; sub: string };
export type ResumeEntry = { sub: string; last_seq: number; min_seq?: number } & WindowDefinition;
export type ResumeOp = { op: "resume"; session: string; subs: ResumeEntry[] };

/** Authenticates the connection, or refreshes its token (same identity, later `exp`). */
export type AuthOp = { op: "auth"; token: string };

export type ClientMessage = SubscribeOp | SetRangeOp | SetViewOp | UnsubscribeOp | ResumeOp | AuthOp;
