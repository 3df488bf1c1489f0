"""The one exception type of the client."""

from __future__ import annotations


class OrdoError(Exception):
    """An error reported by an Ordo server, or found by the client.

    ``code`` is one of the stable error codes of ``docs/PROTOCOL.md``
    (``invalid_view``, ``unknown_collection``, ...) or one of the client's own:

    - ``gap``: a subscription's frame did not carry the next ``seq``; the
      client did not apply it and re-subscribes the list by itself;
    - ``invalid_diffs``: a frame's diffs did not fit the list (an index out of
      range); handled like a gap;
    - ``connection_lost``: the connection dropped and the client does not
      reconnect (``reconnect=False``);
    - ``closed``: the client was closed while the operation waited;
    - ``bad_frame``: the server sent something that is not a protocol frame
      (not JSON, nested too deep, an unexpected shape), or handling it failed;
      the list it concerned (every list, when its ``sub`` cannot be read) is
      subscribed again;
    - ``token_provider``: the ``token_provider`` raised or returned no string;
    - ``auth_expired``: the server says the token expired and the client has
      no ``token_provider`` to get another (the server then closes with 4401).

    With auth, the server's ``unauthorized`` (missing, invalid or expired
    token) and ``forbidden`` (a token of another identity; or the identity may
    not do this) arrive as ``OrdoError`` too.

    ``sub`` is the subscription id the error concerns, when there is one.
    """

    def __init__(self, code: str, message: str = "", sub: str | None = None) -> None:
        self.code = code
        self.message = message
        self.sub = sub
        text = f"{code}: {message}" if message else code
        if sub is not None:
            text = f"{text} (subscription {sub!r})"
        super().__init__(text)

    def __repr__(self) -> str:
        return f"OrdoError(code={self.code!r}, message={self.message!r}, sub={self.sub!r})"


class DiffError(OrdoError):
    """A diff that cannot be applied to a list (index out of range, unknown kind)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_diffs", message)
