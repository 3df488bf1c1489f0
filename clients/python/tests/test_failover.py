"""Failover across node URLs: the rotation and its backoff (socket-free), the
``min_seq`` floor in the ops the protocol core builds, OrdoHttp's retry of
idempotent requests (a stub ``_send``), and OrdoClient against two real
``ordo serve`` processes holding the same data (written by the test), one of
which is SIGKILLed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ordo_server import OrdoServer
from scripted_server import ScriptedServer
from websockets.asyncio.server import serve

from ordo_client import NodeRotation, OrdoClient, OrdoError, OrdoHttp, OrdoHttpError, ProtocolState, Update

# ---- the rotation --------------------------------------------------------


def test_rotation_is_round_robin_and_backs_off_per_full_round() -> None:
    nodes = NodeRotation(["a", "b", "c"], 0.1, 1.0, rand=lambda: 1.0)
    assert nodes.current == "a"
    seen = []
    for _ in range(9):
        delay = nodes.fail()
        seen.append((nodes.current, round(delay, 6)))
    assert seen == [
        ("b", 0.05), ("c", 0.05), ("a", 0.1),
        ("b", 0.05), ("c", 0.05), ("a", 0.2),
        ("b", 0.05), ("c", 0.05), ("a", 0.4),
    ]  # fmt: skip
    # A good connection starts afresh: the next loss goes on quickly again.
    nodes.succeeded()
    assert [round(nodes.fail(), 6) for _ in range(3)] == [0.05, 0.05, 0.1]


def test_rotation_with_one_url_is_the_old_backoff() -> None:
    nodes = NodeRotation("ws://x/v1/ws", 0.25, 1.0, rand=lambda: 1.0)
    assert [nodes.fail() for _ in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert nodes.current == "ws://x/v1/ws"
    nodes.succeeded()
    assert nodes.fail() == 0.25
    assert NodeRotation("u", 0.25, 1.0, rand=lambda: 0.0).fail() == 0.125
    with pytest.raises(ValueError):
        NodeRotation([], 0.1, 1.0)


def test_resume_and_resubscribe_carry_the_highest_write_seq_as_min_seq() -> None:
    state = ProtocolState()
    state.subscribe_op("s", {"collection": "c", "limit": 5})
    reset = {"Reset": {"values": [{"id": "a", "fields": {}}]}}
    state.handle_frame({"type": "diffs", "sub": "s", "seq": 1, "diffs": [reset], "write_seq": 7})
    # A server that sends no write_seq on a frame does not lower the floor.
    state.handle_frame({"type": "diffs", "sub": "s", "seq": 2, "diffs": [], "write_seq": None})
    assert state.subs["s"].floor_seq == 7
    op, _ = state.resume_op()
    assert op is not None
    assert op["subs"] == [{"sub": "s", "collection": "c", "limit": 5, "last_seq": 2, "min_seq": 7}]
    assert state.begin_resubscribe("s")[1] == {"op": "subscribe", "sub": "s", "collection": "c", "limit": 5,
                                              "min_seq": 7}  # fmt: skip
    # Before any frame there is no floor, so no min_seq.
    fresh = ProtocolState()
    assert "min_seq" not in fresh.subscribe_op("t", {"collection": "c", "limit": 5})


# ---- OrdoHttp across nodes -----------------------------------------------


class StubHttp(OrdoHttp):
    """`_send` answers from a table: nodes in `dead` refuse connections."""

    def __init__(self, urls: list[str], dead: set[str], status: int = 200) -> None:
        super().__init__(urls)
        self.dead = dead
        self.status = status
        self.calls: list[str] = []

    def _send(
        self, base: str, method: str, path: str, body: Any, token: str | None, headers: Any = None
    ) -> tuple[int, Any]:
        self.calls.append(base + path)
        if base in self.dead:
            raise OrdoError("connection_lost", f"{method} {path}: connection refused")
        if self.status == 503 and base != "http://c":
            return 503, {"error": {"code": "lagging", "message": "lags"}}
        return 200, {"node": base}


async def test_http_sends_reads_again_on_the_next_node() -> None:
    http = StubHttp(["http://a", "http://b/"], {"http://a"})
    assert http.current_url == "http://a"
    assert await http.collection("rooms") == {"node": "http://b"}
    assert http.calls == ["http://a/v1/collections/rooms", "http://b/v1/collections/rooms"]
    assert http.current_url == "http://b"
    http.calls.clear()
    assert await http.query("rooms", {"limit": 1}) == {"node": "http://b"}
    assert http.calls == ["http://b/v1/collections/rooms/query"]


async def test_http_never_sends_a_write_twice() -> None:
    http = StubHttp(["http://a", "http://b"], {"http://a"})
    with pytest.raises(OrdoError, match="connection refused"):
        await http.write("rooms", [{"op": "remove", "id": "x"}])
    assert http.calls == ["http://a/v1/collections/rooms/batch"]
    # The next request goes to the next node.
    assert await http.write("rooms", []) == {"node": "http://b"}


async def test_http_tries_each_node_once_and_moves_reads_off_a_503() -> None:
    http = StubHttp(["http://a", "http://b"], {"http://a", "http://b"})
    with pytest.raises(OrdoError, match="connection refused"):
        await http.get_item("rooms", "x")
    assert len(http.calls) == 2
    lagging = StubHttp(["http://a", "http://c"], set(), status=503)
    assert await lagging.query("rooms", {"limit": 1}) == {"node": "http://c"}
    writer = StubHttp(["http://a", "http://c"], set(), status=503)
    with pytest.raises(OrdoHttpError) as raised:
        await writer.write("rooms", [])
    assert (raised.value.status, raised.value.code, writer.calls) == (503, "lagging", ["http://a/v1/collections/rooms/batch"])


# ---- two real nodes -------------------------------------------------------

VIEW: dict[str, Any] = {"sort": [{"field": "rank", "dir": "desc"}], "limit": 5}


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[OrdoServer, OrdoServer]]:
    a = OrdoServer(tmp_path / "a")
    b = OrdoServer(tmp_path / "b")
    a.start()
    b.start()
    try:
        for node in (a, b):
            node.create_collection("notes", [("rank", "u64")])
        yield a, b
    finally:
        a.kill()
        b.kill()


class Writer:
    """The same batches on each node, in the same order, so both reach the same `seq`."""

    def __init__(self) -> None:
        self.next_id = 0

    def ops(self, count: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            self.next_id += 1
            out.append({"op": "upsert", "id": f"n{self.next_id}", "fields": {"rank": self.next_id * 37 % 101}})
        return out

    def write(self, nodes: list[OrdoServer], count: int) -> int:
        ops = self.ops(count)
        return [node.batch("notes", ops)["seq"] for node in nodes][-1]


async def wait_for(check: Any, what: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout} s: {what()}")
        await asyncio.sleep(0.02)


async def equals_query(node: OrdoServer, live: Any, context: str) -> None:
    expected = await asyncio.to_thread(node.query, "notes", VIEW)
    try:
        await live.wait_until(lambda items: items == expected, 15.0)
    except asyncio.TimeoutError:
        pytest.fail(f"{context}: list holds {[i['id'] for i in live.items]}, query {[i['id'] for i in expected]}")


def updates_of(live: Any) -> list[Update]:
    """Every update the list applies from now on (the list's own iterator is left alone)."""
    seen: list[Update] = []
    original = live._on_update

    def spy(update: Update) -> None:
        seen.append(update)
        original(update)

    live._on_update = spy
    return seen


async def test_sigkill_of_the_node_in_use_moves_the_list_to_the_other_node(
    two_nodes: tuple[OrdoServer, OrdoServer],
) -> None:
    a, b = two_nodes
    writer = Writer()
    writer.write([a, b], 8)
    failovers: list[tuple[str, str]] = []
    errors: list[OrdoError] = []
    client = OrdoClient([a.ws_url, b.ws_url], backoff_initial=0.02, backoff_max=0.2,
                        on_failover=lambda old, new: failovers.append((old, new)), on_error=errors.append)  # fmt: skip
    async with client:
        live = await client.subscribe("notes", **VIEW, on_error=errors.append)
        await equals_query(a, live, "on A")
        assert client.current_url == a.ws_url
        floor = live.floor_seq
        assert floor is not None
        seen = updates_of(live)

        a.kill()
        await wait_for(lambda: client.current_url == b.ws_url and client.connected,
                       lambda: f"client on {client.current_url}, connected {client.connected}")  # fmt: skip
        await wait_for(lambda: len(seen) >= 1, lambda: "no frame from B")
        await equals_query(b, live, "on B after the failover")
        assert failovers == [(a.ws_url, b.ws_url)]
        # B does not know A's session: a Reset, never older than the list was.
        assert seen[0].reset
        assert all(update.write_seq is not None and update.write_seq >= floor for update in seen)

        # Writes on B after the failover reach the list.
        await asyncio.to_thread(writer.write, [b], 6)
        await equals_query(b, live, "a write on B")
        assert errors == []


async def test_a_node_behind_the_list_is_not_shown_until_it_catches_up(
    two_nodes: tuple[OrdoServer, OrdoServer],
) -> None:
    a, b = two_nodes
    writer = Writer()
    writer.write([a, b], 5)
    # A runs two batches ahead of B (the lag of a slow node).
    writer.write([a], 4)
    ahead = writer.write([a], 4)
    errors: list[OrdoError] = []
    async with OrdoClient([a.ws_url, b.ws_url], backoff_initial=0.02, backoff_max=0.2, on_error=errors.append) as client:
        live = await client.subscribe("notes", **VIEW, on_error=errors.append)
        await equals_query(a, live, "on A")
        assert live.floor_seq == ahead
        items_on_a = live.items
        seen = updates_of(live)

        a.kill()
        # B holds the resume until it reaches the floor (5 s), then refuses the
        # entry; the client keeps A's list and tries again (A is dead: B again).
        await wait_for(lambda: any(error.code == "seq_not_reached" for error in errors),
                       lambda: f"errors {errors}, client on {client.current_url}")  # fmt: skip
        assert seen == []
        assert live.items is items_on_a
        assert "notes" in str(live.sub) and not live.closed

        # B catches up (the same two batches): the list comes back from B.
        writer.next_id -= 8
        await asyncio.to_thread(writer.write, [b], 4)
        await asyncio.to_thread(writer.write, [b], 4)
        await wait_for(lambda: len(seen) >= 1, lambda: f"no frame from B; errors {errors}")
        await equals_query(b, live, "on B once it caught up")
        assert live.items == items_on_a
        assert all(update.write_seq is not None and update.write_seq >= ahead for update in seen)


# ---- a node that lags (scripted servers) -----------------------------------


async def test_a_subscribe_refused_with_lagging_is_taken_to_the_next_node() -> None:
    lagging, healthy = ScriptedServer(), ScriptedServer()
    async with serve(lagging.handler, "127.0.0.1", 0) as one, serve(healthy.handler, "127.0.0.1", 0) as two:
        for server, ws_server in ((lagging, one), (healthy, two)):
            server.url = f"ws://127.0.0.1:{next(iter(ws_server.sockets)).getsockname()[1]}/v1/ws"
        errors: list[OrdoError] = []
        async with OrdoClient([lagging.url, healthy.url], backoff_initial=0.02, backoff_max=0.05) as client:
            first = await lagging.next_connection()
            task = asyncio.create_task(client.subscribe("notes", limit=5, sub_id="top", on_error=errors.append))
            assert (await first.recv())["op"] == "subscribe"
            await first.send({"type": "error", "sub": "top", "code": "lagging", "message": "this node lags"})
            second = await healthy.next_connection()
            resume = await second.recv()
            assert resume["op"] == "resume" and resume["subs"][0]["sub"] == "top", resume
            await second.send({"type": "resumed", "session": "s9", "subs": [{"sub": "top", "reset": True}]})
            await second.diffs("top", 1, {"Reset": {"values": [{"id": "a", "fields": {}}]}})
            live = await asyncio.wait_for(task, 5)
            assert live.items == [{"id": "a", "fields": {}}]
            assert client.current_url == healthy.url
            assert [error.code for error in errors] == ["lagging"]
