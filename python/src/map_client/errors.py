"""Errors: one `MapError` for every error the router answers, subclassed by category.

A JSON-RPC error object `{code, message, data}` becomes the subclass named by its
`data.category` (the router always sends one), else by the code's range (wire.md, section 9).
Failures that never reached the router, or whose answer never came, are not `MapError`s:
`MapTimeoutError` (a `TimeoutError`) and `MapConnectionError` (a `ConnectionError`).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "MapError",
    "ProtocolError",
    "AuthError",
    "RoutingError",
    "AgentError",
    "ResourceError",
    "FederationError",
    "MailError",
    "TrajectoryError",
    "InternalError",
    "MapTimeoutError",
    "MapConnectionError",
    "ErrorCode",
]


class ErrorCode:
    """The codes a MAP router answers with (wire.md, section 9)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    AUTH_REQUIRED = 1000
    AUTH_FAILED = 1001
    TOKEN_EXPIRED = 1002
    PERMISSION_DENIED = 1003
    ADDRESS_NOT_FOUND = 2000
    AGENT_NOT_FOUND = 2001
    SCOPE_NOT_FOUND = 2002
    DELIVERY_FAILED = 2003
    ADDRESS_AMBIGUOUS = 2004
    AGENT_EXISTS = 3000
    STATE_INVALID = 3001
    SPAWN_FAILED = 3004
    EXHAUSTED = 4000
    RATE_LIMITED = 4001
    QUOTA_EXCEEDED = 4002
    SYSTEM_NOT_FOUND = 5001
    TASK_NOT_FOUND = 14001
    SESSION_NOT_FOUND = 16000
    SESSION_IN_USE = 16001


class MapError(Exception):
    """An error answer from the router: `code`, `message` and `data` exactly as sent."""

    category: str = ""

    def __init__(self, code: int, message: str, data: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.data: dict[str, Any] = dict(data) if data else {}

    @property
    def retryable(self) -> bool:
        """True when the router says the same call may succeed later (`data.retryable`)."""
        return bool(self.data.get("retryable", False))

    @property
    def retry_after_ms(self) -> int | None:
        """How long to wait before retrying (`data.retryAfterMs`, rate limits), if given."""
        value = self.data.get("retryAfterMs")
        return value if isinstance(value, int) else None

    @property
    def details(self) -> dict[str, Any]:
        """`data.details`: for -32602, the reason the params were refused."""
        value = self.data.get("details")
        return value if isinstance(value, dict) else {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, message={self.message!r}, data={self.data!r})"

    @staticmethod
    def from_wire(error: Any) -> MapError:
        """The subclass of `MapError` for a JSON-RPC error object."""
        if not isinstance(error, dict):
            return InternalError(ErrorCode.INTERNAL_ERROR, f"malformed error object: {error!r}")
        code = error.get("code")
        if not isinstance(code, int):
            code = ErrorCode.INTERNAL_ERROR
        message = error.get("message")
        data = error.get("data")
        data = data if isinstance(data, dict) else {}
        category = data.get("category")
        cls = _BY_CATEGORY.get(category) if isinstance(category, str) else None
        if cls is None:
            cls = _by_code(code)
        return cls(code, message if isinstance(message, str) else "", data)


class ProtocolError(MapError):
    """JSON-RPC level: parse errors, invalid requests, unknown methods, invalid params."""

    category = "protocol"


class AuthError(MapError):
    """Not connected, authentication required or refused, permission denied (1000-1006)."""

    category = "auth"


class RoutingError(MapError):
    """Unknown or ambiguous addresses, agents or scopes; failed deliveries (2000-2004)."""

    category = "routing"


class AgentError(MapError):
    """Agent lifecycle: id taken, invalid state transition, spawn failed (3000-3004)."""

    category = "agent"


class ResourceError(MapError):
    """Limits and quotas (4000-4002), and the tasks extension (14000-14003)."""

    category = "resource"


class FederationError(MapError):
    """Federation: unknown system, link down, route refused (5000-5011)."""

    category = "federation"


class MailError(MapError):
    """The mail extension (10000-10010)."""

    category = "mail"


class TrajectoryError(MapError):
    """The trajectory extension (13000-13004)."""

    category = "trajectory"


class InternalError(MapError):
    """The router failed (-32603), or an answer could not be read."""

    category = "internal"


_BY_CATEGORY: dict[str, type[MapError]] = {
    cls.category: cls
    for cls in (
        ProtocolError,
        AuthError,
        RoutingError,
        AgentError,
        ResourceError,
        FederationError,
        MailError,
        TrajectoryError,
        InternalError,
    )
}


def _by_code(code: int) -> type[MapError]:
    if code == ErrorCode.INTERNAL_ERROR:
        return InternalError
    if code < 0:
        return ProtocolError
    for low, high, cls in (
        (1000, 1999, AuthError),
        (2000, 2999, RoutingError),
        (3000, 3999, AgentError),
        (4000, 4999, ResourceError),
        (5000, 5999, FederationError),
        (10000, 10999, MailError),
        (13000, 13999, TrajectoryError),
        (14000, 14999, ResourceError),
    ):
        if low <= code <= high:
            return cls
    return MapError


class MapTimeoutError(TimeoutError):
    """No answer within the deadline (the call may still take effect at the router)."""


class MapConnectionError(ConnectionError):
    """The connection is closed, or was lost while a call was in flight (its outcome unknown)."""
