import { OrdoError } from "./errors.js";
import type { Item, VectorDiff } from "./types.js";

function bad(message: string): OrdoError {
  return new OrdoError("invalid_diffs", message);
}

function checkIndex(kind: string, index: unknown, bound: number): number {
  if (typeof index !== "number" || !Number.isInteger(index) || index < 0 || index > bound) {
    throw bad(`${kind}: index ${String(index)} is out of range for a list of ${kind === "Insert" ? bound : bound + 1} items`);
  }
  return index;
}

/** An item must be an object with a string `id` and an object `fields`. */
function checkItem(kind: string, value: unknown): Item {
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw bad(`${kind}: an item is not an object`);
  const { id, fields } = value as Record<string, unknown>;
  if (typeof id !== "string") throw bad(`${kind}: an item without a string \`id\``);
  if (fields === null || typeof fields !== "object" || Array.isArray(fields)) {
    throw bad(`${kind}: item \`${id}\` has no \`fields\` object`);
  }
  return value as Item;
}

function checkItems(kind: string, values: unknown): Item[] {
  if (!Array.isArray(values)) throw bad(`${kind}: \`values\` is not an array`);
  for (const value of values) checkItem(kind, value);
  return values as Item[];
}

/**
 * Applies diffs in order, the way `eyeball_im::VectorDiff::apply` does, and returns
 * the result as a new array; `items` itself is not changed.
 *
 * Throws an `OrdoError` with code `invalid_diffs` when a diff does not fit the list
 * (an index out of range, a pop from an empty list, a truncate past the end), is
 * not one of the eleven kinds, or carries an item that is not `{ id, fields, ... }`.
 * The diffs are then not applied at all.
 */
export function applyDiffs(items: readonly Item[], diffs: readonly VectorDiff[]): Item[] {
  const out = items.slice();
  for (const diff of diffs) {
    if (diff === null || typeof diff !== "object") throw bad(`a diff is not an object: ${JSON.stringify(diff)}`);
    const keys = Object.keys(diff);
    if (keys.length !== 1) throw bad(`a diff has ${keys.length} keys, not 1: ${JSON.stringify(diff)}`);
    const kind = keys[0]!;
    const body = (diff as Record<string, unknown>)[kind] as Record<string, unknown> | null;
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
