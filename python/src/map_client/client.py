"""`ClientConnection`: a participant that observes and operates (dashboards, operators, tools).

Clients subscribe to events, query agents and scopes, send, request, steer and stop; they do
not register agents (the router's default grants, docs/security.md). The TypeScript SDK's
`ClientConnection`, in Python's conventions.
"""

from __future__ import annotations

import ssl as _ssl
from typing import Any, Mapping

from ._open import opener
from .auth import AuthLike, to_auth
from .connection import DEFAULT_MAX_QUEUED_MESSAGES, DEFAULT_TIMEOUT, Connecting, Connection, ReconnectPolicy

__all__ = ["ClientConnection"]


class ClientConnection(Connection):
    """A client session. Open it with `ClientConnection.connect(url, ...)`."""

    _participant_type = "client"

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        name: str | None = None,
        auth: AuthLike | None = None,
        resume_token: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        reconnect: ReconnectPolicy | bool = True,
        capabilities: Mapping[str, Any] | None = None,
        max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES,
    ) -> Connecting[ClientConnection]:
        """Opens `url` (`ws://`, `wss://`) and sends `map/connect` (resuming the session of
        `resume_token` when the router still has it). Await the result, or `async with` it.

        `auth`: `Auth.api_key(...)`, `Auth.bearer(jwt)` or `{"method", "token"}`; refused
        credentials raise `AuthError`. `ssl` / `ca_file`: the TLS trust for `wss://`.
        `reconnect`: reopen and resume after a lost connection (`ReconnectPolicy`), or not.
        """
        policy = ReconnectPolicy() if reconnect is True else (reconnect or None)

        async def make() -> ClientConnection:
            conn = cls(
                opener(url, ssl=ssl, ca_file=ca_file, open_timeout=min(timeout, 10.0)),
                name=name,
                auth=to_auth(auth),
                timeout=timeout,
                reconnect=policy,
                max_queued_messages=max_queued_messages,
                capabilities=capabilities,
            )
            await conn._start(resume_token)
            return conn

        return Connecting(make)

    async def _handshake(self, resuming: bool) -> None:
        await self._connect_call({"participantType": "client"})

    @property
    def reconnected(self) -> bool:
        """True when the last `map/connect` resumed an existing session."""
        return bool(self.connect_result.get("reconnected"))
