"""map_client: an asyncio client for MAP, the Multi-Agent Protocol (JSON-RPC 2.0 for
multi-agent systems), shaped like the official TypeScript SDK.

    from map_client import AgentConnection

    async with AgentConnection.connect("ws://127.0.0.1:4500/", name="echo") as agent:
        async for message in agent.messages():
            await agent.reply(message, {"echo": message.get("payload")})

Modules: `client` (ClientConnection), `agent` (AgentConnection), `connection` (what both share:
calls, messages, request/reply, reconnection), `methods` (the MAP methods as methods),
`subscription` (event streams with credit),
`transport` (WebSocket, stdio NDJSON), `errors`, `types`, `auth`. See docs/python.md.
"""

from .agent import AgentConnection
from .auth import Auth
from .client import ClientConnection
from .connection import Connecting, Connection, ReconnectPolicy, control_of
from .errors import (
    AgentError,
    AuthError,
    ErrorCode,
    FederationError,
    InternalError,
    MailError,
    MapConnectionError,
    MapError,
    MapTimeoutError,
    ProtocolError,
    ResourceError,
    RoutingError,
    TrajectoryError,
)
from .subscription import Subscription
from .types import (
    Address,
    Agent,
    ConnectResult,
    Event,
    Message,
    MessageMeta,
    ReplayResult,
    Scope,
    SendResult,
    SubscriptionFilter,
)

__version__ = "0.1.0"

__all__ = [
    "AgentConnection",
    "ClientConnection",
    "Connection",
    "Connecting",
    "ReconnectPolicy",
    "Subscription",
    "Auth",
    "control_of",
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
    "Address",
    "Agent",
    "ConnectResult",
    "Event",
    "Message",
    "MessageMeta",
    "ReplayResult",
    "Scope",
    "SendResult",
    "SubscriptionFilter",
]
