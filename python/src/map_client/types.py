"""The wire shapes the client hands back, as `TypedDict`s: plain dicts, typed for mypy.

Field names are the wire's (camelCase), as in the TypeScript SDK, so its examples and the
protocol documents read the same. Each shape named after a definition of upstream's JSON Schema
(`tests/interop/schema/core/schema.json`: Agent, Scope, Message, MessageMeta, Event,
SubscriptionFilter, MAPErrorData) is checked against it by the suite (tests/python): a field the
schema adds or drops fails a test. Fields the schema lacks but the SDK or the router send are
listed there, with their reason.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, TypedDict, Union

__all__ = [
    "Address",
    "Agent",
    "AgentLifecycle",
    "Scope",
    "Message",
    "MessageMeta",
    "Event",
    "EventEnvelope",
    "SubscriptionFilter",
    "SendResult",
    "ConnectResult",
    "Principal",
    "ReplayedEvent",
    "ReplayResult",
    "AgentsListResult",
    "AgentsGetResult",
    "SpawnResult",
    "Task",
    "Checkpoint",
    "AuthMethod",
]

AuthMethod = Literal["bearer", "api-key", "mtls", "none"]

JsonObject = Dict[str, Any]

#: An address for `send`: an agent id (`"a1"`, `"agent:a1"`, `"scope:s1"`) or one of the
#: object forms `{"agent": id}`, `{"agents": [...]}`, `{"scope": id}`, `{"role": r, "within"?: s}`,
#: `{"parent": True}`, `{"children": True, "depth"?: n}`, `{"ancestors": True}`,
#: `{"descendants": True}`, `{"siblings": True}`, `{"broadcast": True}`, `{"system": True}`,
#: `{"participant": id}`, `{"participants": "all" | "agents" | "clients"}`,
#: `{"system": "<id>", "agent": id}` (federated).
Address = Union[str, Dict[str, Any]]


class AgentLifecycle(TypedDict, total=False):
    createdAt: int
    startedAt: int
    stoppedAt: int
    lastActiveAt: int
    orphanedAt: int
    exitCode: int
    exitReason: str


class _AgentRequired(TypedDict):
    id: str
    state: str


class Agent(_AgentRequired, total=False):
    """An agent record (SDK `Agent`; `ownerId` is null while the agent is orphaned)."""

    ownerId: str | None
    name: str
    description: str
    parent: str
    children: List[str]
    relationships: List[JsonObject]
    role: str
    scopes: List[str]
    visibility: str
    permissionOverrides: JsonObject
    lifecycle: AgentLifecycle
    capabilities: JsonObject
    environment: JsonObject
    capabilityDescriptor: JsonObject
    persistentIdentity: JsonObject
    metadata: JsonObject
    _meta: JsonObject


class _ScopeRequired(TypedDict):
    id: str


class Scope(_ScopeRequired, total=False):
    name: str
    description: str
    parent: str
    joinPolicy: str
    autoJoinRoles: List[str]
    visibility: str
    messageVisibility: str
    sendPolicy: str
    persistent: bool
    autoDelete: bool
    metadata: JsonObject
    _meta: JsonObject


class MessageMeta(TypedDict, total=False):
    timestamp: int
    relationship: str
    expectsResponse: bool
    correlationId: str
    isResult: bool
    priority: Literal["urgent", "high", "normal", "low"]
    delivery: Literal["fire-and-forget", "acknowledged", "guaranteed"]
    ttlMs: int
    protocol: str
    mail: JsonObject
    _meta: JsonObject


_MessageRequired = TypedDict("_MessageRequired", {"id": str, "from": str, "to": Address})


class Message(_MessageRequired, total=False):
    """A message as its recipient gets it (`map/message`): `m["from"]` is the sender's id."""

    timestamp: int
    payload: Any
    meta: MessageMeta
    _meta: JsonObject


class _EventRequired(TypedDict):
    id: str
    type: str
    timestamp: int


class Event(_EventRequired, total=False):
    """One event (`event` of a `map/event` notification); `id` is its event id."""

    source: str
    data: Any
    causedBy: List[str]
    _meta: JsonObject


class _EnvelopeRequired(TypedDict):
    subscriptionId: str
    sequenceNumber: int
    event: Event


class EventEnvelope(_EnvelopeRequired, total=False):
    eventId: str
    timestamp: int
    causedBy: List[str]
    _meta: JsonObject


class SubscriptionFilter(TypedDict, total=False):
    """AND across fields, OR within a list; an empty list or an absent field: no constraint."""

    eventTypes: List[str]
    fromAgents: List[str]
    agents: List[str]
    fromRoles: List[str]
    roles: List[str]
    scopes: List[str]
    priorities: List[str]
    correlationIds: List[str]
    metadataMatch: JsonObject
    environmentMatch: JsonObject
    mail: JsonObject
    trajectory: JsonObject
    tasks: JsonObject
    _meta: JsonObject


class _SendRequired(TypedDict):
    messageId: str
    delivered: List[str]


class SendResult(_SendRequired, total=False):
    """`delivered`: who got the message now; `queued`: who will get it when back (guaranteed)."""

    queued: List[str]
    _meta: JsonObject


class Principal(TypedDict, total=False):
    id: str
    issuer: str
    expiresAt: int
    claims: JsonObject


class ConnectResult(TypedDict, total=False):
    protocolVersion: int
    sessionId: str
    participantId: str
    participantType: str
    capabilities: JsonObject
    systemInfo: JsonObject
    reconnected: bool
    ownedAgents: List[str]
    reclaimedAgents: List[Agent]
    resumeToken: str
    principal: Principal
    authRequired: JsonObject
    error: JsonObject
    _meta: JsonObject


class _ReplayedRequired(TypedDict):
    eventId: str
    event: Event


class ReplayedEvent(_ReplayedRequired, total=False):
    timestamp: int
    causedBy: List[str]


class _ReplayResultRequired(TypedDict):
    events: List[ReplayedEvent]
    hasMore: bool


class ReplayResult(_ReplayResultRequired, total=False):
    totalCount: int
    gap: bool
    unknownEventId: bool


class _AgentsListRequired(TypedDict):
    agents: List[Agent]


class AgentsListResult(_AgentsListRequired, total=False):
    nextCursor: str
    asOf: str


class _AgentsGetRequired(TypedDict):
    agent: Agent


class AgentsGetResult(_AgentsGetRequired, total=False):
    parent: Agent
    children: List[Agent]
    siblings: List[Agent]
    ancestors: List[Agent]
    descendants: List[Agent]


class _SpawnRequired(TypedDict):
    agent: Agent


class SpawnResult(_SpawnRequired, total=False):
    messageId: str
    process: JsonObject


class _TaskRequired(TypedDict):
    id: str


class Task(_TaskRequired, total=False):
    title: str
    description: str
    status: str
    assignee: str | None
    meta: JsonObject
    createdAt: int
    updatedAt: int


class _CheckpointRequired(TypedDict):
    id: str
    agentId: str


class Checkpoint(_CheckpointRequired, total=False):
    timestamp: int
    label: str
    sessionId: str
    metadata: JsonObject
