"""The shared protocol corpus (``protocol/vectors/*.json``, format in
``protocol/README.md``), run through the socket-free core."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ordo_client import ProtocolState, window_digest

# ORDO_VECTORS_DIR: another corpus (to check the runner itself, e.g. on an empty directory).
VECTORS_DIR = Path(os.environ.get("ORDO_VECTORS_DIR") or Path(__file__).resolve().parents[3] / "protocol" / "vectors")
VECTORS = sorted(VECTORS_DIR.glob("*.json"))


def test_the_corpus_is_there() -> None:
    # Without this, an empty directory would make the parametrized test below
    # pass vacuously (pytest skips an empty parameter set).
    assert VECTORS, f"no protocol vectors in {VECTORS_DIR}"
    names = {path.stem for path in VECTORS}
    # Cases the corpus must hold for the runner to mean something.
    required = {"all_diff_kinds", "seq_gaps", "digest_mismatch", "resume_replay", "resume_reset", "ended", "reference_views", "unread_views"}
    assert required <= names, names


@pytest.mark.parametrize("path", VECTORS, ids=[path.stem for path in VECTORS])
def test_vector(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert case["protocol"] == 1
    assert case["steps"], f"{path.name}: no steps"
    state = ProtocolState()
    for sub, seeded in case["subscriptions"].items():
        state.seed(sub, seeded["items"], seeded["seq"])
    for index, step in enumerate(case["steps"]):
        where = f"{path.name} step {index} ({json.dumps(step['frame'])[:160]})"
        events = state.handle_frame(step["frame"])
        reported = [event.to_vector() for event in events if event.to_vector() is not None]
        expected_events = [step["expect"]["event"]] if "event" in step["expect"] else []
        assert reported == expected_events, f"{where}: events"
        assert state.seqs() == step["expect"]["seqs"], f"{where}: seqs"
        if "totals" in step["expect"]:
            assert state.totals() == step["expect"]["totals"], f"{where}: totals"
        lists = state.lists()
        if "digests" in step["expect"]:
            digests = {sub: window_digest(items) for sub, items in lists.items()}
            assert digests == step["expect"]["digests"], f"{where}: digests"
        assert sorted(lists) == sorted(step["expect"]["lists"]), f"{where}: subscriptions"
        for sub, items in step["expect"]["lists"].items():
            assert lists[sub] == items, f"{where}: list {sub!r}"
