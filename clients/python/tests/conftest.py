from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ordo_server import OrdoServer


@pytest.fixture
def ordo(tmp_path: Path) -> Iterator[OrdoServer]:
    """A fresh `ordo serve` with its own data directory."""
    server = OrdoServer(tmp_path / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
