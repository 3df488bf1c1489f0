import { applyDiffs } from "./diffs.js";
import { windowDigest } from "./digest.js";
import { OrdoError } from "./errors.js";
import type { AuthIdentity, Item, VectorDiff, WelcomeAuth } from "./types.js";

/**
 * Where a subscription stands, as far as frames go:
 *
 * - `subscribing`: a `subscribe` (or a `resume` that resets) is on its way; the next
 *   frame must have `seq` + 1. An error frame naming it means the subscribe was refused.
 * - `live`: frames apply in `seq` order; an error naming it is a refused request.
 * - `restarting`: the client sent `unsubscribe` then `subscribe` again (after a gap);
 *   frames are ignored until `unsubscribed`, then it is `subscribing` from `seq` 0.
 * - `closing`: the client sent `unsubscribe`; frames are ignored until `unsubscribed`.
 */
export type SubscriptionPhase = "subscribing" | "live" | "restarting" | "closing";

/** A subscription as the protocol core holds it. */
export interface SubscriptionSnapshot {
  readonly items: readonly Item[];
  readonly seq: number;
  readonly phase: SubscriptionPhase;
  /** The view's length (items in the whole view, not the window), from the last frame that carried it; null before any. */
  readonly total: number | null;
  /** The last write (batch `seq`) the list reflects, from the last frame applied; null before any. */
  readonly write_seq: number | null;
}

/** Why the server ended a subscription (`ended` frame); other strings may come from newer servers. */
export type EndedReason = "collection_dropped" | "field_removed" | "access_ended" | (string & {});

/** What the core reports for a frame. `change` is the only kind that changes a list. */
export type ProtocolEvent =
  | {
      kind: "welcome";
      session: string;
      protocol: number;
      limits: Record<string, unknown>;
      /** `"none"` also when the server did not say (servers without auth). */
      auth: WelcomeAuth;
    }
  /** The server accepted the connection's token (`auth`). */
  | ({ kind: "authed" } & AuthIdentity)
  /** The connection's token expired: send a fresh one within `grace_secs` or be closed (4401). */
  | { kind: "auth_expired"; grace_secs: number }
  | {
      kind: "error";
      code: string;
      message: string;
      sub?: string;
      /** `subscribe`: the subscription was refused and is gone; `request`: a refused request on a live one. */
      refused?: "subscribe" | "request";
    }
  | { kind: "unsubscribed"; sub: string }
  /** The server ended the subscription (`ended`): no frame of it follows, it is gone and its id is free. */
  | { kind: "ended"; sub: string; reason: EndedReason; message: string }
  | {
      kind: "resumed";
      session: string;
      replayed: string[];
      reset: string[];
      /** Entries of the resume the server refused (their subscriptions are gone). */
      failed: { sub: string; code: string; message: string }[];
    }
  | { kind: "gap"; sub: string; expected_seq: number; got_seq: number }
  | { kind: "invalid_diffs"; sub: string; seq: number; message: string }
  /**
   * The frame's window digest (`expected`) is not the digest of the list its diffs give
   * (`got`): the list is not the server's window. Nothing was applied; the list is
   * subscribed again.
   */
  | { kind: "digest_mismatch"; sub: string; seq: number; expected: string; got: string }
  | {
      kind: "change";
      sub: string;
      seq: number;
      diffs: VectorDiff[];
      items: readonly Item[];
      reset: boolean;
      /** The view's length after this frame (the frame's `total`, else the last one known); null before any. */
      total: number | null;
      /** The frame's `write_seq` (null from a server that sends none). */
      write_seq: number | null;
    }
  /**
   * A frame this client cannot read. `resubscribe` says which lists may have lost
   * data through it: `sub` (the frame named a subscription held), `all` (it named
   * none that can be trusted), or `none` (it was not about lists).
   */
  | { kind: "protocol"; message: string; resubscribe: "none" | "sub" | "all"; sub?: string };

interface Record_ {
  items: readonly Item[];
  seq: number;
  phase: SubscriptionPhase;
  total: number | null;
  writeSeq: number | null;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function isSeq(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

/**
 * The socket-free core of the client: subscriptions (their lists and last `seq`),
 * and what each server frame does to them. `OrdoClient` drives one per client and
 * tells it what it sends; the protocol vectors drive one directly.
 */
export class ProtocolState {
  /** The session of the connection, from `welcome` (then `resumed`). */
  session: string | null = null;
  private readonly subs = new Map<string, Record_>();

  /** Seeds the state: for each subscription id, its list and the last `seq` applied (0: none yet). */
  constructor(seed?: Record<string, { items: readonly Item[]; seq: number }>) {
    if (seed) {
      for (const [sub, state] of Object.entries(seed)) this.seed(sub, state.items, state.seq);
    }
  }

  /** Adds (or replaces) a subscription with a list and its last `seq`; `subscribing` when `seq` is 0. */
  seed(sub: string, items: readonly Item[], seq: number): void {
    this.subs.set(sub, { items: items.slice(), seq, phase: seq === 0 ? "subscribing" : "live", total: null, writeSeq: null });
  }

  /** The client sends `subscribe`: a new subscription with an empty list. */
  subscribe(sub: string): void {
    const record = this.subs.get(sub);
    if (record?.phase === "closing") {
      // The id is reused before the old subscription's `unsubscribed`: its last frames
      // come first and are ignored, then the new subscription starts at seq 1.
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
  restart(sub: string): void {
    const record = this.subs.get(sub);
    if (record) record.phase = "restarting";
  }

  /** The client sends `unsubscribe`: frames are ignored until `unsubscribed` removes it. */
  unsubscribe(sub: string): void {
    const record = this.subs.get(sub);
    if (record) record.phase = "closing";
  }

  /** Forgets a subscription at once (the client closed it while disconnected). */
  forget(sub: string): void {
    this.subs.delete(sub);
  }

  has(sub: string): boolean {
    return this.subs.has(sub);
  }

  get(sub: string): SubscriptionSnapshot | undefined {
    const record = this.subs.get(sub);
    return (
      record && {
        items: record.items,
        seq: record.seq,
        phase: record.phase,
        total: record.total,
        write_seq: record.writeSeq,
      }
    );
  }

  /** The ids of every subscription held (in any phase). */
  ids(): string[] {
    return [...this.subs.keys()];
  }

  /** The lists of every subscription that is not closing, by id. */
  lists(): Record<string, readonly Item[]> {
    const out: Record<string, readonly Item[]> = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.items;
    return out;
  }

  /** The last `seq` applied, for every subscription that is not closing. */
  seqs(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.seq;
    return out;
  }

  /** The last `total` known (null: none yet), for every subscription that is not closing. */
  totals(): Record<string, number | null> {
    const out: Record<string, number | null> = {};
    for (const [sub, record] of this.subs) if (record.phase !== "closing") out[sub] = record.total;
    return out;
  }

  /**
   * The connection dropped; the client is about to send `resume`. Closing subscriptions
   * are forgotten (the resume does not list them, so the server closes them), restarting
   * ones start over from `seq` 0. Returns the `last_seq` of each subscription to list.
   */
  prepareResume(): { sub: string; last_seq: number }[] {
    const out: { sub: string; last_seq: number }[] = [];
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
  prepareResubscribe(): string[] {
    const out: string[] = [];
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
  handleFrame(frame: unknown): ProtocolEvent[] {
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
        // A newer server's frame: ignored, as the protocol's versioning allows.
        return [];
    }
  }

  /**
   * The event for a frame that cannot be read (`frame` is what `JSON.parse` gave, or
   * undefined when it gave nothing): which lists it may have concerned.
   */
  unreadable(frame: unknown, message: string): Extract<ProtocolEvent, { kind: "protocol" }> {
    const sub = isObject(frame) && typeof frame.sub === "string" ? frame.sub : undefined;
    if (sub !== undefined && this.subs.has(sub)) return { kind: "protocol", message, resubscribe: "sub", sub };
    return { kind: "protocol", message, resubscribe: "all" };
  }

  private onWelcome(frame: Record<string, unknown>): ProtocolEvent[] {
    if (typeof frame.session !== "string") {
      return [{ kind: "protocol", message: "a welcome without a session", resubscribe: "none" }];
    }
    const auth = readAuth(frame.auth);
    this.session = frame.session;
    const protocol = typeof frame.protocol === "number" ? frame.protocol : 0;
    const limits = isObject(frame.limits) ? frame.limits : {};
    return [{ kind: "welcome", session: frame.session, protocol, limits, auth }];
  }

  private onAuthed(frame: Record<string, unknown>): ProtocolEvent[] {
    const identity = readIdentity(frame);
    if (identity === null) {
      return [{ kind: "protocol", message: `an authed frame without sub, role or expires_at: ${preview(frame)}`, resubscribe: "none" }];
    }
    return [{ kind: "authed", ...identity }];
  }

  private onDiffs(frame: Record<string, unknown>): ProtocolEvent[] {
    const { sub, seq, diffs } = frame;
    if (typeof sub !== "string" || !isSeq(seq) || !Array.isArray(diffs)) {
      return [this.unreadable(frame, `a diffs frame without a sub, a seq or diffs: ${preview(frame)}`)];
    }
    const record = this.subs.get(sub);
    if (!record || record.phase === "closing" || record.phase === "restarting") return [];
    if (seq !== record.seq + 1) {
      return [{ kind: "gap", sub, expected_seq: record.seq + 1, got_seq: seq }];
    }
    let items: Item[];
    try {
      items = applyDiffs(record.items, diffs as VectorDiff[]);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      return [{ kind: "invalid_diffs", sub, seq, message }];
    }
    if (frame.digest !== undefined) {
      // Items carry their version (PROTOCOL.md, "Window digest").
      const got = windowDigest(items as { id: string; version?: number }[]);
      if (frame.digest !== got) {
        return [{ kind: "digest_mismatch", sub, seq, expected: String(frame.digest), got }];
      }
    }
    record.items = items;
    record.seq = seq;
    record.phase = "live";
    // A frame without `total` means "unchanged" (PROTOCOL.md).
    if (isSeq(frame.total)) record.total = frame.total;
    record.writeSeq = isSeq(frame.write_seq) ? frame.write_seq : null;
    const reset = (diffs as unknown[]).some((diff) => isObject(diff) && "Reset" in diff);
    return [
      { kind: "change", sub, seq, diffs: diffs as VectorDiff[], items, reset, total: record.total, write_seq: record.writeSeq },
    ];
  }

  private onError(frame: Record<string, unknown>): ProtocolEvent[] {
    const code = typeof frame.code === "string" ? frame.code : "internal";
    const message = typeof frame.message === "string" ? frame.message : code;
    if (typeof frame.sub !== "string") return [{ kind: "error", code, message }];
    const sub = frame.sub;
    const record = this.subs.get(sub);
    const event: ProtocolEvent = { kind: "error", code, message, sub };
    if (!record) return [event];
    switch (record.phase) {
      case "subscribing":
        // A refused subscribe creates nothing.
        this.subs.delete(sub);
        return [{ ...event, refused: "subscribe" }];
      case "live":
        return [{ ...event, refused: "request" }];
      case "restarting":
        // The unsubscribe found nothing to close: the new subscribe's answer is next.
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

  private onUnsubscribed(frame: Record<string, unknown>): ProtocolEvent[] {
    if (typeof frame.sub !== "string") return [this.unreadable(frame, "an unsubscribed frame without a sub")];
    const sub = frame.sub;
    const record = this.subs.get(sub);
    if (record?.phase === "restarting") {
      // The old subscription is gone; the new one's first frame has seq 1.
      record.seq = 0;
      record.phase = "subscribing";
      return [];
    }
    this.subs.delete(sub);
    return [{ kind: "unsubscribed", sub }];
  }

  private onEnded(frame: Record<string, unknown>): ProtocolEvent[] {
    if (typeof frame.sub !== "string") return [this.unreadable(frame, "an ended frame without a sub")];
    const sub = frame.sub;
    const reason = typeof frame.reason === "string" ? frame.reason : "unknown";
    const message = typeof frame.message === "string" ? frame.message : reason;
    const record = this.subs.get(sub);
    if (!record) return [];
    if (record.phase === "restarting") {
      // The old subscription ended before our unsubscribe reached it: that unsubscribe
      // is answered `unknown_subscription`, then the new subscribe's answer comes.
      return [];
    }
    this.subs.delete(sub);
    return [{ kind: "ended", sub, reason, message }];
  }

  private onResumed(frame: Record<string, unknown>): ProtocolEvent[] {
    if (typeof frame.session === "string") this.session = frame.session;
    const replayed: string[] = [];
    const reset: string[] = [];
    const failed: { sub: string; code: string; message: string }[] = [];
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
}

/** A frame (or part of one) for a message, cut short. */
function preview(value: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    // Nested too deep to print, say.
    text = "(unprintable)";
  }
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

function readIdentity(value: Record<string, unknown>): AuthIdentity | null {
  const { sub, role, expires_at } = value;
  if (typeof sub !== "string" || typeof role !== "string" || typeof expires_at !== "number" || !Number.isFinite(expires_at)) {
    return null;
  }
  return { sub, role, expires_at };
}

/**
 * `welcome.auth`. Absent means `"none"` (a server without auth); a form this client
 * does not know is taken as `"required"`: a client with a token then sends it.
 */
function readAuth(value: unknown): WelcomeAuth {
  if (value === undefined || value === null || value === "none") return "none";
  if (isObject(value)) return readIdentity(value) ?? "required";
  return "required";
}

/** The `OrdoError` a gap, an unappliable frame or a digest mismatch is reported as. */
export function lossError(event: Extract<ProtocolEvent, { kind: "gap" | "invalid_diffs" | "digest_mismatch" }>): OrdoError {
  if (event.kind === "digest_mismatch") {
    return new OrdoError(
      "digest_mismatch",
      `subscription \`${event.sub}\`: after seq ${event.seq} the list's digest is ${event.got}, the server's ${event.expected}; re-subscribing`,
      event.sub,
    );
  }
  if (event.kind === "gap") {
    return new OrdoError(
      "gap",
      `subscription \`${event.sub}\` expected seq ${event.expected_seq} but got ${event.got_seq}; re-subscribing`,
      event.sub,
    );
  }
  return new OrdoError(
    "invalid_diffs",
    `subscription \`${event.sub}\`: the diffs of seq ${event.seq} do not apply (${event.message}); re-subscribing`,
    event.sub,
  );
}
