"""Applying eyeball-im ``VectorDiff`` JSON (as Ordo sends it) to a Python list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._errors import DiffError

Item = dict[str, Any]
Diff = Mapping[str, Any]

DIFF_KINDS = (
    "Append",
    "Clear",
    "PushFront",
    "PushBack",
    "PopFront",
    "PopBack",
    "Insert",
    "Set",
    "Remove",
    "Truncate",
    "Reset",
)


def _index(body: Mapping[str, Any], key: str, kind: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DiffError(f"{kind}: `{key}` must be a non-negative integer, not {value!r}")
    return value


def _values(body: Mapping[str, Any], kind: str) -> list[Any]:
    values = body.get("values")
    if not isinstance(values, list):
        raise DiffError(f"{kind}: `values` must be a list, not {type(values).__name__}")
    return values


def _value(body: Mapping[str, Any], kind: str) -> Any:
    if "value" not in body:
        raise DiffError(f"{kind}: missing `value`")
    return body["value"]


def apply_diff_in_place(items: list[Any], diff: Diff) -> None:
    """Applies one diff to ``items`` (mutating it). Raises :class:`DiffError`
    when the diff does not fit the list; ``items`` is then unchanged."""
    if not isinstance(diff, Mapping) or len(diff) != 1:
        raise DiffError(f"a diff is an object with one key (its kind), not {diff!r}")
    ((kind, body),) = diff.items()
    if not isinstance(body, Mapping):
        raise DiffError(f"{kind}: the body must be an object, not {body!r}")
    n = len(items)
    if kind == "Append":
        items.extend(_values(body, kind))
    elif kind == "Clear":
        items.clear()
    elif kind == "PushFront":
        items.insert(0, _value(body, kind))
    elif kind == "PushBack":
        items.append(_value(body, kind))
    elif kind == "PopFront":
        if n == 0:
            raise DiffError("PopFront on an empty list")
        del items[0]
    elif kind == "PopBack":
        if n == 0:
            raise DiffError("PopBack on an empty list")
        del items[-1]
    elif kind == "Insert":
        index = _index(body, "index", kind)
        value = _value(body, kind)
        if index > n:
            raise DiffError(f"Insert at index {index} in a list of {n}")
        items.insert(index, value)
    elif kind == "Set":
        index = _index(body, "index", kind)
        value = _value(body, kind)
        if index >= n:
            raise DiffError(f"Set at index {index} in a list of {n}")
        items[index] = value
    elif kind == "Remove":
        index = _index(body, "index", kind)
        if index >= n:
            raise DiffError(f"Remove at index {index} in a list of {n}")
        del items[index]
    elif kind == "Truncate":
        length = _index(body, "length", kind)
        if length > n:
            raise DiffError(f"Truncate to length {length} a list of {n}")
        del items[length:]
    elif kind == "Reset":
        values = _values(body, kind)
        items[:] = values
    else:
        raise DiffError(f"unknown diff kind {kind!r}")


def apply_diffs(items: Sequence[Any], diffs: Iterable[Diff]) -> list[Any]:
    """Returns a new list: ``items`` with ``diffs`` applied in order.

    ``items`` is not modified. Raises :class:`DiffError` (an
    :class:`~ordo_client.OrdoError` with code ``invalid_diffs``) if a diff
    does not fit: an index out of range, a pop from an empty list, a
    truncation longer than the list, or an unknown diff kind.
    """
    out = list(items)
    for diff in diffs:
        apply_diff_in_place(out, diff)
    return out


def has_reset(diffs: Iterable[Diff]) -> bool:
    """Whether any of the diffs is a ``Reset``."""
    return any(isinstance(diff, Mapping) and "Reset" in diff for diff in diffs)
