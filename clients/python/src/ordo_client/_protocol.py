"""The socket-free core of the client: subscriptions' lists and ``seq``s, and
what each server frame does to them (``docs/PROTOCOL.md``).

:class:`ProtocolState` never does I/O. It is fed server frames (parsed JSON)
with :meth:`ProtocolState.handle_frame`, which returns the events the frame
produced; it builds the ``resume`` op for a new connection. The client
(:class:`ordo_client.OrdoClient`) and the protocol-vector tests drive it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from ._diffs import apply_diffs, has_reset
from ._digest import window_digest
from ._errors import DiffError, OrdoError

Status = Literal["pending", "live", "resubscribing", "awaiting_reset", "closing"]
"""Where a subscription stands on the client:

- ``pending``: ``subscribe`` sent, its first frame (``seq`` 1, a ``Reset``) not yet seen;
- ``live``: frames are applied as they come;
- ``resubscribing``: a gap was found; ``unsubscribe`` and ``subscribe`` were
  sent and the client waits for ``unsubscribed`` (frames of the old
  subscription are ignored until then);
- ``awaiting_reset``: the old subscription is gone, the new one's first frame
  (``seq`` 1) is awaited; the old list is kept until it comes;
- ``closing``: the client sent ``unsubscribe``.
"""

SUBSCRIPTION_KEYS = ("collection", "filter", "sort", "offset", "limit", "fields", "payload")


@dataclass(frozen=True)
class Welcome:
    """The server's first frame on a connection."""

    session: str
    protocol: int | None
    limits: dict[str, Any]
    #: The ``auth`` key: ``"none"`` (the server runs without auth, or predates
    #: it: the key is then absent), ``"required"`` (send ``auth`` first), or a
    #: dict ``{"sub", "role", "expires_at"}`` (authenticated at connect).
    auth: Any = "none"
    kind: Literal["welcome"] = "welcome"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "welcome", "session": self.session}


@dataclass(frozen=True)
class Update:
    """A diffs frame applied to a subscription's list: ``items`` is the list after it."""

    sub: str
    seq: int
    diffs: list[dict[str, Any]]
    items: list[dict[str, Any]]
    reset: bool
    #: The view's length after the frame (its ``total``, else the last one
    #: known; ``None`` before any).
    total: int | None = None
    #: The last write (batch ``seq``) the list reflects (``None`` from a
    #: server that sends none).
    write_seq: int | None = None
    kind: Literal["update"] = "update"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "reset", "sub": self.sub} if self.reset else None


@dataclass(frozen=True)
class ErrorEvent:
    """An ``error`` frame. ``fatal``: the subscription it names is gone (a
    refused ``subscribe``); otherwise the subscription, if any, is unchanged."""

    code: str
    message: str
    sub: str | None
    fatal: bool = False
    kind: Literal["error"] = "error"

    def to_vector(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {"kind": "error", "code": self.code}
        if self.sub is not None:
            out["sub"] = self.sub
        return out

    def to_exception(self) -> OrdoError:
        return OrdoError(self.code, self.message, self.sub)


@dataclass(frozen=True)
class Unsubscribed:
    """A subscription ended (the answer to ``unsubscribe``)."""

    sub: str
    kind: Literal["unsubscribed"] = "unsubscribed"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "unsubscribed", "sub": self.sub}


@dataclass(frozen=True)
class Ended:
    """The server ended a subscription (``ended``): no frame of it follows, it
    is gone, its id is free again. ``reason``: ``collection_dropped``,
    ``field_removed`` or ``access_ended`` (newer servers may send others)."""

    sub: str
    reason: str
    message: str
    kind: Literal["ended"] = "ended"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "ended", "sub": self.sub, "reason": self.reason}


@dataclass(frozen=True)
class Resumed:
    """The answer to ``resume``: which subscriptions replay, which reset, and
    which the server refused (``errors``: sub id → (code, message); those are
    gone)."""

    session: str
    replayed: list[str]
    reset: list[str]
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)
    kind: Literal["resumed"] = "resumed"

    def to_vector(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {"kind": "resumed", "replayed": list(self.replayed), "reset": list(self.reset)}
        if self.errors:
            out["errors"] = {sub: code for sub, (code, _) in self.errors.items()}
        return out


@dataclass(frozen=True)
class Gap:
    """A frame whose ``seq`` was not the next one: not applied; the list lost data."""

    sub: str
    expected_seq: int
    got_seq: int
    kind: Literal["gap"] = "gap"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "gap", "sub": self.sub, "expected_seq": self.expected_seq, "got_seq": self.got_seq}

    def to_exception(self) -> OrdoError:
        return OrdoError(
            "gap",
            f"expected seq {self.expected_seq}, got {self.got_seq}; the frame was not applied",
            self.sub,
        )


@dataclass(frozen=True)
class InvalidDiffs:
    """A frame with the right ``seq`` whose diffs do not fit the list: not applied."""

    sub: str
    seq: int
    message: str
    kind: Literal["invalid_diffs"] = "invalid_diffs"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "invalid_diffs", "sub": self.sub, "seq": self.seq}

    def to_exception(self) -> OrdoError:
        return OrdoError("invalid_diffs", f"frame seq {self.seq}: {self.message}", self.sub)


@dataclass(frozen=True)
class DigestMismatch:
    """A frame whose window digest (``expected``) is not the digest of the list its
    diffs give (``got``): the list is not the server's window. Not applied; the list
    is subscribed again."""

    sub: str
    seq: int
    expected: str
    got: str
    kind: Literal["digest_mismatch"] = "digest_mismatch"

    def to_vector(self) -> dict[str, Any] | None:
        return {"kind": "digest_mismatch", "sub": self.sub, "seq": self.seq}

    def to_exception(self) -> OrdoError:
        return OrdoError(
            "digest_mismatch",
            f"after seq {self.seq} the list's digest is {self.got}, the server's {self.expected}; "
            "the frame was not applied",
            self.sub,
        )


@dataclass(frozen=True)
class Authed:
    """The answer to ``auth``: the connection's identity and when its token
    expires (unix seconds, the token's ``exp``)."""

    sub: str | None
    role: str | None
    expires_at: float | None
    kind: Literal["authed"] = "authed"

    def to_vector(self) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class AuthExpired:
    """The connection's token expired: a valid ``auth`` within ``grace_secs``
    keeps the connection, else the server closes it with code 4401."""

    grace_secs: float | None
    kind: Literal["auth_expired"] = "auth_expired"

    def to_vector(self) -> dict[str, Any] | None:
        return None


Event = Union[Welcome, Update, ErrorEvent, Unsubscribed, Ended, Resumed, Gap, InvalidDiffs, DigestMismatch, Authed, AuthExpired]  # noqa: UP007 (a runtime alias, Python 3.10)


@dataclass
class Subscription:
    """One subscription's state on the client."""

    sub: str
    items: list[dict[str, Any]]
    seq: int
    status: Status
    #: The ``subscribe`` op's keys (collection, filter, sort, offset, limit,
    #: fields, payload), for ``subscribe`` and ``resume`` ops; ``None`` when
    #: only seeded (the vector runner).
    spec: dict[str, Any] | None = None
    #: The view's length from the last frame that carried ``total`` (frames
    #: without it mean "unchanged"); ``None`` before any.
    total: int | None = None
    #: The ``write_seq`` of the last frame applied; ``None`` before any.
    write_seq: int | None = None
    #: The greatest ``write_seq`` applied so far (``None``: none yet). Every
    #: later ``subscribe`` or ``resume`` entry of this subscription carries it
    #: as ``min_seq``, so the list never goes back in time, even when another
    #: node (one that lags) answers.
    floor_seq: int | None = None


def _require(frame: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    value = frame.get(key)
    if not isinstance(value, kinds) or isinstance(value, bool) and kinds is int:
        raise OrdoError("bad_frame", f"`{frame.get('type')}` frame: `{key}` is {value!r}")
    return value


class ProtocolState:
    """Subscriptions, their lists and ``seq``s, and the session; no I/O.

    Lists are replaced, never mutated: each applied frame makes a new list, so
    a reference to ``items`` taken earlier stays a consistent snapshot.
    """

    def __init__(self) -> None:
        #: The session holding this client's subscriptions: the one to name in
        #: the next ``resume``. A ``welcome`` sets it only while there is
        #: nothing to resume; ``resumed`` sets it.
        self.session: str | None = None
        #: The session of the current connection, from its ``welcome``.
        self.welcome_session: str | None = None
        self.limits: dict[str, Any] = {}
        self.subs: dict[str, Subscription] = {}

    # ---- setting up -----------------------------------------------------

    def seed(
        self,
        sub: str,
        items: Iterable[dict[str, Any]] = (),
        seq: int = 0,
        spec: Mapping[str, Any] | None = None,
    ) -> Subscription:
        """Adds a subscription as if its frames up to ``seq`` had been applied
        (``seq`` 0: nothing yet; it is then ``pending``)."""
        state = Subscription(
            sub=sub,
            items=list(items),
            seq=seq,
            status="pending" if seq == 0 else "live",
            spec=dict(spec) if spec is not None else None,
        )
        self.subs[sub] = state
        return state

    def subscribe_op(self, sub: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Registers a new subscription (``pending``) and returns its ``subscribe`` op."""
        if sub in self.subs:
            raise OrdoError("subscription_exists", f"subscription {sub!r} exists on this client", sub)
        self.seed(sub, (), 0, spec)
        return _subscribe_op(sub, spec)

    def lists(self) -> dict[str, list[dict[str, Any]]]:
        return {sub: state.items for sub, state in self.subs.items()}

    def seqs(self) -> dict[str, int]:
        return {sub: state.seq for sub, state in self.subs.items()}

    def totals(self) -> dict[str, int | None]:
        return {sub: state.total for sub, state in self.subs.items()}

    # ---- what the client does -------------------------------------------

    def begin_resubscribe(self, sub: str) -> list[dict[str, Any]]:
        """After a gap: returns the ops to send (``unsubscribe``, then
        ``subscribe`` anew). The old list and ``seq`` stay until the new
        subscription's first frame replaces them."""
        state = self.subs[sub]
        if state.spec is None:
            raise OrdoError("bad_request", "cannot re-subscribe a subscription without a definition", sub)
        if state.status == "resubscribing":
            return []
        state.status = "resubscribing"
        return [{"op": "unsubscribe", "sub": sub}, _subscribe_op(sub, state.spec, state.floor_seq)]

    def begin_unsubscribe(self, sub: str) -> dict[str, Any]:
        """Marks the subscription as closing and returns the ``unsubscribe`` op."""
        self.subs[sub].status = "closing"
        return {"op": "unsubscribe", "sub": sub}

    def forget(self, sub: str) -> Subscription | None:
        """Drops a subscription without telling the server."""
        return self.subs.pop(sub, None)

    def resume_op(self) -> tuple[dict[str, Any] | None, list[Subscription]]:
        """For a new connection: returns the ``resume`` op (``None`` if there is
        nothing to resume) and the subscriptions dropped instead of resumed
        (those being closed: not listing them closes them on the server).

        Every other subscription is listed with its current definition and
        the last ``seq`` it applied. One in the middle of a re-subscription
        goes back to its last good ``seq``: the resume either replays what it
        missed or sends a ``Reset`` with ``seq = last_seq + 1``.
        """
        dropped: list[Subscription] = []
        entries: list[dict[str, Any]] = []
        for sub, state in list(self.subs.items()):
            if state.status == "closing" or state.spec is None:
                dropped.append(self.subs.pop(sub))
                continue
            if state.status == "resubscribing":
                state.status = "live" if state.seq > 0 else "pending"
            elif state.status == "awaiting_reset":
                # The old subscription is gone and the new one's `seq` counts
                # from 0: resume that one.
                state.status = "pending"
            entry = {"sub": sub, **_spec_keys(state.spec), "last_seq": state.seq}
            if state.floor_seq is not None:
                # A node that does not know the session (another node's) resets
                # every entry: `min_seq` makes it wait until it has what the
                # list already showed (or refuse with `seq_not_reached`).
                entry["min_seq"] = state.floor_seq
            entries.append(entry)
        if not entries:
            # Nothing to resume: this connection's own session is the one now.
            self.session = self.welcome_session
            return None, dropped
        return {"op": "resume", "session": self.session or "", "subs": entries}, dropped

    # ---- server frames --------------------------------------------------

    def handle_frame(self, frame: Mapping[str, Any]) -> list[Event]:
        """Applies one server frame; returns the events it produced.

        A diffs frame yields an :class:`Update` when applied, a :class:`Gap`
        when its ``seq`` is not the next one (it is then not applied), an
        :class:`InvalidDiffs` when its diffs do not fit the list, and nothing
        when it belongs to no known subscription (frames still in flight after
        ``unsubscribe``) or to one being re-subscribed. Raises
        :class:`OrdoError` (code ``bad_frame``) for a frame that is not a
        protocol frame.
        """
        if not isinstance(frame, Mapping):
            raise OrdoError("bad_frame", f"a frame is a JSON object, not {type(frame).__name__}")
        kind = frame.get("type")
        if kind == "diffs":
            return self._on_diffs(frame)
        if kind == "error":
            return self._on_error(frame)
        if kind == "unsubscribed":
            return self._on_unsubscribed(frame)
        if kind == "ended":
            return self._on_ended(frame)
        if kind == "resumed":
            return self._on_resumed(frame)
        if kind == "welcome":
            session = _require(frame, "session", str)
            limits = frame.get("limits")
            self.welcome_session = session
            if self.session is None or not self.subs:
                self.session = session
            self.limits = dict(limits) if isinstance(limits, Mapping) else {}
            protocol = frame.get("protocol")
            auth = frame.get("auth", "none")
            if auth is None:
                auth = "none"
            return [Welcome(session, protocol if isinstance(protocol, int) else None, self.limits, auth)]
        if kind == "authed":
            sub = frame.get("sub")
            role = frame.get("role")
            expires_at = frame.get("expires_at")
            return [
                Authed(
                    sub if isinstance(sub, str) else None,
                    role if isinstance(role, str) else None,
                    expires_at if _is_number(expires_at) else None,
                )
            ]
        if kind == "auth_expired":
            grace = frame.get("grace_secs")
            return [AuthExpired(grace if _is_number(grace) else None)]
        # A newer server's frame type: ignored, as the protocol's versioning allows
        # (a change an existing client could misread gets a new protocol version).
        return []

    def _on_diffs(self, frame: Mapping[str, Any]) -> list[Event]:
        sub = _require(frame, "sub", str)
        seq = _require(frame, "seq", int)
        diffs = _require(frame, "diffs", list)
        state = self.subs.get(sub)
        if state is None or state.status == "resubscribing":
            return []
        expected = state.seq + 1
        if seq != expected:
            if state.status == "closing":
                return []
            return [Gap(sub, expected, seq)]
        try:
            items = apply_diffs(state.items, diffs)
        except DiffError as error:
            if state.status == "closing":
                return []
            return [InvalidDiffs(sub, seq, error.message)]
        expected_digest = frame.get("digest")
        if expected_digest is not None:
            got = window_digest(items)
            if expected_digest != got:
                if state.status == "closing":
                    return []
                return [DigestMismatch(sub, seq, str(expected_digest), got)]
        state.items = items
        state.seq = seq
        total = frame.get("total")
        if _is_count(total):
            state.total = total
        write_seq = frame.get("write_seq")
        state.write_seq = write_seq if _is_count(write_seq) else None
        if state.write_seq is not None and (state.floor_seq is None or state.write_seq > state.floor_seq):
            state.floor_seq = state.write_seq
        if state.status in ("pending", "awaiting_reset"):
            state.status = "live"
        return [Update(sub, seq, list(diffs), items, has_reset(diffs), state.total, state.write_seq)]

    def _on_error(self, frame: Mapping[str, Any]) -> list[Event]:
        code = _require(frame, "code", str)
        message = frame.get("message")
        message = message if isinstance(message, str) else ""
        sub = frame.get("sub")
        if not isinstance(sub, str):
            return [ErrorEvent(code, message, None)]
        state = self.subs.get(sub)
        if state is None:
            return [ErrorEvent(code, message, sub)]
        if state.status in ("pending", "awaiting_reset"):
            # The subscribe was refused: nothing was created.
            del self.subs[sub]
            return [ErrorEvent(code, message, sub, fatal=True)]
        if state.status == "resubscribing":
            if code == "unknown_subscription":
                # The unsubscribe found nothing: the new subscription follows.
                state.status = "awaiting_reset"
                state.seq = 0
                return []
            # The new subscribe was refused (its check runs before the old
            # subscription's `unsubscribed` arrives).
            del self.subs[sub]
            return [ErrorEvent(code, message, sub, fatal=True)]
        if state.status == "closing" and code == "unknown_subscription":
            del self.subs[sub]
            return [Unsubscribed(sub)]
        return [ErrorEvent(code, message, sub)]

    def _on_unsubscribed(self, frame: Mapping[str, Any]) -> list[Event]:
        sub = _require(frame, "sub", str)
        state = self.subs.get(sub)
        if state is None:
            return []
        if state.status == "resubscribing":
            state.status = "awaiting_reset"
            state.seq = 0
            return []
        del self.subs[sub]
        return [Unsubscribed(sub)]

    def _on_ended(self, frame: Mapping[str, Any]) -> list[Event]:
        sub = _require(frame, "sub", str)
        reason = frame.get("reason")
        reason = reason if isinstance(reason, str) else "unknown"
        message = frame.get("message")
        message = message if isinstance(message, str) else reason
        state = self.subs.get(sub)
        if state is None or state.status == "resubscribing":
            # Resubscribing: the old subscription ended before our unsubscribe
            # reached it; that is answered `unknown_subscription`, then the new
            # subscribe's answer comes.
            return []
        del self.subs[sub]
        return [Ended(sub, reason, message)]

    def _on_resumed(self, frame: Mapping[str, Any]) -> list[Event]:
        session = _require(frame, "session", str)
        entries = _require(frame, "subs", list)
        self.session = session
        replayed: list[str] = []
        reset: list[str] = []
        errors: dict[str, tuple[str, str]] = {}
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("sub"), str):
                raise OrdoError("bad_frame", f"`resumed` entry {entry!r}")
            sub = entry["sub"]
            if "error" in entry:
                error = entry["error"] if isinstance(entry["error"], Mapping) else {}
                errors[sub] = (str(error.get("code", "internal")), str(error.get("message", "")))
                self.subs.pop(sub, None)
            elif entry.get("reset"):
                reset.append(sub)
            else:
                replayed.append(sub)
        return [Resumed(session, replayed, reset, errors)]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spec_keys(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a subscription definition as sent: absent options left out."""
    out: dict[str, Any] = {}
    for key in SUBSCRIPTION_KEYS:
        value = spec.get(key)
        if value is None:
            continue
        out[key] = copy.deepcopy(value)
    return out


def _subscribe_op(sub: str, spec: Mapping[str, Any], min_seq: int | None = None) -> dict[str, Any]:
    op = {"op": "subscribe", "sub": sub, **_spec_keys(spec)}
    if min_seq is not None:
        op["min_seq"] = min_seq
    return op
