"""The window digest against the test vectors of ``docs/PROTOCOL.md`` ("Window digest")."""

from __future__ import annotations

from ordo_client import window_digest


def rows(*pairs: tuple[str, int]) -> list[dict[str, object]]:
    return [{"id": id_, "version": version, "fields": {}} for id_, version in pairs]


def test_the_protocol_test_vectors() -> None:
    assert window_digest([]) == "cbf29ce484222325"
    assert window_digest(rows(("!a:example.org", 41))) == "fb4342cbbbdad2a8"
    assert window_digest(rows(("a", 1), ("b", 2))) == "716f5483434e8e56"
    assert window_digest(rows(("b", 2), ("a", 1))) == "8c00f122685fe562"
    assert window_digest(rows(("Chloé", 2**64 - 1), ("z", 0))) == "f02c69445f483225"
