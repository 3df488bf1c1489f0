"""A scripted WebSocket server on loopback for the client tests: each
connection gets a `welcome`, then the test plays the server's part."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from websockets.asyncio.server import ServerConnection

from ordo_client import LiveList, OrdoClient

TIMEOUT = 10.0


def item(n: int) -> dict[str, Any]:
    return {"id": f"!{n}", "fields": {"recency": n}, "payload": None}


def fake_jwt(sub: str = "u42", ttl: float = 3600.0, iat: float | None = None, **claims: Any) -> str:
    """A JWT-shaped token (the client reads `exp` and `iat`, never the signature)."""

    def part(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = time.time() if iat is None else iat
    payload = {"sub": sub, "role": "reader", "iat": int(now), "exp": now + ttl, **claims}
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(payload)}.c2lnbmF0dXJl"


class Conn:
    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        message = await asyncio.wait_for(self.ws.recv(), timeout)
        frame = json.loads(message)
        assert isinstance(frame, dict)
        return frame

    async def nothing(self, seconds: float = 0.3) -> None:
        """Asserts that the client sends nothing for `seconds`."""
        try:
            message = await asyncio.wait_for(self.ws.recv(), seconds)
        except asyncio.TimeoutError:
            return
        raise AssertionError(f"the client sent {message!r}")

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame))

    async def diffs(self, sub: str, seq: int, *diffs: dict[str, Any]) -> None:
        await self.send({"type": "diffs", "sub": sub, "seq": seq, "diffs": list(diffs)})

    async def authed(self, sub: str = "u42", expires_at: float | None = None) -> None:
        await self.send({"type": "authed", "sub": sub, "role": "reader",
                         "expires_at": int(expires_at if expires_at is not None else time.time() + 3600)})  # fmt: skip


class ScriptedServer:
    """Each connection gets a welcome (session `s<n>`; with `auth` set, the
    welcome carries it), then is handed to the test."""

    def __init__(self) -> None:
        self.connections: asyncio.Queue[Conn] = asyncio.Queue()
        self.n = 0
        self.url = ""
        self.auth: Any = None

    async def handler(self, ws: ServerConnection) -> None:
        self.n += 1
        conn = Conn(ws)
        welcome: dict[str, Any] = {"type": "welcome", "protocol": 1, "session": f"s{self.n}",
                                   "limits": {"max_window_limit": 1000, "ws_messages_per_second": 100,
                                              "ws_message_burst": 200}}  # fmt: skip
        if self.auth is not None:
            welcome["auth"] = self.auth
        await conn.send(welcome)
        await self.connections.put(conn)
        await ws.wait_closed()

    async def next_connection(self) -> Conn:
        return await asyncio.wait_for(self.connections.get(), TIMEOUT)


async def subscribed_list(
    client: OrdoClient, conn: Conn, sub: str, items: list[dict[str, Any]], **options: Any
) -> LiveList:
    """Subscribes `sub` (limit 3) and answers with a Reset of `items`."""
    task = asyncio.create_task(client.subscribe("rooms", limit=3, sub_id=sub, **options))
    op = await conn.recv()
    assert op["op"] == "subscribe" and op["sub"] == sub, op
    await conn.diffs(sub, 1, {"Reset": {"values": items}})
    return await asyncio.wait_for(task, TIMEOUT)
