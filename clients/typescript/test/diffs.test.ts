import { describe, expect, it } from "vitest";

import { applyDiffs, OrdoError, type Item, type VectorDiff } from "../src/index.js";

const item = (id: string, n = 0): Item => ({ id, fields: { n }, payload: null });
const ids = (items: readonly Item[]) => items.map((entry) => entry.id);
const abc = () => [item("a"), item("b"), item("c")];

function expectInvalid(items: Item[], diffs: VectorDiff[]) {
  const before = JSON.stringify(items);
  let thrown: unknown;
  try {
    applyDiffs(items, diffs);
  } catch (error) {
    thrown = error;
  }
  expect(thrown).toBeInstanceOf(OrdoError);
  expect((thrown as OrdoError).code).toBe("invalid_diffs");
  // The input is untouched, whatever happened.
  expect(JSON.stringify(items)).toBe(before);
}

describe("applyDiffs", () => {
  it("Append pushes the values at the end", () => {
    expect(ids(applyDiffs(abc(), [{ Append: { values: [item("d"), item("e")] } }]))).toEqual(["a", "b", "c", "d", "e"]);
    expect(ids(applyDiffs([], [{ Append: { values: [] } }]))).toEqual([]);
  });

  it("Clear empties the list", () => {
    expect(applyDiffs(abc(), [{ Clear: {} }])).toEqual([]);
    expect(applyDiffs([], [{ Clear: {} }])).toEqual([]);
  });

  it("PushFront inserts at 0, PushBack at the end", () => {
    expect(ids(applyDiffs(abc(), [{ PushFront: { value: item("z") } }]))).toEqual(["z", "a", "b", "c"]);
    expect(ids(applyDiffs(abc(), [{ PushBack: { value: item("z") } }]))).toEqual(["a", "b", "c", "z"]);
    expect(ids(applyDiffs([], [{ PushFront: { value: item("z") } }]))).toEqual(["z"]);
  });

  it("PopFront and PopBack remove the ends", () => {
    expect(ids(applyDiffs(abc(), [{ PopFront: {} }]))).toEqual(["b", "c"]);
    expect(ids(applyDiffs(abc(), [{ PopBack: {} }]))).toEqual(["a", "b"]);
  });

  it("PopFront and PopBack on an empty list raise", () => {
    expectInvalid([], [{ PopFront: {} }]);
    expectInvalid([], [{ PopBack: {} }]);
  });

  it("Insert shifts the rest; index == length appends", () => {
    expect(ids(applyDiffs(abc(), [{ Insert: { index: 1, value: item("x") } }]))).toEqual(["a", "x", "b", "c"]);
    expect(ids(applyDiffs(abc(), [{ Insert: { index: 0, value: item("x") } }]))).toEqual(["x", "a", "b", "c"]);
    expect(ids(applyDiffs(abc(), [{ Insert: { index: 3, value: item("x") } }]))).toEqual(["a", "b", "c", "x"]);
  });

  it("Insert past the end raises", () => {
    expectInvalid(abc(), [{ Insert: { index: 4, value: item("x") } }]);
    expectInvalid(abc(), [{ Insert: { index: -1, value: item("x") } }]);
    expectInvalid(abc(), [{ Insert: { index: 1.5, value: item("x") } }]);
  });

  it("Set replaces in place", () => {
    const out = applyDiffs(abc(), [{ Set: { index: 2, value: item("c", 7) } }]);
    expect(out[2]).toEqual(item("c", 7));
    expect(ids(out)).toEqual(["a", "b", "c"]);
  });

  it("Set out of range raises", () => {
    expectInvalid(abc(), [{ Set: { index: 3, value: item("x") } }]);
    expectInvalid([], [{ Set: { index: 0, value: item("x") } }]);
  });

  it("Remove shifts the rest", () => {
    expect(ids(applyDiffs(abc(), [{ Remove: { index: 0 } }]))).toEqual(["b", "c"]);
    expect(ids(applyDiffs(abc(), [{ Remove: { index: 1 } }]))).toEqual(["a", "c"]);
    expect(ids(applyDiffs(abc(), [{ Remove: { index: 2 } }]))).toEqual(["a", "b"]);
  });

  it("Remove out of range raises", () => {
    expectInvalid(abc(), [{ Remove: { index: 3 } }]);
    expectInvalid([], [{ Remove: { index: 0 } }]);
  });

  it("Truncate keeps the first n", () => {
    expect(ids(applyDiffs(abc(), [{ Truncate: { length: 1 } }]))).toEqual(["a"]);
    expect(ids(applyDiffs(abc(), [{ Truncate: { length: 3 } }]))).toEqual(["a", "b", "c"]);
    expect(ids(applyDiffs(abc(), [{ Truncate: { length: 0 } }]))).toEqual([]);
  });

  it("Truncate past the end raises", () => {
    expectInvalid(abc(), [{ Truncate: { length: 4 } }]);
  });

  it("Reset replaces the whole list", () => {
    expect(ids(applyDiffs(abc(), [{ Reset: { values: [item("q")] } }]))).toEqual(["q"]);
    expect(ids(applyDiffs(abc(), [{ Reset: { values: [] } }]))).toEqual([]);
  });

  it("applies a sequence in order and returns a new array", () => {
    const input = abc();
    const out = applyDiffs(input, [
      { Remove: { index: 1 } },
      { PushFront: { value: item("z") } },
      { Insert: { index: 3, value: item("y") } },
      { Set: { index: 0, value: item("w") } },
      { Truncate: { length: 3 } },
      { Append: { values: [item("v")] } },
      { PopFront: {} },
      { PushBack: { value: item("u") } },
      { PopBack: {} },
    ]);
    expect(ids(out)).toEqual(["a", "c", "v"]);
    expect(out).not.toBe(input);
    expect(ids(input)).toEqual(["a", "b", "c"]);
    expect(applyDiffs(input, [])).not.toBe(input);
  });

  it("a failing diff late in a frame leaves the input untouched", () => {
    expectInvalid(abc(), [{ Remove: { index: 0 } }, { Remove: { index: 5 } }]);
  });

  it("an unknown or malformed diff raises", () => {
    expectInvalid(abc(), [{ Move: { from: 0, to: 1 } } as unknown as VectorDiff]);
    expectInvalid(abc(), [{ Append: { values: [] }, Clear: {} } as unknown as VectorDiff]);
    expectInvalid(abc(), [null as unknown as VectorDiff]);
    expectInvalid(abc(), [{ Append: { values: "x" } } as unknown as VectorDiff]);
  });
});
