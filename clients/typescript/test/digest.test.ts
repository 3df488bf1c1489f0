// The window digest against the test vectors of docs/PROTOCOL.md ("Window digest"),
// and against a BigInt reference over the laid-out bytes.

import { describe, expect, it } from "vitest";

import { windowDigest } from "../src/index.js";

function reference(rows: { id: string; version: bigint }[]): string {
  const bytes: number[] = [];
  const le = (value: bigint, n: number) => {
    for (let i = 0; i < n; i++) bytes.push(Number((value >> BigInt(8 * i)) & 0xffn));
  };
  rows.forEach((row, position) => {
    const id = new TextEncoder().encode(row.id);
    le(BigInt(position), 4);
    le(BigInt(id.length), 4);
    bytes.push(...id);
    le(row.version, 8);
  });
  let hash = 0xcbf29ce484222325n;
  for (const byte of bytes) hash = ((hash ^ BigInt(byte)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return hash.toString(16).padStart(16, "0");
}

describe("window digest", () => {
  it("matches the protocol's test vectors", () => {
    expect(windowDigest([])).toBe("cbf29ce484222325");
    expect(windowDigest([{ id: "!a:example.org", version: 41 }])).toBe("fb4342cbbbdad2a8");
    expect(windowDigest([{ id: "a", version: 1 }, { id: "b", version: 2 }])).toBe("716f5483434e8e56");
    expect(windowDigest([{ id: "b", version: 2 }, { id: "a", version: 1 }])).toBe("8c00f122685fe562");
    expect(windowDigest([{ id: "Chloé", version: 0xffffffffffffffffn }, { id: "z", version: 0 }])).toBe("f02c69445f483225");
  });

  it("matches a BigInt reference on random rows", () => {
    let seed = 7;
    const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
    for (let round = 0; round < 200; round++) {
      const rows = Array.from({ length: next() % 12 }, () => ({
        id: Array.from({ length: 1 + (next() % 20) }, () => String.fromCodePoint(0x61 + (next() % 26), 0xe9)[next() % 2]).join(""),
        version: next() * 2 ** (next() % 21) + (next() % 1000),
      }));
      const expected = reference(rows.map((row) => ({ id: row.id, version: BigInt(row.version) })));
      expect(windowDigest(rows)).toBe(expected);
    }
  });
});
