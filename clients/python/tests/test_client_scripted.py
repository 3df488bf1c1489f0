"""OrdoClient against a scripted WebSocket server on loopback: what the client
sends after a gap or a digest mismatch, on reconnect (one `resume` first), on refusal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scripted_server import TIMEOUT, Conn, ScriptedServer, item, subscribed_list

from ordo_client import OrdoClient, OrdoError, apply_diffs, window_digest

async def subscribed(server: ScriptedServer, client: OrdoClient, conn: Conn, **options: Any) -> Any:
    return await subscribed_list(client, conn, "a", [item(1), item(2)], **options)


async def test_subscribe_and_updates(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        assert client.session == "s1"
        task = asyncio.create_task(
            client.subscribe("rooms", sort=[{"field": "recency", "dir": "desc"}], limit=3, sub_id="a")
        )
        op = await conn.recv()
        assert op == {"op": "subscribe", "sub": "a", "collection": "rooms",
                      "sort": [{"field": "recency", "dir": "desc"}], "offset": 0, "limit": 3, "payload": True}  # fmt: skip
        await conn.diffs("a", 1, {"Reset": {"values": [item(1)]}})
        rooms = await asyncio.wait_for(task, TIMEOUT)
        assert rooms.items == [item(1)] and rooms.seq == 1
        updates = aiter(rooms)
        await conn.diffs("a", 2, {"PushFront": {"value": item(2)}})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.seq == 2 and not update.reset
        assert update.items == [item(2), item(1)] == rooms.items
        assert update.diffs == [{"PushFront": {"value": item(2)}}]

        await rooms.set_range(0, 10)
        assert await conn.recv() == {"op": "set_range", "sub": "a", "offset": 0, "limit": 10}
        await rooms.set_view(filter={"field": "dm", "op": "eq", "value": True})
        assert await conn.recv() == {"op": "set_view", "sub": "a", "filter": {"field": "dm", "op": "eq", "value": True},
                                     "sort": [{"field": "recency", "dir": "desc"}]}  # fmt: skip
        closing = asyncio.create_task(rooms.close())
        assert await conn.recv() == {"op": "unsubscribe", "sub": "a"}
        await conn.send({"type": "unsubscribed", "sub": "a"})
        await asyncio.wait_for(closing, TIMEOUT)
        assert rooms.closed
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(updates), TIMEOUT)


async def test_a_refused_subscribe_raises(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        task = asyncio.create_task(client.subscribe("rooms", sort=[{"field": "recncy"}], sub_id="bad"))
        await conn.recv()
        await conn.send({"type": "error", "code": "invalid_view", "message": "no field `recncy`", "sub": "bad"})
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(task, TIMEOUT)
        assert (raised.value.code, raised.value.sub) == ("invalid_view", "bad")
        assert client.lists == {}


async def test_a_refused_set_view_is_reported_and_undone(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        updates = aiter(rooms)
        await rooms.set_view(sort=[{"field": "nope"}])
        await conn.recv()
        await conn.send({"type": "error", "code": "invalid_view", "message": "no field `nope`", "sub": "a"})
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), TIMEOUT)
        assert raised.value.code == "invalid_view"
        assert rooms.sort is None, "the refused view is not kept for resume"
        # The list goes on.
        await conn.diffs("a", 2, {"PopBack": {}})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.items == [item(1)]


async def test_a_gap_is_reported_and_the_list_resubscribed(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn, filter={"field": "dm", "op": "eq", "value": False})
        updates = aiter(rooms)
        await conn.diffs("a", 3, {"PopBack": {}})  # seq 2 lost
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), TIMEOUT)
        assert raised.value.code == "gap" and raised.value.sub == "a"
        assert rooms.items == [item(1), item(2)] and rooms.seq == 1, "the frame was not applied"
        assert await conn.recv() == {"op": "unsubscribe", "sub": "a"}
        resubscribe = await conn.recv()
        assert resubscribe["op"] == "subscribe" and resubscribe["sub"] == "a"
        assert resubscribe["filter"] == {"field": "dm", "op": "eq", "value": False}
        # The old subscription's frames still in flight are ignored.
        await conn.diffs("a", 4, {"Clear": {}})
        await conn.send({"type": "unsubscribed", "sub": "a"})
        await conn.diffs("a", 1, {"Reset": {"values": [item(5)]}})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.reset and update.seq == 1 and update.items == [item(5)]
        assert not rooms.closed
        await conn.diffs("a", 2, {"PushBack": {"value": item(6)}})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert rooms.items == [item(5), item(6)]


async def test_gap_errors_go_to_on_error_when_given(scripted: ScriptedServer) -> None:
    errors: list[OrdoError] = []
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn, on_error=errors.append)
        updates = aiter(rooms)
        await conn.diffs("a", 2, {"Remove": {"index": 7}})  # does not fit: handled as a gap
        assert (await conn.recv())["op"] == "unsubscribe"
        assert (await conn.recv())["op"] == "subscribe"
        await conn.send({"type": "unsubscribed", "sub": "a"})
        await conn.diffs("a", 1, {"Reset": {"values": []}})
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.reset and rooms.items == []
        assert [error.code for error in errors] == ["invalid_diffs"]


async def test_a_digest_mismatch_is_reported_and_the_list_resubscribed(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        updates = aiter(rooms)
        # Diffs that apply, but a digest that is not the list's after them (the
        # rows' digest in the reverse order): not applied, reported, counted.
        swapped = window_digest([item(3), item(2), item(1)])
        assert swapped != window_digest([item(1), item(2), item(3)])
        await conn.send({"type": "diffs", "sub": "a", "seq": 2, "digest": swapped,
                         "diffs": [{"PushBack": {"value": item(3)}}]})  # fmt: skip
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), TIMEOUT)
        assert raised.value.code == "digest_mismatch" and raised.value.sub == "a"
        assert rooms.digest_mismatches == 1
        assert rooms.items == [item(1), item(2)] and rooms.seq == 1, "the frame was not applied"
        # Subscribed again; the fresh snapshot (with its own digest) replaces the list.
        assert await conn.recv() == {"op": "unsubscribe", "sub": "a"}
        resubscribe = await conn.recv()
        assert resubscribe["op"] == "subscribe" and resubscribe["sub"] == "a"
        await conn.send({"type": "unsubscribed", "sub": "a"})
        fresh = [{**item(7), "version": 7}, {**item(8), "version": 8}]
        await conn.send({"type": "diffs", "sub": "a", "seq": 1, "digest": window_digest(fresh),
                         "diffs": [{"Reset": {"values": fresh}}]})  # fmt: skip
        update = await asyncio.wait_for(anext(updates), TIMEOUT)
        assert update.reset and update.seq == 1
        assert rooms.items == fresh == update.items
        assert rooms.digest_mismatches == 1 and not rooms.closed


async def test_reconnect_sends_one_resume_first(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url, backoff_initial=0.01, backoff_max=0.05) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        await conn.diffs("a", 2, {"PushBack": {"value": item(3)}})
        await rooms.wait_until(lambda items: len(items) == 3, TIMEOUT)
        task = asyncio.create_task(client.subscribe("rooms", limit=5, sub_id="b"))
        assert (await conn.recv())["sub"] == "b"
        # The server stops before answering `b`; meanwhile the client changes a's range.
        await conn.ws.close(1001, "server stopping")
        while client.connected:
            await asyncio.sleep(0.01)
        await rooms.set_range(1, 2)

        conn = await scripted.next_connection()
        resume = await conn.recv()
        assert resume == {"op": "resume", "session": "s1", "subs": [
            {"sub": "a", "collection": "rooms", "offset": 1, "limit": 2, "payload": True, "last_seq": 2},
            {"sub": "b", "collection": "rooms", "offset": 0, "limit": 5, "payload": True, "last_seq": 0},
        ]}  # fmt: skip
        await conn.send({"type": "resumed", "session": "s2",
                         "subs": [{"sub": "a", "reset": True}, {"sub": "b", "reset": True}]})  # fmt: skip
        await conn.diffs("a", 3, {"Reset": {"values": [item(2), item(3)]}})
        await conn.diffs("b", 1, {"Reset": {"values": [item(9)]}})
        b = await asyncio.wait_for(task, TIMEOUT)
        assert b.items == [item(9)]
        await rooms.wait_until(lambda items: items == [item(2), item(3)], TIMEOUT)
        assert rooms.seq == 3 and client.session == "s2" and client.reconnects == 1
        # Nothing else was sent before or with the resume.
        await rooms.set_range(0, 3)
        assert await conn.recv() == {"op": "set_range", "sub": "a", "offset": 0, "limit": 3}


async def test_unsubscribe_while_disconnected_leaves_it_out_of_the_resume(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url, backoff_initial=0.2, backoff_max=0.2) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        await conn.ws.close(1001)
        while client.connected:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(rooms.close(), TIMEOUT)
        other = asyncio.create_task(client.subscribe("rooms", limit=1, sub_id="b"))
        conn = await scripted.next_connection()
        resume = await conn.recv()
        assert [entry["sub"] for entry in resume["subs"]] == ["b"]
        other.cancel()


async def test_without_reconnect_lists_end_with_connection_lost(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url, reconnect=False) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        updates = aiter(rooms)
        await conn.ws.close(1001)
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), TIMEOUT)
        assert raised.value.code == "connection_lost"
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(updates), TIMEOUT)
        with pytest.raises(OrdoError):
            await client.subscribe("rooms", limit=1)


async def test_unread_updates_collapse_into_one_reset(scripted: ScriptedServer) -> None:
    async with OrdoClient(scripted.url, max_queued_updates=3) as client:
        conn = await scripted.next_connection()
        rooms = await subscribed(scripted, client, conn)
        local = list(rooms.items)
        updates = aiter(rooms)
        for seq in range(2, 10):
            await conn.diffs("a", seq, {"PushBack": {"value": item(seq)}})
        await rooms.wait_until(lambda items: len(items) == 10, TIMEOUT)
        received = []
        while True:
            update = await asyncio.wait_for(anext(updates), TIMEOUT)
            received.append(update)
            local = apply_diffs(local, update.diffs)
            assert local == update.items
            if update.seq == 9:
                break
        assert len(received) <= 4 and received[0].reset
        assert local == rooms.items
