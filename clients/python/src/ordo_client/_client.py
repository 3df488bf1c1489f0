"""The asyncio WebSocket client: :class:`OrdoClient` and its :class:`LiveList`s."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import inspect
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from ._errors import OrdoError
from ._nodes import NodeRotation
from ._protocol import (
    AuthExpired,
    Authed,
    Ended,
    ErrorEvent,
    Event,
    Gap,
    InvalidDiffs,
    DigestMismatch,
    ProtocolState,
    Resumed,
    Unsubscribed,
    Update,
    Welcome,
)

__all__ = ["LiveList", "OrdoClient", "Update"]

logger = logging.getLogger("ordo_client")

ErrorCallback = Callable[[OrdoError], "Awaitable[None] | None"]
TokenProvider = Callable[[], "str | Awaitable[str]"]
#: Called with ``(from_url, to_url)`` when another node than before serves the client.
FailoverCallback = Callable[[str, str], "Awaitable[None] | None"]

#: Close code of a connection without a valid token (expired and not
#: refreshed, or no `auth` in time).
CLOSE_UNAUTHORIZED = 4401
#: Error codes that answer an `auth` op.
_AUTH_ERRORS = ("unauthorized", "forbidden")
#: A refresh never comes sooner than this after the previous one (a provider
#: handing out tokens about to expire would otherwise be called in a loop).
_MIN_REFRESH_DELAY = 1.0

_KEEP: Any = object()
_END: Any = object()

# websockets >= 15 reads proxy settings from the environment unless told not to.
_CONNECT_OPTIONS: dict[str, Any] = {}
if "proxy" in inspect.signature(connect.__init__).parameters:
    _CONNECT_OPTIONS["proxy"] = None


def token_times(token: str) -> tuple[float | None, float | None]:
    """``(exp, iat)`` from a JWT's payload (base64url JSON; the signature is
    not checked: the server does that). ``None`` for what is absent or not a
    number, and for a token that is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None, None
    body = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        return None, None
    if not isinstance(claims, dict):
        return None, None

    def number(key: str) -> float | None:
        value = claims.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return number("exp"), number("iat")


def refresh_delay(token: str, expires_at: float | None, now: float) -> float | None:
    """Seconds from ``now`` (unix time) until the token should be replaced:
    at ``exp - min(60 s, lifetime / 5)``, the lifetime counted from ``iat`` (or
    from now without one). ``exp`` comes from the token, else from
    ``expires_at`` (the ``authed`` frame's). ``None``: the token never expires
    as far as the client can tell."""
    exp, iat = token_times(token)
    if exp is None:
        exp = expires_at
    if exp is None:
        return None
    start = iat if iat is not None and iat <= now else now
    lifetime = max(0.0, exp - start)
    return max(exp - min(60.0, lifetime / 5) - now, _MIN_REFRESH_DELAY)


class _TokenBucket:
    """Keeps the client under the server's message rate: an op refused with
    `rate_limited` did nothing, and pacing is simpler than re-sending it."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = max(rate, 1.0)
        self.burst = max(burst, 1.0)
        self.tokens = self.burst
        self.last = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self.tokens) / self.rate)


class LiveList:
    """A live window of a collection: ``items`` always holds the subscription's
    current contents, as of the last frame received.

    Iterate it (``async for update in live_list``) to receive one
    :class:`Update` per frame. Errors concerning the list (``gap``, a refused
    ``set_range``/``set_view``, a refused re-subscription) are raised by the
    iterator as :class:`OrdoError`, in order with the updates, unless an
    ``on_error`` callback was given to :meth:`OrdoClient.subscribe`, which is
    then called instead. After an error is raised the list goes on: iterate
    again to continue. The iteration ends when the list is closed.

    Updates are queued only once the list has been iterated (``aiter`` called);
    if more than ``max_queued`` wait, they are collapsed into one ``Reset`` of
    the current items, so a consumer applying diffs stays exact.
    """

    def __init__(
        self,
        client: OrdoClient,
        sub: str,
        spec: dict[str, Any],
        on_error: ErrorCallback | None,
        max_queued: int,
    ) -> None:
        self._client = client
        self._sub = sub
        self._spec = spec
        self._on_error = on_error
        self._max_queued = max_queued
        self._items: list[dict[str, Any]] = []
        self._seq = 0
        self._queue: deque[Any] = deque()
        self._queue_enabled = False
        self._wakeup = asyncio.Event()
        self._changed = asyncio.Event()
        self._first = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self._undo: dict[str, Any] | None = None
        #: Set when the list ended because of an error (a refused re-subscription...).
        self.error: OrdoError | None = None
        #: Frames whose window digest was not the list's once applied: each was
        #: dropped, reported (``on_error`` with code ``digest_mismatch``) and the
        #: list subscribed again. 0 on a healthy connection.
        self.digest_mismatches = 0
        self._total: int | None = None
        self._write_seq: int | None = None
        self._floor_seq: int | None = None
        self._ended: Ended | None = None

    # ---- reading --------------------------------------------------------

    @property
    def sub(self) -> str:
        """The subscription id on the connection."""
        return self._sub

    @property
    def collection(self) -> str:
        return str(self._spec["collection"])

    @property
    def items(self) -> list[dict[str, Any]]:
        """The current contents: item dicts ``{"id", "fields", "payload"}``.
        A new list object after each frame (treat it as read-only)."""
        return self._items

    @property
    def seq(self) -> int:
        """The ``seq`` of the last frame applied."""
        return self._seq

    @property
    def total(self) -> int | None:
        """The number of items in the whole view (not just the window), from
        the last frame that said; ``None`` before any."""
        return self._total

    @property
    def write_seq(self) -> int | None:
        """The last write (batch ``seq``, as a write's answer gives it) the
        items reflect; ``None`` before the first frame."""
        return self._write_seq

    @property
    def floor_seq(self) -> int | None:
        """The greatest ``write_seq`` this list has applied (``None``: none yet).
        Every later subscribe or resume of it, on this node or another, asks for
        ``min_seq`` = this: the list never goes back in time."""
        return self._floor_seq

    @property
    def ended(self) -> Ended | None:
        """Why the server ended the subscription (``reason``:
        ``collection_dropped``, ``field_removed`` or ``access_ended``), or ``None``. An ended
        list is closed and not re-subscribed; its id is free again."""
        return self._ended

    @property
    def filter(self) -> Any:
        return self._spec.get("filter")

    @property
    def sort(self) -> list[dict[str, Any]] | None:
        return self._spec.get("sort")

    @property
    def offset(self) -> int:
        return int(self._spec.get("offset") or 0)

    @property
    def limit(self) -> int:
        return int(self._spec["limit"])

    @property
    def fields(self) -> list[str] | None:
        return self._spec.get("fields")

    @property
    def payload(self) -> bool:
        return bool(self._spec.get("payload", True))

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def __repr__(self) -> str:
        return f"<LiveList {self._sub!r} of {self.collection!r}: {len(self._items)} items, seq {self._seq}>"

    def __aiter__(self) -> LiveList:
        self._queue_enabled = True
        return self

    async def __anext__(self) -> Update | Ended:
        while True:
            if self._queue:
                entry = self._queue.popleft()
                if entry is _END:
                    self._queue.appendleft(_END)
                    raise StopAsyncIteration
                if isinstance(entry, OrdoError):
                    raise entry
                return entry  # type: ignore[no-any-return]
            if self._done.is_set():
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def wait_until(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Waits until ``predicate(items)`` holds (checked now and after each
        frame); returns the items. Raises :class:`asyncio.TimeoutError` after
        ``timeout`` seconds, and the list's error if it ends first."""

        async def wait() -> list[dict[str, Any]]:
            while not predicate(self._items):
                if self._done.is_set():
                    raise self.error or OrdoError("closed", "the list is closed", self._sub)
                await self._changed.wait()
            return self._items

        return await asyncio.wait_for(wait(), timeout)

    # ---- changing -------------------------------------------------------

    async def set_range(self, offset: int, limit: int) -> None:
        """Moves or resizes the window ("load more"). Returns once the op is
        sent (or, while disconnected, once it is recorded: the resume carries
        it); the diffs arrive as an update. A refusal is reported like any
        error of the list, and the list keeps its previous range."""
        self._check_open()
        if not isinstance(offset, int) or not isinstance(limit, int) or offset < 0 or limit < 0:
            raise ValueError("offset and limit are non-negative integers")
        max_limit = self._client._state.limits.get("max_window_limit")
        if isinstance(max_limit, int) and limit > max_limit:
            raise OrdoError("limit_exceeded", f"a window holds at most {max_limit} items", self._sub)
        self._undo = dict(self._spec)
        self._spec["offset"] = offset
        self._spec["limit"] = limit
        await self._client._send_change(self, {"op": "set_range", "sub": self._sub, "offset": offset, "limit": limit})

    async def set_view(self, *, filter: Any = _KEEP, sort: Sequence[Mapping[str, Any]] | None = _KEEP) -> None:
        """Changes the filter and/or sort, keeping the range (an argument not
        given keeps its current value; ``None`` clears it). Returns once the op
        is sent; see :meth:`set_range` for refusals."""
        self._check_open()
        self._undo = dict(self._spec)
        if filter is not _KEEP:
            self._spec["filter"] = filter
        if sort is not _KEEP:
            self._spec["sort"] = [dict(key) for key in sort] if sort is not None else None
        op: dict[str, Any] = {"op": "set_view", "sub": self._sub}
        if self._spec.get("filter") is not None:
            op["filter"] = self._spec["filter"]
        if self._spec.get("sort") is not None:
            op["sort"] = self._spec["sort"]
        await self._client._send_change(self, op)

    async def close(self) -> None:
        """Unsubscribes and waits for the server's confirmation (if connected).
        The iteration ends; ``items`` keeps the last contents."""
        if self._done.is_set():
            return
        self._client._unsubscribe(self)
        await self._done.wait()

    def _check_open(self) -> None:
        if self._done.is_set():
            raise self.error or OrdoError("closed", "the list is closed", self._sub)

    # ---- fed by the client ----------------------------------------------

    def _push(self, entry: Any) -> None:
        if not self._queue_enabled:
            return
        self._queue.append(entry)
        if len(self._queue) > self._max_queued:
            # Collapse: errors kept, updates replaced by one Reset of the items now.
            errors = [e for e in self._queue if isinstance(e, OrdoError)]
            self._queue.clear()
            self._queue.extend(errors)
            values = list(self._items)
            self._queue.append(Update(self._sub, self._seq, [{"Reset": {"values": values}}], values, True))
        self._wakeup.set()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _on_update(self, update: Update) -> None:
        self._items = update.items
        self._seq = update.seq
        self._total = update.total
        self._write_seq = update.write_seq
        if update.write_seq is not None and (self._floor_seq is None or update.write_seq > self._floor_seq):
            self._floor_seq = update.write_seq
        self._push(update)
        self._notify()
        if not self._first.done():
            self._first.set_result(None)

    def _on_ended(self, ended: Ended) -> None:
        """The server ended the subscription: the iteration yields ``ended``
        last, then stops; ``items`` keeps the last contents."""
        self._ended = ended
        self._push(ended)
        if not self._first.done():
            self._finish(OrdoError(ended.reason, ended.message, self._sub))
        else:
            self._finish()

    def _report(self, error: OrdoError) -> None:
        """A non-fatal error of this list."""
        if self._on_error is not None:
            self._client._call_back(self._on_error, error)
        elif self._queue_enabled:
            self._push(error)
        else:
            logger.warning("ordo: list %r: %s", self._sub, error)

    def _finish(self, error: OrdoError | None = None) -> None:
        """The list ended: closed, or failed with ``error``."""
        if self._done.is_set():
            return
        if error is not None:
            self.error = error
            if not self._first.done():
                self._first.set_exception(error)
                # A failed subscribe raises from `subscribe`; nobody iterates.
                self._first.exception()
            else:
                self._report(error)
        elif not self._first.done():
            self._first.set_exception(OrdoError("closed", "the list was closed before its first frame", self._sub))
            self._first.exception()
        self._done.set()
        if self._queue_enabled:
            self._queue.append(_END)
        self._wakeup.set()
        self._notify()


@dataclass
class _Pending:
    """Ops to send in order on the connection of ``generation``; ``done``
    tells whether they went out."""

    ops: list[dict[str, Any]]
    generation: int
    done: asyncio.Future[bool]


class OrdoClient:
    """A connection to an Ordo server's WebSocket (``ws://host:port/v1/ws``)
    holding live lists.

    Use as ``async with OrdoClient(url) as client:`` (or ``await
    client.connect()`` / ``await client.close()``). The first connection must
    succeed (its error is raised). With ``reconnect=True``, a lost connection
    (including the server's close code 1001 when it stops) is re-opened with
    exponential backoff and jitter (``backoff_initial`` doubling up to
    ``backoff_max`` seconds), and every live list is resumed with one
    ``resume`` op; lists continue without the caller doing anything.

    ``url`` may be a list of node URLs (of one cluster): the client connects
    to the first that answers, and a lost connection moves it to the next
    node, round robin; the backoff is waited only once a full round of nodes
    failed. Every resume entry and re-subscription carries ``min_seq`` = the
    greatest ``write_seq`` the list applied, so a node that lags holds it (or
    refuses it, ``seq_not_reached``: the client then moves on again, keeping
    the list as it was) and a list never goes back in time. ``current_url``
    names the node in use; ``on_failover(from_url, to_url)`` is called when
    another node serves the client.
    With ``reconnect=False`` a lost connection ends every list with
    ``OrdoError("connection_lost")``.

    ``on_error`` receives errors that concern no list (or a list without a
    consumer); by default they are logged (logger ``ordo_client``).

    How ops and the connection fit together: every op first changes the local
    state (``ProtocolState``), then is queued for the connection that was
    current at that instant. If that connection is lost before the op goes
    out, the op is dropped: the ``resume`` of the next connection is built
    from the local state, so it carries the change anyway (a subscription
    still waiting for its first frame, a new range or view, an unsubscribe —
    by leaving the subscription out).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        open_timeout: float = 10.0,
        on_error: ErrorCallback | None = None,
        max_queued_updates: int = 10_000,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        on_failover: FailoverCallback | None = None,
    ) -> None:
        if token is not None and token_provider is not None:
            raise ValueError("pass token or token_provider, not both")
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("token is a non-empty string")
        if token_provider is not None and not callable(token_provider):
            raise ValueError("token_provider is a callable returning a token (or an awaitable of one)")
        self._nodes = NodeRotation(url, backoff_initial, backoff_max)
        self._on_failover = on_failover
        #: The node whose connection was last established (``None``: none yet).
        self._served_by: str | None = None
        self.reconnect = reconnect
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.open_timeout = open_timeout
        self._on_error = on_error
        self._max_queued = max_queued_updates
        self._state = ProtocolState()
        self._lists: dict[str, LiveList] = {}
        self._ws: ClientConnection | None = None
        self._generation = 0
        self._ready = False
        self._send_lock: asyncio.Lock | None = None
        self._outbox: asyncio.Queue[_Pending] | None = None
        self._bucket = _TokenBucket(90.0, 100.0)
        self._supervisor: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._stopped = False
        self._connected_event: asyncio.Event | None = None
        self._next_sub = 0
        self._token = token
        self._token_provider = token_provider
        self._identity: Authed | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        #: The token of the `auth` op sent on the live connection and not yet answered.
        self._auth_inflight: str | None = None
        #: How many times the connection was re-opened.
        self.reconnects = 0

    # ---- connection -----------------------------------------------------

    @property
    def session(self) -> str | None:
        """The server's session token (from ``welcome``/``resumed``)."""
        return self._state.session

    @property
    def url(self) -> str:
        """The URL of the node in use (or being connected to); same as ``current_url``."""
        return self._nodes.current

    @property
    def current_url(self) -> str:
        """The URL of the node in use (or being connected to)."""
        return self._nodes.current

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node URL, in rotation order."""
        return self._nodes.urls

    @property
    def limits(self) -> dict[str, Any]:
        """The server's limits, from its ``welcome``."""
        return self._state.limits

    @property
    def connected(self) -> bool:
        return self._ready

    @property
    def identity(self) -> Authed | None:
        """Who the connection is authenticated as (``sub``, ``role``,
        ``expires_at``, from the last ``authed``); ``None`` before, or when the
        server runs without auth."""
        return self._identity

    @property
    def lists(self) -> dict[str, LiveList]:
        """The live lists by subscription id."""
        return dict(self._lists)

    async def __aenter__(self) -> OrdoClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Opens the connection and reads the server's ``welcome``."""
        if self._supervisor is not None:
            raise RuntimeError("already connected")
        self._send_lock = asyncio.Lock()
        self._outbox = asyncio.Queue()
        self._connected_event = asyncio.Event()
        # The first connection: each node once, in order; the last error is raised.
        for tried in range(len(self._nodes.urls)):
            try:
                ws, token, authed = await self._open()
                break
            except Exception as error:
                if isinstance(error, InvalidURI) or tried + 1 == len(self._nodes.urls):
                    raise
                logger.info("ordo: node %s: %s; trying the next one", self._nodes.current, error)
                self._nodes.fail()
        self._nodes.succeeded()
        self._served_by = self._nodes.current
        self._ws = ws
        self._generation += 1
        self._authenticated(token, authed)
        self._ready = True
        self._connected_event.set()
        self._supervisor = asyncio.create_task(self._supervise(), name="ordo-client-reader")
        self._sender = asyncio.create_task(self._send_loop(), name="ordo-client-sender")

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Waits until the connection is up (after a reconnect: resumed)."""
        assert self._connected_event is not None, "connect() first"
        await asyncio.wait_for(self._connected_event.wait(), timeout)

    async def close(self) -> None:
        """Closes the connection (code 1000) and ends every list."""
        if self._closing:
            return
        self._closing = True
        self._ready = False
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 5)
        tasks = [
            task for task in (self._supervisor, self._sender, self._refresh_task, *self._tasks) if task is not None
        ]
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._stop_lists(None)

    def _stop_lists(self, error: OrdoError | None) -> None:
        self._stopped = True
        self._ready = False
        for live in list(self._lists.values()):
            live._finish(error)
        self._lists.clear()
        self._state.subs.clear()
        if self._outbox is not None:
            while not self._outbox.empty():
                pending = self._outbox.get_nowait()
                if not pending.done.done():
                    pending.done.set_result(False)

    async def _open(self) -> tuple[ClientConnection, str | None, Authed | None]:
        """A new connection whose ``welcome`` has been read, authenticated if
        the server asks for it and a token is configured; returns it with the
        token sent and the server's ``authed`` answer (both ``None`` without
        auth). Raises ``OrdoError`` (``unauthorized``, ``forbidden``,
        ``token_provider``, ``bad_frame``) when that fails."""
        ws = await connect(
            self._nodes.current,
            open_timeout=self.open_timeout,
            max_size=None,
            compression=None,
            **_CONNECT_OPTIONS,
        )
        token: str | None = None
        authed: Authed | None = None
        try:
            raw = await asyncio.wait_for(ws.recv(), self.open_timeout)
            events = self._parse(raw)
            if not events or not isinstance(events[0], Welcome):
                raise OrdoError("bad_frame", f"expected a welcome frame, got {raw!r:.200}")
            welcome = events[0]
            limits = self._state.limits
            rate = limits.get("ws_messages_per_second")
            burst = limits.get("ws_message_burst")
            if isinstance(rate, (int, float)) and isinstance(burst, (int, float)):
                # Stay a little under the server's token bucket.
                self._bucket = _TokenBucket(rate * 0.9, max(1.0, burst / 2))
            else:
                self._bucket = _TokenBucket(90.0, 100.0)
            if welcome.auth != "none":
                if self._token is None and self._token_provider is None:
                    if welcome.auth == "required":
                        raise OrdoError(
                            "unauthorized", "the server requires a token: pass OrdoClient(token=...) or token_provider="
                        )
                else:
                    # Within the server's deadline for `auth` (10 s).
                    token = await asyncio.wait_for(self._get_token(), self.open_timeout)
                    await self._bucket.take()
                    await ws.send(json.dumps({"op": "auth", "token": token}))
                    authed = await self._await_authed(ws)
        except BaseException:
            await ws.close()
            raise
        return ws, token, authed

    def _parse(self, raw: str | bytes) -> list[Event]:
        """A server frame's events; any failure becomes ``OrdoError`` ``bad_frame``."""
        try:
            return self._state.handle_frame(json.loads(raw))
        except OrdoError:
            raise
        except Exception as error:
            raise OrdoError("bad_frame", _describe(error)) from None

    async def _await_authed(self, ws: ClientConnection) -> Authed:
        """Reads frames until the answer to the ``auth`` just sent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.open_timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError("no answer to `auth`")
            raw = await asyncio.wait_for(ws.recv(), remaining)
            for event in self._parse(raw):
                if isinstance(event, Authed):
                    return event
                if isinstance(event, ErrorEvent) and event.sub is None:
                    raise event.to_exception()

    async def _get_token(self) -> str:
        """The static token, or a fresh one from the provider."""
        if self._token_provider is None:
            assert self._token is not None
            return self._token
        try:
            result: Any = self._token_provider()
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise OrdoError("token_provider", f"the token provider failed: {error!r}") from error
        if not isinstance(result, str) or not result:
            raise OrdoError("token_provider", f"the token provider returned {result!r:.80}, not a token string")
        return result

    # ---- token refresh --------------------------------------------------

    def _authenticated(self, token: str | None, authed: Authed | None) -> None:
        """The current connection accepted ``token``: remember who we are and
        plan the next refresh."""
        if authed is not None:
            self._identity = authed
        if token is None or self._token_provider is None:
            return  # a static token: a refresh would send the same one
        delay = refresh_delay(token, authed.expires_at if authed is not None else None, time.time())
        if delay is not None:
            self._schedule_refresh(delay)

    def _schedule_refresh(self, delay: float) -> None:
        """(Re)plans the refresh on the current connection in ``delay`` seconds."""
        task = self._refresh_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
        if self._token_provider is None or self._closing:
            self._refresh_task = None
            return
        self._refresh_task = asyncio.create_task(self._refresh_after(delay, self._generation), name="ordo-client-auth")

    def _cancel_refresh(self) -> None:
        task, self._refresh_task = self._refresh_task, None
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
        self._auth_inflight = None

    async def _refresh_after(self, delay: float, generation: int) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if generation != self._generation or not self._ready or self._closing or self._auth_inflight is not None:
            return
        try:
            token = await self._get_token()
        except OrdoError as error:
            self._report(error)
            self._schedule_refresh(self._auth_retry_delay())
            return
        if generation != self._generation or not self._ready or self._closing:
            return  # the connection changed meanwhile: the new one authenticated itself
        self._auth_inflight = token
        self._enqueue([{"op": "auth", "token": token}])

    def _auth_retry_delay(self) -> float:
        return max(1.0, self.backoff_max)

    async def _supervise(self) -> None:
        try:
            while not self._closing:
                ws = self._ws
                assert ws is not None
                closed = await self._read_loop(ws)
                if self._closing:
                    return
                self._ready = False
                self._cancel_refresh()
                assert self._connected_event is not None
                self._connected_event.clear()
                frame = closed.rcvd if closed is not None else None
                code = frame.code if frame is not None else None
                reason = frame.reason if frame is not None else ""
                if code == CLOSE_UNAUTHORIZED:
                    # The token expired unrefreshed: the reconnection gets a fresh one.
                    logger.warning("ordo: the server closed the connection: no valid token (%s)", reason or "4401")
                else:
                    logger.info("ordo: connection lost (close code %s, %s)", code, reason or "no reason")
                if not self.reconnect:
                    self._stop_lists(OrdoError("connection_lost", f"the connection closed (code {code})"))
                    return
                await self._reconnect()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug: do not leave lists waiting forever
            logger.exception("ordo: the connection task failed")
            self._stop_lists(OrdoError("internal", f"the client's connection task failed: {error!r}"))
            raise

    async def _reconnect(self) -> None:
        """Connects again: to the next node (round robin), after a jitter within
        a round of the nodes, or the backoff once a whole round failed."""
        attempt = 0
        while not self._closing:
            await asyncio.sleep(self._nodes.fail())
            attempt += 1
            try:
                ws, token, authed = await self._open()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if isinstance(error, InvalidURI):
                    raise
                if isinstance(error, OrdoError):
                    # Refused token, failing provider, broken welcome: the
                    # caller hears of it; the next attempt asks the provider again.
                    self._report(error)
                    logger.info("ordo: reconnect attempt %d failed: %s", attempt, error)
                elif isinstance(error, (OSError, asyncio.TimeoutError, ConnectionClosed, InvalidHandshake)):
                    logger.info("ordo: reconnect attempt %d failed: %s", attempt, error)
                else:
                    logger.warning("ordo: reconnect attempt %d failed: %r", attempt, error)
                continue
            assert self._send_lock is not None
            async with self._send_lock:
                # No await between the new generation and the resume's
                # snapshot of the local state: an op is either in the resume
                # or queued for this connection.
                self._ws = ws
                self._generation += 1
                self._authenticated(token, authed)
                op, dropped = self._state.resume_op()
                for state in dropped:
                    live = self._lists.pop(state.sub, None)
                    if live is not None:
                        live._finish()
                if op is not None:
                    try:
                        await self._bucket.take()
                        await ws.send(json.dumps(op))
                    except ConnectionClosed:
                        pass  # the read loop sees the closure
                self._ready = True
            self._nodes.succeeded()
            self.reconnects += 1
            url = self._nodes.current
            if self._served_by is not None and self._served_by != url and self._on_failover is not None:
                try:
                    result = self._on_failover(self._served_by, url)
                    if inspect.isawaitable(result):
                        self._spawn(result)
                except Exception:
                    logger.exception("ordo: failover callback failed")
            if self._served_by != url:
                logger.info("ordo: failed over from %s to %s", self._served_by, url)
            self._served_by = url
            assert self._connected_event is not None
            self._connected_event.set()
            return

    async def _read_loop(self, ws: ClientConnection) -> ConnectionClosed | None:
        """Handles frames until the connection closes; returns how it closed."""
        while True:
            try:
                raw = await ws.recv()
            except ConnectionClosed as closed:
                return closed
            self._handle_raw(raw)

    def _handle_raw(self, raw: str | bytes) -> None:
        """Handles one server frame. Nothing in it may end the connection
        task: a frame that cannot be parsed or handled (not JSON, nested too
        deep, an unexpected shape, a failure while dispatching it) is reported
        and the list it concerned is re-subscribed — every list when its
        ``sub`` cannot be read — since the frame may have carried its diffs."""
        frame: Any = None
        try:
            frame = json.loads(raw)
            events = self._state.handle_frame(frame)
            for event in events:
                self._dispatch(event)
        except Exception as error:  # noqa: BLE001 (see the docstring)
            try:
                self._bad_frame(frame, error)
            except Exception:  # never let the recovery itself end the connection
                logger.exception("ordo: recovering from a bad frame failed")

    def _bad_frame(self, frame: Any, error: Exception) -> None:
        code = error.code if isinstance(error, OrdoError) else "bad_frame"
        message = error.message if isinstance(error, OrdoError) else _describe(error)
        sub = frame.get("sub") if isinstance(frame, dict) else None
        if isinstance(sub, str):
            known = sub in self._state.subs
            report = OrdoError(code, f"{message}; {'the list is subscribed again' if known else 'no such list'}", sub)
            live = self._lists.get(sub)
            if live is not None:
                live._report(report)
            else:
                self._report(report)
            affected = [sub]
        else:
            self._report(OrdoError(code, f"{message}; every list is subscribed again"))
            affected = list(self._state.subs)
            if self._auth_inflight is not None:
                # It may have been the answer to our `auth`: ask again later.
                self._auth_inflight = None
                self._schedule_refresh(self._auth_retry_delay())
        for name in affected:
            self._resubscribe(name)

    def _resubscribe(self, sub: str) -> None:
        """Unsubscribes and subscribes ``sub`` anew: its first frame, a
        ``Reset``, replaces the list. Not for a list being closed or already
        being re-subscribed."""
        state = self._state.subs.get(sub)
        if state is None or state.spec is None or state.status in ("closing", "resubscribing"):
            return
        ops = self._state.begin_resubscribe(sub)
        if ops:
            self._enqueue(ops)

    async def _send_loop(self) -> None:
        assert self._outbox is not None and self._send_lock is not None
        while True:
            pending = await self._outbox.get()
            sent = False
            async with self._send_lock:
                for op in pending.ops:
                    if self._generation != pending.generation or self._ws is None:
                        break
                    await self._bucket.take()
                    try:
                        await self._ws.send(json.dumps(op))
                    except ConnectionClosed:
                        break
                else:
                    sent = True
            if not pending.done.done():
                pending.done.set_result(sent)

    def _enqueue(self, ops: list[dict[str, Any]]) -> asyncio.Future[bool]:
        """Queues ops for the current connection (call right after changing
        the local state, with no await in between)."""
        assert self._outbox is not None
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait(_Pending(ops, self._generation, done))
        return done

    # ---- events ---------------------------------------------------------

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Update):
            live = self._lists.get(event.sub)
            if live is not None:
                live._on_update(event)
        elif isinstance(event, (Gap, InvalidDiffs, DigestMismatch)):
            live = self._lists.get(event.sub)
            if live is not None and isinstance(event, DigestMismatch):
                live.digest_mismatches += 1
            ops = self._state.begin_resubscribe(event.sub)
            if ops:
                self._enqueue(ops)
            if live is not None:
                live._report(event.to_exception())
        elif isinstance(event, Authed):
            token, self._auth_inflight = self._auth_inflight, None
            self._identity = event
            if token is not None:
                self._authenticated(token, event)
        elif isinstance(event, AuthExpired):
            if self._token_provider is None:
                self._report(
                    OrdoError(
                        "auth_expired",
                        f"the connection's token expired; without a token_provider it cannot be refreshed "
                        f"(the server closes the connection in {event.grace_secs} s)",
                    )
                )
            elif self._auth_inflight is None:
                self._schedule_refresh(0)
        elif isinstance(event, ErrorEvent):
            live = self._lists.get(event.sub) if event.sub is not None else None
            if event.sub is None and event.code in _AUTH_ERRORS and self._auth_inflight is not None:
                # The refresh was refused; the connection keeps its token until it expires.
                self._auth_inflight = None
                self._report(event.to_exception())
                self._schedule_refresh(self._auth_retry_delay())
            elif live is None:
                self._report(event.to_exception())
            elif event.fatal and self._behind(live, event.code, event.message):
                pass
            elif event.fatal:
                self._lists.pop(live.sub, None)
                live._finish(event.to_exception())
            else:
                if live._undo is not None and event.code in ("invalid_view", "limit_exceeded", "bad_request"):
                    # The refused set_range/set_view left the server's definition as it was.
                    live._spec = live._undo
                    live._undo = None
                    state = self._state.subs.get(live.sub)
                    if state is not None:
                        state.spec = live._spec
                live._report(event.to_exception())
        elif isinstance(event, Unsubscribed):
            live = self._lists.pop(event.sub, None)
            if live is not None:
                live._finish()
        elif isinstance(event, Ended):
            # Not re-subscribed: the collection or field is gone; the id is free.
            live = self._lists.pop(event.sub, None)
            logger.info("ordo: subscription %r ended: %s (%s)", event.sub, event.reason, event.message)
            if live is not None:
                live._on_ended(event)
        elif isinstance(event, Resumed):
            for sub, (code, message) in event.errors.items():
                live = self._lists.get(sub)
                if live is not None and self._behind(live, code, message):
                    continue
                live = self._lists.pop(sub, None)
                if live is not None:
                    live._finish(OrdoError(code, message, sub))
            logger.info("ordo: resumed session %s: replayed %s, reset %s", event.session, event.replayed, event.reset)

    def _behind(self, live: LiveList, code: str, message: str) -> bool:
        """A refused subscribe or resume entry that another node may take:
        ``lagging`` (the node is too far behind its cluster's log to take
        subscribers), or, for a list that has shown data, ``seq_not_reached``
        (this node has not caught up with what the list showed). The list
        keeps its items; the client drops the connection and moves to the next
        node (the same one again, after the backoff, with one URL), where the
        resume asks for the same ``min_seq``. False for any other refusal."""
        behind = code == "lagging" or (code == "seq_not_reached" and live.floor_seq is not None)
        if not behind or not self.reconnect:
            return False
        live._report(OrdoError(code, message, live.sub))
        # The refusal removed the subscription from the local state: the next
        # connection's resume lists it afresh, with the list's floor as `min_seq`.
        state = self._state.seed(live.sub, (), 0, live._spec)
        state.floor_seq = live.floor_seq
        ws = self._ws
        if ws is not None and self._ready:
            self._ready = False
            self._spawn(ws.close(1000, "node behind"))
        return True

    def _report(self, error: OrdoError) -> None:
        if self._on_error is not None:
            self._call_back(self._on_error, error)
        else:
            logger.warning("ordo: %s", error)

    def _call_back(self, callback: ErrorCallback, error: OrdoError) -> None:
        try:
            result = callback(error)
            if inspect.isawaitable(result):
                self._spawn(result)
        except Exception:
            logger.exception("ordo: error callback failed")

    def _spawn(self, awaitable: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception:
                logger.exception("ordo: error callback failed")

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- subscriptions --------------------------------------------------

    def _check_running(self) -> None:
        if self._closing or self._stopped or self._supervisor is None:
            raise OrdoError("closed", "the client is not connected")

    async def subscribe(
        self,
        collection: str,
        *,
        sort: Sequence[Mapping[str, Any]] | None = None,
        filter: Any = None,
        offset: int = 0,
        limit: int = 20,
        fields: Sequence[str] | None = None,
        payload: bool = True,
        sub_id: str | None = None,
        on_error: ErrorCallback | None = None,
    ) -> LiveList:
        """Subscribes to a window of ``collection`` and returns its
        :class:`LiveList` once the first frame (a ``Reset``) is applied.

        Raises :class:`OrdoError` if the server refuses (``invalid_view``,
        ``unknown_collection``, ``limit_exceeded``...). ``sub_id`` defaults to
        a fresh id. While the connection is down the subscription is recorded
        and goes out with the resume. ``on_error``: see :class:`LiveList`.
        """
        self._check_running()
        if sub_id is None:
            while True:
                self._next_sub += 1
                prefix = collection.encode()[:40].decode(errors="ignore")
                sub_id = f"{prefix}#{self._next_sub}"
                if sub_id not in self._state.subs:
                    break
        spec: dict[str, Any] = {
            "collection": collection,
            "filter": filter,
            "sort": [dict(key) for key in sort] if sort is not None else None,
            "offset": offset,
            "limit": limit,
            "fields": list(fields) if fields is not None else None,
            "payload": payload,
        }
        op = self._state.subscribe_op(sub_id, spec)
        live = LiveList(self, sub_id, spec, on_error, self._max_queued)
        self._state.subs[sub_id].spec = live._spec
        self._lists[sub_id] = live
        self._enqueue([op])
        try:
            await asyncio.shield(live._first)
        except asyncio.CancelledError:
            if not live._first.done():
                self._unsubscribe(live)
            raise
        return live

    async def _send_change(self, live: LiveList, op: dict[str, Any]) -> None:
        state = self._state.subs.get(live.sub)
        if state is None:
            raise live.error or OrdoError("closed", "the list is closed", live.sub)
        state.spec = live._spec
        await self._enqueue([op])

    def _unsubscribe(self, live: LiveList) -> None:
        state = self._state.subs.get(live.sub)
        if state is None or self._stopped or self._closing:
            self._state.forget(live.sub)
            self._lists.pop(live.sub, None)
            live._finish()
            return
        if state.status != "closing":
            self._enqueue([self._state.begin_unsubscribe(live.sub)])
        if not self._ready:
            # Disconnected: the list ends now. The subscription is left out of
            # the next resume (which closes it on the server), or, if a resume
            # listing it is going out right now, the queued unsubscribe follows it.
            self._lists.pop(live.sub, None)
            live._finish()


def _describe(error: BaseException) -> str:
    """A short description of why a frame could not be handled."""
    if isinstance(error, RecursionError):
        return "the frame is nested too deep to parse"
    if isinstance(error, ValueError):
        return f"not JSON: {error}"[:300]
    return f"the frame could not be handled: {error!r}"[:300]
