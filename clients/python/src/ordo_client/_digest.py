"""The window digest (``docs/PROTOCOL.md``, "Window digest"): 64-bit FNV-1a
over each row of a list, in order, as its position (u32 LE), its id's UTF-8
length (u32 LE) and bytes, and its version (u64 LE), written as 16 lowercase
hex digits. A client computes it after applying a frame and compares it with
the frame's ``digest``."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

_OFFSET_BASIS = 0xCBF29CE484222325
_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


def window_digest(items: Iterable[Mapping[str, Any]]) -> str:
    """The digest of ``items`` (each with an ``id`` and a ``version``; a missing
    version, from a server older than the digest, counts as 0)."""
    state = _OFFSET_BASIS
    for position, item in enumerate(items):
        id_bytes = str(item["id"]).encode("utf-8")
        version = item.get("version")
        version = version if isinstance(version, int) and not isinstance(version, bool) else 0
        row = struct.pack("<II", position, len(id_bytes)) + id_bytes + struct.pack("<Q", version & _MASK)
        for byte in row:
            state = ((state ^ byte) * _PRIME) & _MASK
    return f"{state:016x}"
