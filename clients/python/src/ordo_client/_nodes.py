"""Which node to connect to next, and after what delay: the socket-free part
of failover across node URLs (``README.md``, "Several nodes")."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


class NodeRotation:
    """Round robin over the node URLs, with the backoff applied per full round.

    After a lost connection (or a failed connect) the client tries the next
    node at once (a jitter below ``backoff_initial / 2`` aside, so the clients
    of a dead node do not all land in the same instant), and waits the
    exponential backoff only once every node has failed in a row: a dead node
    costs one quick try, not a wait. With one URL this is the old behaviour
    exactly (a backoff before every reconnection).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        backoff_initial: float,
        backoff_max: float,
        rand: Callable[[], float] = random.random,
    ) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed:
            raise ValueError("at least one node URL is needed")
        for url in listed:
            if not isinstance(url, str) or not url:
                raise ValueError(f"not a node URL: {url!r}")
        self.urls: tuple[str, ...] = tuple(listed)
        self._initial = backoff_initial
        self._max = backoff_max
        self._rand = rand
        self._index = 0
        #: Failures since the last good connection, in the current round.
        self._fails_in_round = 0
        #: Full rounds failed since the last good connection: the backoff's exponent.
        self.failed_rounds = 0

    @property
    def current(self) -> str:
        """The URL of the node in use (or being tried)."""
        return self.urls[self._index]

    def fail(self) -> float:
        """The node in use failed (lost, refused, or behind): moves to the next
        one and returns the delay in seconds before connecting to it. Ending a
        round, the delay is half to all of ``min(backoff_max, backoff_initial *
        2**rounds)``."""
        self._index = (self._index + 1) % len(self.urls)
        self._fails_in_round += 1
        if self._fails_in_round < len(self.urls):
            return self._rand() * (self._initial / 2)
        self._fails_in_round = 0
        ceiling = min(self._max, self._initial * 2 ** min(self.failed_rounds, 30))
        self.failed_rounds += 1
        return ceiling / 2 + self._rand() * (ceiling / 2)

    def succeeded(self) -> None:
        """The node in use took the connection: the next failure starts a fresh round."""
        self._fails_in_round = 0
        self.failed_rounds = 0
