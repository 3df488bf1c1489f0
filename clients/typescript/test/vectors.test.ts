// Runs the language-neutral protocol corpus (protocol/vectors/*.json, format in
// protocol/README.md) against ProtocolState: seed the subscriptions, feed each
// frame, compare lists, seqs and the event reported.

import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { describe, expect, it } from "vitest";

import { ProtocolState, type ProtocolEvent, windowDigest } from "../src/index.js";
import type { Item } from "../src/types.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const VECTORS_DIR = process.env.ORDO_VECTORS_DIR ?? resolve(here, "../../../protocol/vectors");

interface VectorStep {
  frame: unknown;
  expect: {
    lists: Record<string, Item[]>;
    seqs: Record<string, number>;
    totals?: Record<string, number | null>;
    digests?: Record<string, string>;
    event?: Record<string, unknown>;
  };
}

interface VectorCase {
  protocol: number;
  name: string;
  description?: string;
  synthetic?: boolean;
  subscriptions: Record<string, { items: Item[]; seq: number }>;
  steps: VectorStep[];
}

function listVectors(): string[] {
  try {
    return readdirSync(VECTORS_DIR)
      .filter((name) => name.endsWith(".json"))
      .sort();
  } catch {
    return [];
  }
}

/** An event as the corpus spells it, or null for events it does not name (plain diffs). */
function asVectorEvent(event: ProtocolEvent): Record<string, unknown> | null {
  switch (event.kind) {
    case "welcome":
      return { kind: "welcome", session: event.session };
    case "error":
      return event.sub === undefined
        ? { kind: "error", code: event.code }
        : { kind: "error", code: event.code, sub: event.sub };
    case "unsubscribed":
      return { kind: "unsubscribed", sub: event.sub };
    case "ended":
      return { kind: "ended", sub: event.sub, reason: event.reason };
    case "resumed":
      return { kind: "resumed", replayed: [...event.replayed].sort(), reset: [...event.reset].sort() };
    case "gap":
      return { kind: "gap", sub: event.sub, expected_seq: event.expected_seq, got_seq: event.got_seq };
    case "change":
      return event.reset ? { kind: "reset", sub: event.sub } : null;
    case "invalid_diffs":
      return { kind: "invalid_diffs", sub: event.sub };
    case "digest_mismatch":
      return { kind: "digest_mismatch", sub: event.sub, seq: event.seq };
    case "protocol":
      return { kind: "protocol", message: event.message };
    case "authed":
    case "auth_expired":
      // Not named by the corpus.
      return null;
  }
}

function normalizeExpected(event: Record<string, unknown>): Record<string, unknown> {
  if (event.kind === "resumed") {
    return {
      ...event,
      replayed: [...((event.replayed as string[]) ?? [])].sort(),
      reset: [...((event.reset as string[]) ?? [])].sort(),
    };
  }
  return event;
}

const files = listVectors();

describe("protocol vectors", () => {
  it(`the corpus in ${VECTORS_DIR} is not empty`, () => {
    expect(files.length, `no *.json vectors in ${VECTORS_DIR}`).toBeGreaterThan(0);
    // Cases the corpus must hold for this runner to mean something.
    const names = new Set(files.map((file) => file.replace(/\.json$/, "")));
    const required = [
      "all_diff_kinds",
      "seq_gaps",
      "digest_mismatch",
      "resume_replay",
      "resume_reset",
      "ended",
      "reference_views",
      "unread_views",
    ];
    for (const name of required) {
      expect(names.has(name), `the corpus has no ${name}.json`).toBe(true);
    }
  });

  for (const file of files) {
    it(file, () => {
      const vector = JSON.parse(readFileSync(join(VECTORS_DIR, file), "utf8")) as VectorCase;
      expect(vector.protocol, `${file}: protocol version`).toBe(1);
      expect(Array.isArray(vector.steps) && vector.steps.length > 0, `${file}: has steps`).toBe(true);
      const state = new ProtocolState(vector.subscriptions);
      vector.steps.forEach((step, index) => {
        const where = `${file} (${vector.name}), step ${index}`;
        const events = state.handleFrame(step.frame);
        const reported = events.map(asVectorEvent).filter((event) => event !== null);
        const expected = step.expect.event ? [normalizeExpected(step.expect.event)] : [];
        expect(reported, `${where}: event`).toStrictEqual(expected);
        expect(state.lists(), `${where}: lists`).toStrictEqual(step.expect.lists);
        expect(state.seqs(), `${where}: seqs`).toStrictEqual(step.expect.seqs);
        if (step.expect.digests !== undefined) {
          const digests = Object.fromEntries(Object.entries(state.lists()).map(([sub, items]) => [sub, windowDigest(items)]));
          expect(digests, `${where}: digests`).toStrictEqual(step.expect.digests);
        }
        if (step.expect.totals !== undefined) {
          expect(state.totals(), `${where}: totals`).toStrictEqual(step.expect.totals);
        }
      });
    });
  }
});
