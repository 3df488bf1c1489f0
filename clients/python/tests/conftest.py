from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ordo_server import OrdoServer
from scripted_server import ScriptedServer
from websockets.asyncio.server import serve


@pytest.fixture
def ordo(tmp_path: Path) -> Iterator[OrdoServer]:
    """A fresh `ordo serve` with its own data directory."""
    server = OrdoServer(tmp_path / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    """A scripted WebSocket server on loopback (`tests/scripted_server.py`)."""
    server = ScriptedServer()
    async with serve(server.handler, "127.0.0.1", 0) as ws_server:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        server.url = f"ws://127.0.0.1:{port}/v1/ws"
        yield server
