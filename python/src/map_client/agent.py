"""`AgentConnection`: a participant that is an agent (registers, receives messages, replies).

`connect()` sends `map/connect` and then `map/agents/register`, as the TypeScript SDK's
`AgentConnection.connect`. After a lost connection it resumes its session (its agent comes back
with whatever was queued for it); when the router no longer has the session (it restarted, or
the resume window passed) it registers its own agent id again and re-joins the scopes it was
in, which is what the SDK's reconnect does.

Over `stdio:` the agent speaks NDJSON on stdin/stdout: the way a program started by
`map/agents/spawn` (or `map-router agent -- ...`) joins the router.
"""

from __future__ import annotations

import os
import ssl as _ssl
from typing import Any, Mapping, cast

from ._open import is_stdio, opener
from .auth import AuthLike, to_auth
from .connection import (
    DEFAULT_MAX_QUEUED_MESSAGES,
    DEFAULT_TIMEOUT,
    Connecting,
    Connection,
    ReconnectPolicy,
    _agent_ids,
)
from .errors import MapError
from .types import Agent, MessageMeta, Scope, SendResult, SpawnResult

__all__ = ["AgentConnection"]


class AgentConnection(Connection):
    """An agent session and its registered agent. Open it with `AgentConnection.connect`."""

    _participant_type = "agent"

    def __init__(self, *args: Any, register: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._register_params = register
        self.agent: Agent | None = None
        self._scopes: list[str] = list(register.get("scopes") or [])

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        name: str | None = None,
        role: str | None = None,
        agent_id: str | None = None,
        scopes: list[str] | None = None,
        auth: AuthLike | None = None,
        parent: str | None = None,
        visibility: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        resume_token: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        reconnect: ReconnectPolicy | bool | None = None,
        max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES,
    ) -> Connecting[AgentConnection]:
        """Connects to `url` (`ws://`, `wss://` or `stdio:`) and registers an agent.

        `agent_id`: ask for this id (an orphan of the same id is reclaimed with its queued
        messages). Over `stdio:`, `name` defaults to `$MAP_AGENT_NAME` (set by the router for
        the programs it spawns). `reconnect` defaults to on for WebSockets and off for stdio
        (stdin's end means the router is going away).
        """
        stdio = is_stdio(url)
        if name is None and stdio:
            name = os.environ.get("MAP_AGENT_NAME")
        if reconnect is None:
            reconnect = not stdio
        policy = ReconnectPolicy() if reconnect is True else (reconnect or None)
        register: dict[str, Any] = {}
        for key, value in (
            ("agentId", agent_id),
            ("name", name),
            ("role", role),
            ("parent", parent),
            ("scopes", scopes),
            ("visibility", visibility),
            ("metadata", dict(metadata) if metadata else None),
        ):
            if value is not None:
                register[key] = value

        async def make() -> AgentConnection:
            conn = cls(
                opener(url, ssl=ssl, ca_file=ca_file, open_timeout=min(timeout, 10.0)),
                name=name,
                auth=to_auth(auth),
                timeout=timeout,
                reconnect=policy,
                max_queued_messages=max_queued_messages,
                capabilities=capabilities,
                register=register,
            )
            await conn._start(resume_token)
            return conn

        return Connecting(make)

    @property
    def agent_id(self) -> str:
        """The registered agent's id."""
        assert self.agent is not None, "not registered"
        return self.agent["id"]

    async def _handshake(self, resuming: bool) -> None:
        params: dict[str, Any] = {"participantType": "agent"}
        known = self.agent["id"] if self.agent is not None else self._register_params.get("agentId")
        if known is not None:
            params["participantId"] = known
        result = await self._connect_call(params)
        if resuming and self.agent is not None:
            owned = _agent_ids(result.get("reclaimedAgents")) | _agent_ids(result.get("ownedAgents"))
            if result.get("reconnected") and self.agent["id"] in owned:
                return  # the session came back with its agent, its scopes and its queue
            await self._register_again()
            return
        answer = await self._raw_call("map/agents/register", self._register_params, self.timeout)
        self.agent = cast(Agent, answer["agent"])

    async def _register_again(self) -> None:
        assert self.agent is not None
        params = {k: v for k, v in self._register_params.items() if k != "scopes"}
        params["agentId"] = self.agent["id"]
        answer = await self._raw_call("map/agents/register", params, self.timeout)
        self.agent = cast(Agent, answer["agent"])
        for scope_id in list(self._scopes):
            try:
                await self._raw_call("map/scopes/join", {"scopeId": scope_id, "agentId": self.agent["id"]}, self.timeout)
            except MapError:
                self._scopes.remove(scope_id)  # gone with the previous run of the router

    # -- the agent's own state ------------------------------------------------------------

    async def update_state(self, state: str) -> Agent:
        """`map/agents/update {state}`: `busy`, `idle`, `stopped`, `x-<name>`, ..."""
        result = await self.call("map/agents/update", {"agentId": self.agent_id, "state": state})
        self.agent = cast(Agent, result["agent"])
        return self.agent

    async def update_metadata(self, metadata: Mapping[str, Any]) -> Agent:
        """Shallow-merges `metadata` into the agent's."""
        result = await self.call("map/agents/update", {"agentId": self.agent_id, "metadata": dict(metadata)})
        self.agent = cast(Agent, result["agent"])
        return self.agent

    async def busy(self) -> Agent:
        return await self.update_state("busy")

    async def idle(self) -> Agent:
        return await self.update_state("idle")

    async def done(self, *, exit_code: int | None = None, exit_reason: str | None = None) -> None:
        """Marks the agent `stopped` (what it does when its work is over or it was told to stop)."""
        await self.update_state("stopped")
        meta: dict[str, Any] = {}
        if exit_code is not None:
            meta["exitCode"] = exit_code
        if exit_reason is not None:
            meta["exitReason"] = exit_reason
        if meta:
            await self.update_metadata(meta)

    async def unregister(self, reason: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"agentId": self.agent_id}
        if reason is not None:
            params["reason"] = reason
        return cast(dict[str, Any], await self.call("map/agents/unregister", params))

    async def report_checkpoint(self, checkpoint_id: str, **fields: Any) -> dict[str, Any]:
        """`trajectory/checkpoint`: `label`, `sessionId`, `metadata`, ..."""
        checkpoint = {"id": checkpoint_id, "agentId": self.agent_id, **fields}
        return cast(dict[str, Any], await self.call("trajectory/checkpoint", {"checkpoint": checkpoint}))

    # -- children -------------------------------------------------------------------------

    async def spawn(
        self,
        *,
        name: str | None = None,
        role: str | None = None,
        agent_id: str | None = None,
        scopes: list[str] | None = None,
        visibility: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        initial_message: Mapping[str, Any] | None = None,
        command: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> SpawnResult:
        """`map/agents/spawn` with this agent as the parent. With `command`
        (`{"program", "args"?, "env"?, "cwd"?, "restart"?}`) the router starts that program
        and supervises it; the call returns once it has registered."""
        params: dict[str, Any] = {"parent": self.agent_id, **extra}
        for key, value in (
            ("agentId", agent_id),
            ("name", name),
            ("role", role),
            ("scopes", scopes),
            ("visibility", visibility),
            ("metadata", dict(metadata) if metadata else None),
            ("initialMessage", dict(initial_message) if initial_message else None),
            ("command", dict(command) if command else None),
        ):
            if value is not None:
                params[key] = value
        return cast(SpawnResult, await self.call("map/agents/spawn", params, timeout=timeout))

    # -- hierarchy sends ------------------------------------------------------------------

    async def send_to_parent(self, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"parent": True}, payload, {**(meta or {}), "relationship": "child-to-parent"})

    async def send_to_children(self, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"children": True}, payload, {**(meta or {}), "relationship": "parent-to-child"})

    async def send_to_siblings(self, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"siblings": True}, payload, {**(meta or {}), "relationship": "peer"})

    # -- scopes ---------------------------------------------------------------------------

    async def create_scope(self, name: str | None = None, **params: Any) -> Scope:
        """`map/scopes/create` (`scopeId`, `parent`, `joinPolicy`, `sendPolicy`, `visibility`, ...)."""
        if name is not None:
            params["name"] = name
        return cast(Scope, (await self.call("map/scopes/create", params))["scope"])

    async def delete_scope(self, scope_id: str, *, delete_descendants: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"scopeId": scope_id}
        if delete_descendants:
            params["deleteDescendants"] = True
        return cast(dict[str, Any], await self.call("map/scopes/delete", params))

    async def join_scope(self, scope_id: str, agent_id: str | None = None) -> dict[str, Any]:
        """Joins this agent (or `agent_id`, one it controls) to a scope."""
        target = agent_id or self.agent_id
        result = await self.call("map/scopes/join", {"scopeId": scope_id, "agentId": target})
        if target == self.agent_id and scope_id not in self._scopes:
            self._scopes.append(scope_id)
        return cast(dict[str, Any], result)

    async def leave_scope(self, scope_id: str, agent_id: str | None = None) -> dict[str, Any]:
        target = agent_id or self.agent_id
        result = await self.call("map/scopes/leave", {"scopeId": scope_id, "agentId": target})
        if target == self.agent_id and scope_id in self._scopes:
            self._scopes.remove(scope_id)
        return cast(dict[str, Any], result)
