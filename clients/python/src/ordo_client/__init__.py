"""Python client for Ordo: live ordered views over collections.

See ``clients/python/README.md`` and ``docs/PROTOCOL.md``.
"""

from ._client import LiveList, OrdoClient
from ._diffs import DIFF_KINDS, apply_diffs
from ._digest import window_digest
from ._errors import DiffError, OrdoError
from ._http import OrdoHttp, OrdoHttpError
from ._nodes import NodeRotation
from ._protocol import (
    AuthExpired,
    Authed,
    DigestMismatch,
    Ended,
    ErrorEvent,
    Event,
    Gap,
    InvalidDiffs,
    ProtocolState,
    Resumed,
    Subscription,
    Unsubscribed,
    Update,
    Welcome,
)

__all__ = [
    "DIFF_KINDS",
    "AuthExpired",
    "Authed",
    "DiffError",
    "DigestMismatch",
    "Ended",
    "ErrorEvent",
    "Event",
    "Gap",
    "InvalidDiffs",
    "LiveList",
    "NodeRotation",
    "OrdoClient",
    "OrdoError",
    "OrdoHttp",
    "OrdoHttpError",
    "ProtocolState",
    "Resumed",
    "Subscription",
    "Unsubscribed",
    "Update",
    "Welcome",
    "apply_diffs",
    "window_digest",
]

__version__ = "0.1.0"
