"""HTTP helpers (``docs/PROTOCOL.md``, "HTTP API"): schemas, writes, one-shot
queries and items. Standard library only (``urllib``), run in a thread so the
methods are ``async`` like the rest of the client."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ._errors import OrdoError

TokenProvider = Callable[[], "str | Awaitable[str]"]


class OrdoHttpError(OrdoError):
    """An error answer: the server's stable ``code``, its HTTP ``status``, and
    for a refused op of a batch (409 ``conflict``) the op's index ``op``."""

    def __init__(self, status: int, code: str, message: str, op: int | None = None) -> None:
        super().__init__(code, message)
        self.status = status
        self.op = op


_QUERY_PATH = re.compile(r"^/v1/collections/[^/]+/query(\?|$)")


def is_idempotent(method: str, path: str) -> bool:
    """Requests that change nothing, so that sending one again (to another
    node) is safe: GET and HEAD, and the one-shot query (a POST that only reads)."""
    verb = method.upper()
    if verb in ("GET", "HEAD"):
        return True
    return verb == "POST" and _QUERY_PATH.match(path) is not None


def _segment(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class OrdoHttp:
    """HTTP access to a server (``http://host:port``), or to several nodes of
    one cluster (a list of URLs).

    With several nodes, a request that cannot reach its node (the connection
    fails: ``OrdoError("connection_lost")``) moves the client to the next node
    for good (``current_url``); a request that changes nothing (GET, a query)
    is then sent again there, once per node, and so is one a node answers 503
    (lagging, or behind a ``min_seq``). Writes are never sent again: the node
    may have applied one before the connection broke, so the error is raised
    and the caller decides (read the item back, say).

    ``token``: a fixed bearer token; ``token_provider``: called (sync or async)
    for one at the first request and again after a 401, which is retried once.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        timeout: float = 30.0,
    ) -> None:
        bases = [base_url] if isinstance(base_url, str) else list(base_url)
        if not bases or not all(isinstance(url, str) and url for url in bases):
            raise ValueError("OrdoHttp needs at least one node URL")
        self.base_urls: tuple[str, ...] = tuple(url.rstrip("/") for url in bases)
        self._index = 0
        self._token = token
        self._token_provider = token_provider
        self._timeout = timeout

    @property
    def base_url(self) -> str:
        """The node requests go to now."""
        return self.base_urls[self._index]

    current_url = base_url

    async def create_collection(self, name: str, fields: Sequence[Mapping[str, str]]) -> Any:
        """``PUT /v1/collections/{name}``: creates it, or finds it with this very schema.
        ``fields``: ``[{"name": "unread", "type": "u64"}, ...]``."""
        return await self.request("PUT", f"/v1/collections/{_segment(name)}", {"fields": list(fields)})

    async def collection(self, name: str) -> Any:
        return await self.request("GET", f"/v1/collections/{_segment(name)}")

    async def add_field(self, collection: str, name: str, type: str, default: Any = None) -> Any:
        """``POST /v1/collections/{name}/fields`` (admin): appends a field and
        returns the collection plus ``"seq"``. Existing items get ``default``
        (``None``: the field is null in them); live subscriptions that did not
        name their fields get a ``Reset`` with it."""
        body: dict[str, Any] = {"name": name, "type": type}
        if default is not None:
            body["default"] = default
        return await self.request("POST", f"/v1/collections/{_segment(collection)}/fields", body)

    async def remove_field(self, collection: str, field: str) -> Any:
        """``DELETE /v1/collections/{name}/fields/{field}`` (admin): returns the
        collection plus ``"seq"``; subscriptions whose filter or sort reads the
        field end (``ended``, reason ``field_removed``)."""
        return await self.request("DELETE", f"/v1/collections/{_segment(collection)}/fields/{_segment(field)}")

    async def drop_collection(self, collection: str) -> Any:
        """``DELETE /v1/collections/{name}`` (admin): ``{"seq", "dropped"}``; its
        subscriptions end (``ended``, reason ``collection_dropped``)."""
        return await self.request("DELETE", f"/v1/collections/{_segment(collection)}")

    async def write(
        self, collection: str, ops: Sequence[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> Any:
        """``POST /v1/collections/{name}/batch``, applied whole or not at all; returns
        ``{"seq", "upserted", "removed"}`` once durable. An op is a plain dict:
        ``{"op": "upsert", "id": "!a", "fields": {...}, "increment": {"unread": 1},
        "set_max": {...}, "set_min": {...}, "if": {"version": 41}}`` or
        ``{"op": "remove", "id": "!b", "if": {"exists": True}}``.

        ``idempotency_key`` (1 to 128 of ``[A-Za-z0-9_.:-]``, a UUID say) is sent as
        ``Idempotency-Key``: calling ``write`` again with the same key and ops after an
        answer was lost returns the first answer without writing again (on the same
        node, within 24 h: docs/PROTOCOL.md, "Idempotency keys"). Writes are never
        sent again by the client itself."""
        path = f"/v1/collections/{_segment(collection)}/batch"
        return await self.request("POST", path, {"ops": list(ops)}, headers=_idempotency(idempotency_key))

    async def query(self, collection: str, view: Mapping[str, Any]) -> Any:
        """``POST /v1/collections/{name}/query``: ``{"total", "offset", "items"}``."""
        body = {key: value for key, value in view.items() if value is not None}
        return await self.request("POST", f"/v1/collections/{_segment(collection)}/query", body)

    async def get_item(self, collection: str, item_id: str) -> Any | None:
        """The item (with its ``version``), or ``None`` when there is none (a missing collection raises)."""
        try:
            return await self.request("GET", f"/v1/collections/{_segment(collection)}/items/{_segment(item_id)}")
        except OrdoHttpError as error:
            if error.code == "not_found":
                return None
            raise

    async def delete_item(self, collection: str, item_id: str, *, idempotency_key: str | None = None) -> Any:
        """``{"seq", "removed"}``; ``removed`` is false when there was no such item.
        ``idempotency_key``: as for ``write``."""
        path = f"/v1/collections/{_segment(collection)}/items/{_segment(item_id)}"
        return await self.request("DELETE", path, headers=_idempotency(idempotency_key))

    async def request(
        self, method: str, path: str, body: Any = None, *, headers: Mapping[str, str] | None = None
    ) -> Any:
        """Any request, with extra ``headers`` if given; the answer's JSON, or ``OrdoHttpError``."""
        extra = dict(headers or {})
        if self._token is None and self._token_provider is not None:
            self._token = await self._fresh_token()
        retry = is_idempotent(method, path)
        tries = 0
        while True:
            tries += 1
            index = self._index
            base = self.base_urls[index]
            try:
                status, answer = await asyncio.to_thread(self._send, base, method, path, body, self._token, extra)
                if status == 401 and self._token_provider is not None:
                    self._token = await self._fresh_token()
                    status, answer = await asyncio.to_thread(self._send, base, method, path, body, self._token, extra)
            except OrdoError as error:
                if error.code != "connection_lost":
                    raise
                # No answer from this node: the next request goes to the next one.
                if self._index == index:
                    self._index = (index + 1) % len(self.base_urls)
                if not retry or tries >= len(self.base_urls):
                    raise
                continue
            if status == 503 and retry and tries < len(self.base_urls):
                if self._index == index:
                    self._index = (index + 1) % len(self.base_urls)
                continue
            break
        if not 200 <= status < 300:
            error = answer.get("error") if isinstance(answer, dict) else None
            error = error if isinstance(error, dict) else {}
            code = error.get("code") if isinstance(error.get("code"), str) else "unknown"
            message = error.get("message") if isinstance(error.get("message"), str) else str(answer)
            op = error.get("op") if isinstance(error.get("op"), int) else None
            raise OrdoHttpError(status, code, message, op)
        return answer

    async def _fresh_token(self) -> str:
        assert self._token_provider is not None
        token = self._token_provider()
        if inspect.isawaitable(token):
            token = await token
        if not isinstance(token, str):
            raise OrdoError("token_provider", "the token provider returned no string")
        return token

    def _send(
        self, base: str, method: str, path: str, body: Any, token: str | None, headers: Mapping[str, str]
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base + path, data=data, method=method, headers=dict(headers))
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        except (urllib.error.URLError, OSError) as error:
            raise OrdoError("connection_lost", f"{method} {path}: {error}") from error
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")


def _idempotency(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Idempotency-Key": key}
