"""Authentication against the scripted server (`docs/PROTOCOL.md`, auth): the
`auth` handshake after `welcome`, refresh before expiry and on `auth_expired`,
reconnection with a fresh token after close code 4401."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from scripted_server import TIMEOUT, ScriptedServer, fake_jwt, item, subscribed_list

from ordo_client import OrdoClient, OrdoError
from ordo_client._client import refresh_delay, token_times


class Provider:
    """A token provider (async, or plain with `sync=True`) that counts its calls;
    the n-th token carries `n` in its `jti` claim, and lives `ttl` seconds."""

    def __init__(self, ttl: float = 3600.0, sync: bool = False) -> None:
        self.ttl = ttl
        self.sync = sync
        self.tokens: list[str] = []

    def make(self) -> str:
        token = fake_jwt(ttl=self.ttl, jti=str(len(self.tokens) + 1))
        self.tokens.append(token)
        return token

    def __call__(self) -> Any:
        if self.sync:
            return self.make()

        async def fetch() -> str:
            await asyncio.sleep(0)
            return self.make()

        return fetch()


async def connected(scripted: ScriptedServer, client: OrdoClient, token: str | Provider) -> Any:
    """Runs `connect()` and plays the server's side of the `auth` handshake
    (`token`: the one expected, or the provider's latest)."""
    connecting = asyncio.create_task(client.connect())
    conn = await scripted.next_connection()
    op = await conn.recv()
    assert op == {"op": "auth", "token": token if isinstance(token, str) else token.tokens[-1]}
    await conn.nothing(0.2)  # nothing else before `authed`
    assert not connecting.done(), "connect() waits for `authed`"
    await conn.authed()
    await asyncio.wait_for(connecting, TIMEOUT)
    return conn


def test_token_times_and_refresh_delay() -> None:
    now = 1_700_000_000.0
    token = fake_jwt(ttl=600, iat=now)
    assert token_times(token) == (now + 600, now)
    # exp - min(60 s, lifetime / 5): 600 s lifetime → 60 s before; 100 s → 20 s before.
    assert refresh_delay(token, None, now) == pytest.approx(540)
    assert refresh_delay(fake_jwt(ttl=100, iat=now), None, now + 50) == pytest.approx(30)
    # Not a JWT: the `authed` frame's expires_at; nothing at all: no refresh.
    assert token_times("opaque") == (None, None)
    assert refresh_delay("opaque", now + 100, now) == pytest.approx(80)
    assert refresh_delay("opaque", None, now) is None
    assert token_times("a.!!!.c") == (None, None)
    # Already due: not sooner than a second from now (no busy loop).
    assert refresh_delay(fake_jwt(ttl=-5, iat=now - 100), None, now) == 1.0


def test_token_and_provider_are_exclusive() -> None:
    with pytest.raises(ValueError):
        OrdoClient("ws://127.0.0.1:1/v1/ws", token="a", token_provider=lambda: "b")


async def test_auth_handshake_before_any_op(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    token = fake_jwt()
    client = OrdoClient(scripted.url, token=token)
    conn = await connected(scripted, client, token)
    try:
        assert client.identity is not None and client.identity.sub == "u42" and client.identity.role == "reader"
        rooms = await subscribed_list(client, conn, "a", [item(1)])
        assert rooms.items == [item(1)]
    finally:
        await client.close()


async def test_sync_and_async_providers_are_called_at_connect(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    for sync in (False, True):
        provider = Provider(sync=sync)
        client = OrdoClient(scripted.url, token_provider=provider)
        connecting = asyncio.create_task(client.connect())
        conn = await scripted.next_connection()
        op = await conn.recv()
        assert op == {"op": "auth", "token": provider.tokens[0]} and len(provider.tokens) == 1
        await conn.authed()
        await asyncio.wait_for(connecting, TIMEOUT)
        await client.close()


async def test_no_auth_when_the_server_runs_without_it(scripted: ScriptedServer) -> None:
    scripted.auth = "none"
    provider = Provider()
    async with OrdoClient(scripted.url, token_provider=provider) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed_list(client, conn, "a", [item(1)])  # the first op is the subscribe
        assert rooms.items == [item(1)]
        assert provider.tokens == [] and client.identity is None


async def test_a_refused_token_fails_connect(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    client = OrdoClient(scripted.url, token="not-a-jwt")
    connecting = asyncio.create_task(client.connect())
    conn = await scripted.next_connection()
    assert await conn.recv() == {"op": "auth", "token": "not-a-jwt"}
    await conn.send({"type": "error", "code": "unauthorized", "message": "invalid token"})
    with pytest.raises(OrdoError) as raised:
        await asyncio.wait_for(connecting, TIMEOUT)
    assert raised.value.code == "unauthorized"


async def test_auth_required_without_a_token_fails_connect(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    with pytest.raises(OrdoError) as raised:
        await OrdoClient(scripted.url).connect()
    assert raised.value.code == "unauthorized"


async def test_4401_reconnects_with_a_new_token_then_resumes(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    provider = Provider()
    errors: list[OrdoError] = []
    client = OrdoClient(scripted.url, token_provider=provider, backoff_initial=0.01, backoff_max=0.05,
                        on_error=errors.append)  # fmt: skip
    conn = await connected(scripted, client, provider)
    try:
        rooms = await subscribed_list(client, conn, "a", [item(1), item(2)])
        await conn.ws.close(4401, "token expired")

        # Reconnection: a new token from the provider first, the resume only after `authed`.
        conn = await scripted.next_connection()
        assert await conn.recv() == {"op": "auth", "token": provider.tokens[-1]}
        assert len(provider.tokens) == 2 and provider.tokens[0] != provider.tokens[1]
        await conn.nothing(0.2)
        await conn.authed()
        resume = await conn.recv()
        assert resume["op"] == "resume" and resume["session"] == "s1"
        assert [(entry["sub"], entry["last_seq"]) for entry in resume["subs"]] == [("a", 1)]
        await conn.send({"type": "resumed", "session": "fresh-1", "subs": [{"sub": "a", "replayed": 0}]})
        await conn.diffs("a", 2, {"PopBack": {}})
        await rooms.wait_until(lambda items: items == [item(1)], TIMEOUT)
        assert client.session == "fresh-1", "the session of every `resumed` is kept"

        # Any reconnection asks the provider again, and names the newest session.
        await conn.ws.close(1001)
        conn = await scripted.next_connection()
        assert await conn.recv() == {"op": "auth", "token": provider.tokens[-1]}
        assert len(provider.tokens) == 3
        await conn.authed()
        resume = await conn.recv()
        assert resume["op"] == "resume" and resume["session"] == "fresh-1"
        await conn.send({"type": "resumed", "session": "fresh-2", "subs": [{"sub": "a", "reset": True}]})
        await conn.diffs("a", 3, {"Reset": {"values": [item(7)]}})
        await rooms.wait_until(lambda items: items == [item(7)], TIMEOUT)
        assert client.session == "fresh-2" and client.reconnects == 2
        assert errors == []
    finally:
        await client.close()



async def test_refresh_before_expiry(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    # Tokens living 3 s (iat is whole seconds: 3 to 4 s): refreshed at
    # exp - lifetime/5, 0.6 to 0.8 s before they expire.
    provider = Provider(ttl=3.0)
    client = OrdoClient(scripted.url, token_provider=provider)
    conn = await connected(scripted, client, provider)
    try:
        rooms = await subscribed_list(client, conn, "a", [item(1)])
        exp, _ = token_times(provider.tokens[0])
        assert exp is not None
        op = await conn.recv(timeout=5)
        arrived = time.time()
        assert op == {"op": "auth", "token": provider.tokens[1]}, "a fresh token, on the live connection"
        assert exp - 1.0 < arrived < exp, exp - arrived
        await conn.authed(expires_at=time.time() + 3)
        # The list goes on, and the next refresh follows the new token's expiry.
        await conn.diffs("a", 2, {"PushBack": {"value": item(2)}})
        await rooms.wait_until(lambda items: len(items) == 2, TIMEOUT)
        assert await conn.recv(timeout=5) == {"op": "auth", "token": provider.tokens[2]}
        assert client.connected and client.reconnects == 0
    finally:
        await client.close()


async def test_refresh_at_once_on_auth_expired(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    provider = Provider(ttl=3600)  # the timer would wait 59 minutes
    client = OrdoClient(scripted.url, token_provider=provider)
    conn = await connected(scripted, client, provider)
    try:
        await subscribed_list(client, conn, "a", [item(1)])
        await conn.send({"type": "auth_expired", "grace_secs": 30})
        assert await conn.recv(timeout=2) == {"op": "auth", "token": provider.tokens[1]}
        await conn.authed()
        await conn.nothing(0.3)
        assert len(provider.tokens) == 2
    finally:
        await client.close()


async def test_a_refused_refresh_is_reported_and_retried(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    provider = Provider()
    errors: list[OrdoError] = []
    client = OrdoClient(scripted.url, token_provider=provider, backoff_max=1.0, on_error=errors.append)
    conn = await connected(scripted, client, provider)
    try:
        rooms = await subscribed_list(client, conn, "a", [item(1)])
        await conn.send({"type": "auth_expired", "grace_secs": 30})
        await conn.recv(timeout=2)
        await conn.send({"type": "error", "code": "forbidden", "message": "another identity"})
        # Tried again (after max(1 s, backoff_max)), with yet another token.
        assert await conn.recv(timeout=5) == {"op": "auth", "token": provider.tokens[2]}
        assert [error.code for error in errors] == ["forbidden"]
        await conn.authed()
        assert client.connected and not rooms.closed
    finally:
        await client.close()


async def test_a_failing_provider_is_reported_and_retried_on_reconnect(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    calls = 0

    def provider() -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("identity provider down")
        return fake_jwt(jti=str(calls))

    errors: list[OrdoError] = []
    client = OrdoClient(scripted.url, token_provider=provider, backoff_initial=0.01, backoff_max=0.05,
                        on_error=errors.append)  # fmt: skip
    connecting = asyncio.create_task(client.connect())
    conn = await scripted.next_connection()
    await conn.recv()
    await conn.authed()
    await asyncio.wait_for(connecting, TIMEOUT)
    try:
        await conn.ws.close(4401)
        failed = await scripted.next_connection()  # the provider fails: this one is dropped
        await failed.ws.wait_closed()
        conn = await scripted.next_connection()
        op = await conn.recv()
        assert op["op"] == "auth" and calls == 3
        await conn.authed()
        await client.wait_connected(TIMEOUT)
        assert [error.code for error in errors] == ["token_provider"]
    finally:
        await client.close()


async def test_a_static_token_cannot_be_refreshed(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    token = fake_jwt(ttl=2.0)
    errors: list[OrdoError] = []
    client = OrdoClient(scripted.url, token=token, on_error=errors.append)
    conn = await connected(scripted, client, token)
    try:
        await conn.nothing(2.0)  # no timer: it would send the same token
        await conn.send({"type": "auth_expired", "grace_secs": 30})
        await conn.nothing(0.3)
        assert [error.code for error in errors] == ["auth_expired"]
    finally:
        await client.close()
