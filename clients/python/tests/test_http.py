"""The HTTP helpers (OrdoHttp) against a real `ordo serve` with auth on: schema,
write, query, get, delete, error codes, and a token provider retried after a 401."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ordo_server import OrdoServer, mint_token

from ordo_client import OrdoHttp, OrdoHttpError

FIELDS = [{"name": "name", "type": "string"}, {"name": "recency", "type": "u64"}, {"name": "unread", "type": "u64"}]


def room(n: int, recency: int) -> dict[str, object]:
    return {"op": "upsert", "id": f"!r{n}:example.org", "fields": {"name": f"Room {n}", "recency": recency, "unread": 0}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OrdoServer]:
    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    ordo = OrdoServer(tmp_path / "data", extra_args=["--auth-secret-file", str(secret)])
    ordo.start()
    ordo.token = mint_token(secret, "ops", "admin", 3600)
    ordo.secret_file = secret  # type: ignore[attr-defined]
    try:
        yield ordo
    finally:
        ordo.stop()


async def test_schema_write_query_get_delete(server: OrdoServer) -> None:
    admin = OrdoHttp(server.http, token=server.token)
    created = await admin.create_collection("rooms", FIELDS)
    assert created["name"] == "rooms" and created["fields"] == FIELDS
    await admin.create_collection("rooms", FIELDS)  # the same schema again is fine
    with pytest.raises(OrdoHttpError) as exists:
        await admin.create_collection("rooms", FIELDS[:1])
    assert (exists.value.status, exists.value.code) == (409, "collection_exists")

    written = await admin.write("rooms", [room(1, 10), room(2, 20), room(3, 30)])
    assert written["upserted"] == 3
    # Ids with `!` and `:` travel percent-encoded in the path.
    item = await admin.get_item("rooms", "!r1:example.org")
    assert item is not None and item["fields"] == {"name": "Room 1", "recency": 10, "unread": 0}
    if "version" in item:
        assert item["version"] == written["seq"]
    assert await admin.get_item("rooms", "!nope") is None
    with pytest.raises(OrdoHttpError) as missing:
        await admin.get_item("nowhere", "!r1")
    assert (missing.value.status, missing.value.code) == (404, "unknown_collection")

    page = await admin.query("rooms", {"sort": [{"field": "recency", "dir": "desc"}], "limit": 2})
    assert page["total"] == 3
    assert [i["id"] for i in page["items"]] == ["!r3:example.org", "!r2:example.org"]

    deleted = await admin.delete_item("rooms", "!r3:example.org")
    assert deleted["removed"] is True and deleted["seq"] > written["seq"]
    assert (await admin.delete_item("rooms", "!r3:example.org"))["removed"] is False


async def test_refused_batches_and_roles(server: OrdoServer) -> None:
    admin = OrdoHttp(server.http, token=server.token)
    await admin.create_collection("rooms", FIELDS)
    with pytest.raises(OrdoHttpError) as bad:
        await admin.write("rooms", [room(1, 1), {"op": "upsert", "id": "!x", "fields": {"recency": "soon"}}])
    assert (bad.value.status, bad.value.code) == (422, "invalid_batch")
    assert (await admin.query("rooms", {"limit": 1}))["total"] == 0, "a refused batch writes nothing"

    reader = OrdoHttp(server.http, token=mint_token(server.secret_file, "u1", "reader", 600))  # type: ignore[attr-defined]
    with pytest.raises(OrdoHttpError) as forbidden:
        await reader.write("rooms", [room(2, 2)])
    assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")


async def test_a_token_provider_is_asked_again_after_a_401(server: OrdoServer) -> None:
    calls: list[int] = []

    async def provider() -> str:
        calls.append(1)
        # The first token is refused (not a JWT); the second is good.
        return "not-a-jwt" if len(calls) == 1 else str(server.token)

    http = OrdoHttp(server.http, token_provider=provider)
    await http.create_collection("rooms", FIELDS)
    assert len(calls) == 2
    await http.write("rooms", [room(1, 1)])
    assert len(calls) == 2, "the good token is kept"


async def test_add_and_remove_a_field_and_drop_a_collection(server: OrdoServer) -> None:
    admin = OrdoHttp(server.http, token=server.token)
    await admin.create_collection("schema", FIELDS)
    written = await admin.write("schema", [room(1, 10)])
    added = await admin.add_field("schema", "pinned", "bool", default=True)
    assert added["name"] == "schema"
    assert [f["name"] for f in added["fields"]] == ["name", "recency", "unread", "pinned"]
    assert added["seq"] > written["seq"]
    item = await admin.get_item("schema", "!r1:example.org")
    assert item is not None and item["fields"]["pinned"] is True  # existing items got the default
    # No default: the field is null in existing items.
    await admin.add_field("schema", "note", "string")
    item = await admin.get_item("schema", "!r1:example.org")
    assert item is not None and item["fields"].get("note") is None
    with pytest.raises(OrdoHttpError) as taken:
        await admin.add_field("schema", "pinned", "bool")
    assert (taken.value.status, taken.value.code) == (400, "invalid_schema")

    writer = OrdoHttp(server.http, token=mint_token(server.secret_file, "u1", "writer", 600))  # type: ignore[attr-defined]
    for refused in (
        writer.add_field("schema", "x", "u64"),
        writer.remove_field("schema", "pinned"),
        writer.drop_collection("schema"),
    ):
        with pytest.raises(OrdoHttpError) as forbidden:
            await refused
        assert forbidden.value.status == 403

    removed = await admin.remove_field("schema", "pinned")
    assert [f["name"] for f in removed["fields"]] == ["name", "recency", "unread", "note"]
    assert removed["seq"] > added["seq"]
    with pytest.raises(OrdoHttpError) as gone:
        await admin.remove_field("schema", "pinned")
    assert (gone.value.status, gone.value.code) == (404, "not_found")

    dropped = await admin.drop_collection("schema")
    assert dropped == {"seq": dropped["seq"], "dropped": "schema"}
    assert dropped["seq"] > removed["seq"]
    with pytest.raises(OrdoHttpError) as missing:
        await admin.collection("schema")
    assert missing.value.status == 404


async def test_a_write_sent_again_with_its_idempotency_key_is_applied_once(server: OrdoServer) -> None:
    admin = OrdoHttp(server.http, token=server.token)
    await admin.create_collection("rooms", FIELDS)
    bump = [{"op": "upsert", "id": "!r1", "increment": {"unread": 1}}]
    first = await admin.write("rooms", bump, idempotency_key="bump-1")
    # The answer was lost, say: the same call again gets it, and nothing is written twice.
    assert await admin.write("rooms", bump, idempotency_key="bump-1") == first
    item = await admin.get_item("rooms", "!r1")
    assert item is not None and item["fields"]["unread"] == 1
    with pytest.raises(OrdoHttpError) as refused:
        await admin.write("rooms", [{"op": "remove", "id": "!r1"}], idempotency_key="bump-1")
    assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")
    removed = await admin.delete_item("rooms", "!r1", idempotency_key="del-1")
    assert await admin.delete_item("rooms", "!r1", idempotency_key="del-1") == removed
    assert removed["removed"] is True
