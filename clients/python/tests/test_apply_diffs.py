"""apply_diffs: every eyeball-im diff kind, and diffs that do not fit."""

from __future__ import annotations

from typing import Any

import pytest

from ordo_client import DIFF_KINDS, DiffError, OrdoError, apply_diffs


def item(n: int) -> dict[str, Any]:
    return {"id": f"!{n}", "fields": {"name": f"n{n}"}, "payload": None}


A, B, C, D, E = (item(n) for n in range(5))


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        ({"Append": {"values": [D, E]}}, [A, B, C, D, E]),
        ({"Append": {"values": []}}, [A, B, C]),
        ({"Clear": {}}, []),
        ({"PushFront": {"value": D}}, [D, A, B, C]),
        ({"PushBack": {"value": D}}, [A, B, C, D]),
        ({"PopFront": {}}, [B, C]),
        ({"PopBack": {}}, [A, B]),
        ({"Insert": {"index": 0, "value": D}}, [D, A, B, C]),
        ({"Insert": {"index": 1, "value": D}}, [A, D, B, C]),
        ({"Insert": {"index": 3, "value": D}}, [A, B, C, D]),
        ({"Set": {"index": 0, "value": D}}, [D, B, C]),
        ({"Set": {"index": 2, "value": D}}, [A, B, D]),
        ({"Remove": {"index": 0}}, [B, C]),
        ({"Remove": {"index": 1}}, [A, C]),
        ({"Remove": {"index": 2}}, [A, B]),
        ({"Truncate": {"length": 0}}, []),
        ({"Truncate": {"length": 1}}, [A]),
        ({"Truncate": {"length": 3}}, [A, B, C]),
        ({"Reset": {"values": [E, D]}}, [E, D]),
        ({"Reset": {"values": []}}, []),
    ],
)
def test_each_kind(diff: dict[str, Any], expected: list[Any]) -> None:
    items = [A, B, C]
    assert apply_diffs(items, [diff]) == expected
    assert items == [A, B, C], "the input list is not modified"


def test_every_kind_is_covered() -> None:
    assert set(DIFF_KINDS) == {
        "Append", "Clear", "PushFront", "PushBack", "PopFront", "PopBack",
        "Insert", "Set", "Remove", "Truncate", "Reset",
    }  # fmt: skip


def test_diffs_apply_in_order() -> None:
    diffs = [
        {"PushBack": {"value": D}},  # A B C D
        {"PushFront": {"value": E}},  # E A B C D
        {"Insert": {"index": 2, "value": item(5)}},  # E A 5 B C D
        {"Set": {"index": 0, "value": item(6)}},  # 6 A 5 B C D
        {"Remove": {"index": 1}},  # 6 5 B C D
        {"PopFront": {}},  # 5 B C D
        {"PopBack": {}},  # 5 B C
        {"Append": {"values": [item(7), item(8)]}},  # 5 B C 7 8
        {"Truncate": {"length": 3}},  # 5 B C
    ]
    assert apply_diffs([A, B, C], diffs) == [item(5), B, C]


def test_empty_diffs() -> None:
    assert apply_diffs([A], []) == [A]


@pytest.mark.parametrize(
    ("items", "diff"),
    [
        ([], {"PopFront": {}}),
        ([], {"PopBack": {}}),
        ([A, B, C], {"Insert": {"index": 4, "value": D}}),
        ([A, B, C], {"Set": {"index": 3, "value": D}}),
        ([], {"Set": {"index": 0, "value": D}}),
        ([A, B, C], {"Remove": {"index": 3}}),
        ([], {"Remove": {"index": 0}}),
        ([A, B, C], {"Truncate": {"length": 4}}),
        ([A], {"Insert": {"index": -1, "value": D}}),
        ([A], {"Remove": {"index": "0"}}),
        ([A], {"Remove": {"index": True}}),
        ([A], {"Remove": {}}),
        ([A], {"Insert": {"index": 0}}),
        ([A], {"Append": {"values": None}}),
        ([A], {"Reset": {}}),
        ([A], {"Frobnicate": {}}),
        ([A], {"Clear": {}, "PopBack": {}}),
        ([A], {}),
        ([A], "Clear"),
        ([A], {"Clear": None}),
    ],
)
def test_what_does_not_fit_raises(items: list[Any], diff: Any) -> None:
    before = list(items)
    with pytest.raises(DiffError) as raised:
        apply_diffs(items, [diff])
    assert isinstance(raised.value, OrdoError)
    assert raised.value.code == "invalid_diffs"
    assert items == before


def test_a_later_bad_diff_leaves_the_input_untouched() -> None:
    items = [A, B]
    with pytest.raises(DiffError):
        apply_diffs(items, [{"PushBack": {"value": C}}, {"Remove": {"index": 9}}])
    assert items == [A, B]
