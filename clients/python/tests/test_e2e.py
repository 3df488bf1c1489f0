"""End to end against a real `ordo serve` on loopback (binary: $ORDO_BIN, or
<repo>/target/release/ordo). Every wait has a timeout only as a failure guard."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from ordo_server import OrdoServer

from ordo_client import LiveList, OrdoClient, OrdoError, Update, apply_diffs

SETTLE = 15.0
FIELDS = [("name", "string"), ("recency", "u64"), ("unread", "u64"), ("dm", "bool")]
NAMES = ["alice", "Bob", "chloé", "Dmitri", "Émile", "zoë", "Łucja", "東京", "ann", "Al"]
FILTERS: list[Any] = [
    None,
    {"field": "dm", "op": "eq", "value": True},
    {"field": "unread", "op": "gt", "value": 0},
    {"any": [{"field": "dm", "op": "eq", "value": False}, {"field": "unread", "op": "ge", "value": 3}]},
    {"field": "name", "prefix": "a"},
    {"not": {"field": "recency", "op": "lt", "value": 500}},
    {"field": "name", "is_null": False},
]
SORTS: list[Any] = [
    [{"field": "recency", "dir": "desc"}],
    [{"field": "name", "dir": "asc", "case_insensitive": True}, {"field": "recency", "dir": "desc"}],
    [{"field": "unread", "dir": "desc"}, {"field": "name"}],
    [],
    None,
]


def random_op(rng: random.Random, n_ids: int = 40) -> dict[str, Any]:
    id_ = f"!r{rng.randrange(n_ids):02}:example.org"
    if rng.random() < 0.2:
        return {"op": "remove", "id": id_}
    fields: dict[str, Any] = {}
    for name, _ in FIELDS:
        if rng.random() < 0.7:
            fields[name] = {
                "name": lambda: rng.choice(NAMES + [None]),
                "recency": lambda: rng.randrange(1000),
                "unread": lambda: rng.randrange(6),
                "dm": lambda: rng.random() < 0.4,
            }[name]()
    op: dict[str, Any] = {"op": "upsert", "id": id_, "fields": fields}
    if rng.random() < 0.5:
        op["payload"] = {"last": f"message {rng.randrange(10_000)}", "n": [1, 2]}
    return op


def view_of(live: LiveList) -> dict[str, Any]:
    return {"filter": live.filter, "sort": live.sort, "offset": live.offset, "limit": live.limit,
            "fields": live.fields, "payload": live.payload}  # fmt: skip


async def settle(server: OrdoServer, lists: list[LiveList], context: str) -> None:
    """Waits until every list equals a one-shot query of its window."""
    for live in lists:
        expected = await asyncio.to_thread(server.query, live.collection, view_of(live))
        try:
            await live.wait_until(lambda items, expected=expected: items == expected, SETTLE)
        except asyncio.TimeoutError:
            pytest.fail(
                f"{context}: list {live.sub!r} ({view_of(live)}) did not reach the query's answer in {SETTLE} s\n"
                f" got      {[item['id'] for item in live.items]} (seq {live.seq})\n"
                f" expected {[item['id'] for item in expected]}"
            )


def seed_rooms(server: OrdoServer, rng: random.Random, n: int = 40) -> None:
    server.create_collection("rooms", FIELDS)
    ops = [
        {"op": "upsert", "id": f"!r{i:02}:example.org",
         "fields": {"name": rng.choice(NAMES), "recency": rng.randrange(1000), "unread": rng.randrange(6),
                    "dm": rng.random() < 0.4},
         "payload": {"last": f"message {i}"}}
        for i in range(n)
    ]  # fmt: skip
    server.batch("rooms", ops)


class Checker:
    """Consumes a list's updates and checks that their diffs rebuild its items."""

    def __init__(self, live: LiveList) -> None:
        self.live = live
        self.local = list(live.items)
        self.updates: list[Update] = []
        self.errors: list[BaseException] = []
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        try:
            async for update in self.live:
                self.local = apply_diffs(self.local, update.diffs)
                assert self.local == update.items, f"{self.live.sub}: diffs do not rebuild the items"
                self.updates.append(update)
        except BaseException as error:  # reported by check()
            self.errors.append(error)
            raise

    def check(self) -> None:
        assert not self.errors, self.errors
        assert self.local == self.live.items


async def test_random_writes_windows_and_views(ordo: OrdoServer) -> None:
    rng = random.Random(7)
    seed_rooms(ordo, rng)
    errors: list[OrdoError] = []
    async with OrdoClient(ordo.ws_url, on_error=errors.append) as client:
        lists = [
            await client.subscribe("rooms", sort=SORTS[0], limit=10, sub_id="top"),
            await client.subscribe("rooms", filter=FILTERS[1], sort=SORTS[1], limit=5, sub_id="dms"),
            await client.subscribe("rooms", filter=FILTERS[3], sort=SORTS[2], offset=3, limit=7,
                                   fields=["name", "unread"], payload=False),
            await client.subscribe("rooms", filter=FILTERS[4], limit=20),
        ]  # fmt: skip
        assert [live.seq for live in lists] == [1, 1, 1, 1]
        assert "payload" not in lists[2].items[0] and list(lists[2].items[0]["fields"]) == ["name", "unread"]
        checkers = [Checker(live) for live in lists]
        await settle(ordo, lists, "subscribed")
        for step in range(25):
            await asyncio.to_thread(ordo.batch, "rooms", [random_op(rng) for _ in range(rng.randrange(1, 12))])
            live = rng.choice(lists)
            action = rng.randrange(4)
            if action == 0:
                await live.set_range(rng.randrange(0, 15), rng.randrange(1, 25))
            elif action == 1:
                await live.set_view(filter=rng.choice(FILTERS), sort=rng.choice(SORTS))
            elif action == 2:
                await live.set_view(filter=rng.choice(FILTERS))
            await settle(ordo, lists, f"step {step}")
        # Load more, then a jump past the end.
        await lists[0].set_range(0, 40)
        await settle(ordo, lists, "load more")
        await lists[0].set_range(100, 10)
        await settle(ordo, lists, "past the end")
        assert lists[0].items == []
        for checker in checkers:
            checker.check()
        assert errors == [], errors
        await lists[3].close()
        assert lists[3].closed and lists[3].sub not in client.lists
        await asyncio.wait_for(checkers[3].task, SETTLE)


async def test_unknown_sort_field_is_invalid_view(ordo: OrdoServer) -> None:
    seed_rooms(ordo, random.Random(1), 5)
    async with OrdoClient(ordo.ws_url) as client:
        with pytest.raises(OrdoError) as raised:
            await client.subscribe("rooms", sort=[{"field": "recncy", "dir": "desc"}], limit=5, sub_id="bad")
        assert raised.value.code == "invalid_view" and raised.value.sub == "bad"
        with pytest.raises(OrdoError) as raised:
            await client.subscribe("nope", limit=5)
        assert raised.value.code == "unknown_collection"
        # The connection goes on, and the refused id is free.
        rooms = await client.subscribe("rooms", sort=[{"field": "recency", "dir": "desc"}], limit=5, sub_id="bad")
        await settle(ordo, [rooms], "after the refusals")


async def test_a_refused_set_view_keeps_the_list(ordo: OrdoServer) -> None:
    seed_rooms(ordo, random.Random(2), 10)
    async with OrdoClient(ordo.ws_url) as client:
        rooms = await client.subscribe("rooms", sort=[{"field": "recency", "dir": "desc"}], limit=5)
        updates = aiter(rooms)
        await rooms.set_view(filter={"field": "unread", "op": "gt", "value": "x"})
        with pytest.raises(OrdoError) as raised:
            await asyncio.wait_for(anext(updates), SETTLE)
        assert raised.value.code == "invalid_view"
        assert rooms.filter is None
        await asyncio.to_thread(ordo.batch, "rooms", [
            {"op": "upsert", "id": "!new", "fields": {"name": "New", "recency": 5000}}])  # fmt: skip
        update = await asyncio.wait_for(anext(updates), SETTLE)
        assert update.items[0]["id"] == "!new"
        await settle(ordo, [rooms], "after the refusal")


async def test_async_for_yields_updates_as_writes_happen(ordo: OrdoServer) -> None:
    seed_rooms(ordo, random.Random(3), 10)
    async with OrdoClient(ordo.ws_url) as client:
        rooms = await client.subscribe("rooms", sort=[{"field": "recency", "dir": "desc"}], limit=3)
        seen: asyncio.Queue[Update] = asyncio.Queue()

        async def consume() -> None:
            async for update in rooms:
                await seen.put(update)

        consumer = asyncio.create_task(consume())
        for n in range(5):
            id_ = f"!hot{n}"
            await asyncio.to_thread(ordo.batch, "rooms", [
                {"op": "upsert", "id": id_, "fields": {"name": f"Hot {n}", "recency": 10_000 + n}}])  # fmt: skip
            update = await asyncio.wait_for(seen.get(), SETTLE)
            assert update.items[0]["id"] == id_, update
            assert update.seq == n + 2
        await rooms.close()
        await asyncio.wait_for(consumer, SETTLE)


async def test_lists_recover_after_a_server_restart(tmp_path: Path) -> None:
    server = OrdoServer(tmp_path / "data")
    server.start()
    try:
        rng = random.Random(4)
        seed_rooms(server, rng)
        errors: list[OrdoError] = []
        async with OrdoClient(server.ws_url, backoff_initial=0.05, backoff_max=0.5, on_error=errors.append) as client:
            lists = [
                await client.subscribe("rooms", sort=SORTS[0], limit=8, on_error=errors.append),
                await client.subscribe("rooms", filter=FILTERS[2], sort=SORTS[1], offset=2, limit=6,
                                       on_error=errors.append),
            ]  # fmt: skip
            checkers = [Checker(live) for live in lists]
            await asyncio.to_thread(server.batch, "rooms", [random_op(rng) for _ in range(10)])
            await settle(server, lists, "before the restart")
            seqs = [live.seq for live in lists]
            port, session = server.port, client.session

            await asyncio.to_thread(server.stop)  # SIGTERM: close code 1001
            await asyncio.wait_for(_until(lambda: not client.connected), SETTLE)
            # Changed while the server is away: goes out with the resume.
            await lists[1].set_range(0, 6)
            await asyncio.to_thread(server.start)
            assert server.port == port
            await client.wait_connected(SETTLE)
            await asyncio.to_thread(server.batch, "rooms", [random_op(rng) for _ in range(10)])
            await settle(server, lists, "after the restart")
            assert client.reconnects >= 1
            assert client.session != session, "a restarted server does not know the old session"
            for live, seq in zip(lists, seqs):
                assert live.seq > seq, "the sequence goes on (Reset with last_seq + 1)"
            for checker in checkers:
                assert any(update.reset for update in checker.updates), "resumed with a Reset"
                checker.check()
            assert errors == [], errors
    finally:
        server.stop()


async def test_a_dropped_connection_resumes_with_replay(ordo: OrdoServer) -> None:
    rng = random.Random(5)
    seed_rooms(ordo, rng)
    errors: list[OrdoError] = []
    async with OrdoClient(ordo.ws_url, backoff_initial=0.01, backoff_max=0.05, on_error=errors.append) as client:
        rooms = await client.subscribe("rooms", sort=SORTS[0], limit=10, on_error=errors.append)
        checker = Checker(rooms)
        session = client.session
        # Hold the reconnection until the server has seen the connection go
        # (a session still attached to a live connection is not replayed).
        may_reconnect = asyncio.Event()
        open_connection = client._open

        async def gated_open() -> Any:
            await may_reconnect.wait()
            return await open_connection()

        client._open = gated_open  # type: ignore[method-assign]
        ws = client._ws
        assert ws is not None
        ws.transport.abort()  # no close frame: as if the network dropped
        await asyncio.wait_for(_until(lambda: not client.connected), SETTLE)
        for _ in range(3):
            await asyncio.to_thread(ordo.batch, "rooms", [random_op(rng) for _ in range(5)])
        for _ in range(int(SETTLE / 0.05)):
            if (await asyncio.to_thread(_metrics, ordo)).get("ordo_connections") == 0:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the server did not see the connection drop")
        may_reconnect.set()
        await client.wait_connected(SETTLE)
        await settle(ordo, [rooms], "after the resume")
        # The server kept the session (the frames replayed), and issued a new
        # token for it, as on every resume.
        assert client.session is not None and client.session != session
        metrics = await asyncio.to_thread(_metrics, ordo)
        assert metrics.get("ordo_resume_replayed_total", 0) >= 1, metrics
        assert not any(update.reset for update in checker.updates), "replayed, not reset"
        checker.check()
        assert errors == [], errors


def _metrics(server: OrdoServer) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(server.http + "/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_total_write_seq_and_ended(ordo: OrdoServer) -> None:
    ordo.create_collection("gone", FIELDS)
    ordo.batch("gone", [{"op": "upsert", "id": f"!g{n}", "fields": {"name": f"g{n}", "recency": n}} for n in range(4)])
    ordo.ok("POST", "/v1/collections/gone/fields", {"name": "pinned", "type": "bool", "default": False})
    sort = [{"field": "recency", "dir": "desc"}]
    async with OrdoClient(ordo.ws_url) as client:
        every = await client.subscribe("gone", sort=sort, limit=2, sub_id="all")
        pins = await client.subscribe(
            "gone", filter={"field": "pinned", "op": "eq", "value": False}, sort=sort, limit=2, sub_id="pins"
        )
        assert every.total == 4 and pins.total == 4
        seen: list[Any] = []

        async def consume() -> None:
            async for event in pins:
                seen.append(event)

        consumer = asyncio.create_task(consume())
        written = await asyncio.to_thread(
            ordo.batch, "gone", [{"op": "upsert", "id": "!g9", "fields": {"name": "g9", "recency": 9}}]
        )
        await every.wait_until(lambda _: every.total == 5, SETTLE)
        assert every.write_seq is not None and every.write_seq >= written["seq"]

        await asyncio.to_thread(ordo.ok, "DELETE", "/v1/collections/gone/fields/pinned")
        await asyncio.wait_for(consumer, SETTLE)  # the iteration ends with the `ended` event
        assert pins.closed and pins.ended is not None
        assert (pins.ended.sub, pins.ended.reason) == ("pins", "field_removed")
        assert seen[-1] is pins.ended  # the last thing the iteration yields
        assert len(pins.items) == 2  # keeps its last items
        with pytest.raises(OrdoError):
            await pins.set_range(0, 3)
        await pins.close()  # a no-op
        # The other list goes on without the field; the id is free again.
        await settle(ordo, [every], "after the field was removed")
        again = await client.subscribe("gone", sort=sort, limit=1, sub_id="pins")

        await asyncio.to_thread(ordo.ok, "DELETE", "/v1/collections/gone")
        for live in (every, again):
            if not live.closed:
                await live.wait_until(lambda _, live=live: live.closed, SETTLE)
            assert live.ended is not None and live.ended.reason == "collection_dropped"
