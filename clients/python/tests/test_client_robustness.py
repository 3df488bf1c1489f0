"""Frames the client cannot parse or handle (nested too deep, not JSON, an
unexpected shape, a failure while handling) never end the connection task:
the client reports them and re-subscribes the list concerned — every list
when the frame's `sub` cannot be read — then goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scripted_server import TIMEOUT, Conn, ScriptedServer, item, subscribed_list

from ordo_client import LiveList, OrdoClient, OrdoError

DEEP = "[" * 100_000 + "]" * 100_000


async def two_lists(client: OrdoClient, conn: Conn) -> tuple[LiveList, LiveList]:
    a = await subscribed_list(client, conn, "a", [item(1), item(2)])
    b = await subscribed_list(client, conn, "b", [item(3)])
    return a, b


async def expect_resubscribe(conn: Conn, subs: set[str]) -> None:
    """Reads the client's `unsubscribe` + `subscribe` for each of `subs`, and
    answers as the server would: `unsubscribed`, then the new subscription's
    `Reset` (seq 1) holding item(10 + index)."""
    ops = [await conn.recv() for _ in range(2 * len(subs))]
    assert sorted((op["op"], op["sub"]) for op in ops) == sorted(
        [("unsubscribe", sub) for sub in subs] + [("subscribe", sub) for sub in subs]
    ), ops
    for sub in sorted(subs):
        await conn.send({"type": "unsubscribed", "sub": sub})
        await conn.diffs(sub, 1, {"Reset": {"values": [item(10 + ord(sub[0]))]}})


async def check_alive(client: OrdoClient, conn: Conn, live: LiveList, seq: int) -> None:
    """The connection task still runs: a normal frame is applied."""
    assert client._supervisor is not None and not client._supervisor.done()
    await conn.diffs(live.sub, seq, {"PushBack": {"value": item(99)}})
    await live.wait_until(lambda items: bool(items) and items[-1] == item(99), TIMEOUT)
    assert client.connected and client.reconnects == 0


@pytest.mark.parametrize("raw", [DEEP, '{"type":"diffs","sub":"a","diffs":' + DEEP + "}", '{"type":"diffs",', "\x00",
                                 "[1, 2]", '{"type":"diffs","sub":7,"seq":2,"diffs":[]}'],
                         ids=["nested-100k", "nested-in-a-frame", "truncated", "not-json", "an-array",
                              "sub-not-a-string"])  # fmt: skip
async def test_an_unreadable_frame_resubscribes_every_list(scripted: ScriptedServer, raw: str) -> None:
    errors: list[OrdoError] = []
    async with OrdoClient(scripted.url, on_error=errors.append) as client:
        conn = await scripted.next_connection()
        a, b = await two_lists(client, conn)
        await conn.ws.send(raw)
        await expect_resubscribe(conn, {"a", "b"})
        await a.wait_until(lambda items: items == [item(10 + ord("a"))], TIMEOUT)
        await b.wait_until(lambda items: items == [item(10 + ord("b"))], TIMEOUT)
        assert [error.code for error in errors] == ["bad_frame"], errors
        assert errors[0].sub is None
        await check_alive(client, conn, a, 2)
        await check_alive(client, conn, b, 2)


async def test_a_frame_of_an_unknown_type_is_ignored(scripted: ScriptedServer) -> None:
    """A newer server may send frames this client does not know: they change nothing."""
    errors: list[OrdoError] = []
    async with OrdoClient(scripted.url, on_error=errors.append) as client:
        conn = await scripted.next_connection()
        a, _ = await two_lists(client, conn)
        await conn.ws.send('{"type": "mystery", "sub": "a"}')
        await check_alive(client, conn, a, 2)
        assert errors == []


@pytest.mark.parametrize("frame", [
    '{"type":"diffs","sub":"a","seq":"two","diffs":[]}',
    '{"type":"diffs","sub":"a","seq":2}',
    '{"type":"error","sub":"a","message":"no code"}',
    '{"type":"diffs","sub":"a","seq":2,"diffs":{"Clear":{}}}',
], ids=["seq-not-a-number", "no-diffs", "error-without-code", "diffs-not-a-list"])  # fmt: skip
async def test_a_malformed_frame_of_one_list_resubscribes_that_list(scripted: ScriptedServer, frame: str) -> None:
    errors: list[OrdoError] = []
    async with OrdoClient(scripted.url, on_error=errors.append) as client:
        conn = await scripted.next_connection()
        a, b = await two_lists(client, conn)
        await conn.ws.send(frame)
        # The other list is not touched: its next frame is applied at once.
        await conn.diffs("b", 2, {"PushBack": {"value": item(4)}})
        await b.wait_until(lambda items: items == [item(3), item(4)], TIMEOUT)
        await expect_resubscribe(conn, {"a"})
        await a.wait_until(lambda items: items == [item(10 + ord("a"))], TIMEOUT)
        await check_alive(client, conn, a, 2)
        await check_alive(client, conn, b, 3)


async def test_list_errors_go_to_the_lists_iterator(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        a, _ = await two_lists(client, conn)
        updates = aiter(a)
        await conn.ws.send('{"type":"diffs","sub":"a","seq":null,"diffs":[]}')
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), TIMEOUT)
        assert (raised.value.code, raised.value.sub) == ("bad_frame", "a")
        await expect_resubscribe(conn, {"a"})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.reset and update.items == [item(10 + ord("a"))]


async def test_a_failure_while_handling_a_frame(scripted: ScriptedServer, monkeypatch: Any) -> None:
    errors: list[OrdoError] = []
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        a = await subscribed_list(client, conn, "a", [item(1), item(2)], on_error=errors.append)
        b = await subscribed_list(client, conn, "b", [item(3)])
        original = LiveList._on_update
        failures = 0

        def failing_once(self: LiveList, update: Any) -> None:
            nonlocal failures
            if self.sub == "a" and failures == 0:
                failures += 1
                raise RuntimeError("a bug while handling the frame")
            original(self, update)

        monkeypatch.setattr(LiveList, "_on_update", failing_once)
        await conn.diffs("a", 2, {"PushBack": {"value": item(5)}})
        await expect_resubscribe(conn, {"a"})
        await a.wait_until(lambda items: items == [item(10 + ord("a"))], TIMEOUT)
        assert failures == 1 and [error.sub for error in errors] == ["a"], errors
        assert "a bug while handling the frame" in errors[0].message
        await check_alive(client, conn, a, 2)
        await check_alive(client, conn, b, 2)


async def test_a_frame_nested_too_deep_during_the_handshake_is_retried(scripted: ScriptedServer) -> None:
    scripted.auth = "required"
    errors: list[OrdoError] = []
    client = OrdoClient(scripted.url, token="t", backoff_initial=0.01, backoff_max=0.05, on_error=errors.append)
    connecting = asyncio.create_task(client.connect())
    conn = await scripted.next_connection()
    await conn.recv()
    await conn.send({"type": "authed", "sub": "u", "role": "reader", "expires_at": 4_000_000_000})
    await asyncio.wait_for(connecting, TIMEOUT)
    try:
        a = await subscribed_list(client, conn, "a", [item(1)])
        await conn.ws.close(1001)
        conn = await scripted.next_connection()
        assert (await conn.recv())["op"] == "auth"
        await conn.ws.send(DEEP)  # instead of `authed`: this attempt fails, the next one works
        conn = await scripted.next_connection()
        assert (await conn.recv())["op"] == "auth"
        await conn.send({"type": "authed", "sub": "u", "role": "reader", "expires_at": 4_000_000_000})
        assert (await conn.recv())["op"] == "resume"
        await conn.send({"type": "resumed", "session": "s3", "subs": [{"sub": "a", "replayed": 0}]})
        await client.wait_connected(TIMEOUT)
        await check_alive_after_reconnect(conn, a)
        assert [error.code for error in errors] == ["bad_frame"]
    finally:
        await client.close()


async def check_alive_after_reconnect(conn: Conn, live: LiveList) -> None:
    await conn.diffs(live.sub, 2, {"PushBack": {"value": item(99)}})
    await live.wait_until(lambda items: items[-1] == item(99), TIMEOUT)
