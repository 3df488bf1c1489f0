// The window digest (docs/PROTOCOL.md, "Window digest"): 64-bit FNV-1a over each
// row of a list, in order, as its position (u32 LE), its id's UTF-8 length (u32 LE)
// and bytes, and its version (u64 LE), written as 16 lowercase hex digits. The
// 64-bit state is kept as two 32-bit halves so that no BigInt is needed per byte.

/** What the digest reads of a row: its id and version (a number, or a bigint past 2^53). */
export interface DigestRow {
  readonly id: string;
  readonly version?: number | bigint;
}

const PRIME_LOW = 0x1b3; // FNV's 64-bit prime is 2^40 + 0x1b3.
const TWO_32 = 0x1_0000_0000;
const encoder = new TextEncoder();

class Fnv64 {
  // The offset basis 0xcbf29ce484222325.
  private high = 0xcbf29ce4;
  private low = 0x84222325;

  byte(value: number): void {
    const low = (this.low ^ value) >>> 0;
    // (high·2^32 + low) · (2^40 + 0x1b3) mod 2^64: low·0x1b3 is below 2^41 (exact in a
    // double); 2^40 moves `low` 8 bits into the high word.
    const lowProduct = low * PRIME_LOW;
    const carry = Math.floor(lowProduct / TWO_32);
    this.low = lowProduct >>> 0;
    this.high = (Math.imul(this.high, PRIME_LOW) + carry + ((low << 8) >>> 0)) >>> 0;
  }

  u32(value: number): void {
    for (let shift = 0; shift < 32; shift += 8) this.byte((value >>> shift) & 0xff);
  }

  hex(): string {
    return this.high.toString(16).padStart(8, "0") + this.low.toString(16).padStart(8, "0");
  }
}

/** The version as its low and high 32-bit halves. */
function halves(version: number | bigint): [number, number] {
  if (typeof version === "bigint") {
    return [Number(version & 0xffffffffn), Number((version >> 32n) & 0xffffffffn)];
  }
  return [version % TWO_32 >>> 0, Math.floor(version / TWO_32) >>> 0];
}

/** The digest of `rows`, in order, as 16 lowercase hex digits (a row without a version counts as 0). */
export function windowDigest(rows: readonly DigestRow[]): string {
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
