"""`Methods`: the MAP methods both connection classes offer, one thin call each.

Each sends one request through `call()` (connection.py) and returns the result as the router
sent it, in the shape the TypeScript SDK's method of the same name returns (`list_agents` is
`listAgents`, ...). Nothing here keeps state.
"""

from __future__ import annotations

from typing import Any, Mapping, cast

from .auth import Auth
from .types import Address, AgentsGetResult, AgentsListResult, MessageMeta, Scope, SendResult

__all__ = ["Methods"]


def _page(filter: Mapping[str, Any] | None, limit: int | None, cursor: str | None) -> dict[str, Any]:
    """A listing's parameters: the filter when it names anything, the page's size and cursor
    when given."""
    params: dict[str, Any] = {"filter": filter} if filter else {}
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return params


class Methods:
    """Agents, scopes, steering, sessions, tasks, mail and trajectory, as methods."""

    _auth: Auth | None

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        raise NotImplementedError

    async def send(self, to: Address, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        raise NotImplementedError

    # -- agents, scopes, steering ---------------------------------------------------------

    async def list_agents(
        self, filter: Mapping[str, Any] | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> AgentsListResult:
        params = _page(filter, limit, cursor)
        return cast(AgentsListResult, await self.call("map/agents/list", params))

    async def get_agent(self, agent_id: str, *, include: Mapping[str, Any] | None = None) -> AgentsGetResult:
        params: dict[str, Any] = {"agentId": agent_id}
        if include:
            params["include"] = include
        return cast(AgentsGetResult, await self.call("map/agents/get", params))

    async def get_structure_graph(
        self, *, root_agent_id: str | None = None, depth: int | None = None, include_relationships: bool | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if root_agent_id is not None:
            params["rootAgentId"] = root_agent_id
        if depth is not None:
            params["depth"] = depth
        if include_relationships is not None:
            params["includeRelationships"] = include_relationships
        return cast(dict[str, Any], await self.call("map/structure/graph", params))

    async def list_scopes(self, *, parent: str | None = None) -> dict[str, Any]:
        """`{"scopes": [Scope, ...], "asOf"?}` (the direct children of `parent` when given)."""
        params = {"parent": parent} if parent is not None else {}
        return cast(dict[str, Any], await self.call("map/scopes/list", params))

    async def get_scope(self, scope_id: str) -> Scope:
        return cast(Scope, (await self.call("map/scopes/get", {"scopeId": scope_id}))["scope"])

    async def get_scope_members(
        self, scope_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"scopeId": scope_id}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        return cast(dict[str, Any], await self.call("map/scopes/members", params))

    async def inject(self, agent_id: str, content: Any, delivery: str | None = None) -> dict[str, Any]:
        """Steering (`map/inject`): puts `content` in front of a running agent."""
        params: dict[str, Any] = {"agentId": agent_id, "content": content}
        if delivery is not None:
            params["delivery"] = delivery
        return cast(dict[str, Any], await self.call("map/inject", params))

    async def stop_agent(self, agent_id: str, *, reason: str | None = None, force: bool = False) -> dict[str, Any]:
        """`{"stopping": bool, "agent": Agent}`: the agent gets a `stop` control message."""
        params: dict[str, Any] = {"agentId": agent_id}
        if reason is not None:
            params["reason"] = reason
        if force:
            params["force"] = True
        return cast(dict[str, Any], await self.call("map/agents/stop", params))

    async def suspend_agent(self, agent_id: str, reason: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"agentId": agent_id}
        if reason is not None:
            params["reason"] = reason
        return cast(dict[str, Any], await self.call("map/agents/suspend", params))

    async def resume_agent(self, agent_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("map/agents/resume", {"agentId": agent_id}))

    # -- sessions and authentication ------------------------------------------------------

    async def list_sessions(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("map/session/list", {}))

    async def load_session(self, session_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("map/session/load", {"sessionId": session_id}))

    async def close_session(self, session_id: str | None = None) -> dict[str, Any]:
        params = {"sessionId": session_id} if session_id is not None else {}
        return cast(dict[str, Any], await self.call("map/session/close", params))

    async def refresh_auth(self, auth: Auth) -> dict[str, Any]:
        """Swaps the credential in-band (`map/auth/refresh`), e.g. on `map/auth/expiring`;
        later reconnects use the new one."""
        result = await self.call("map/auth/refresh", auth.to_wire())
        if isinstance(result, dict) and result.get("success"):
            self._auth = auth
        return cast(dict[str, Any], result)

    # -- tasks ----------------------------------------------------------------------------

    async def create_task(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """`map/tasks/create {task}` → `{"task": Task}`."""
        return cast(dict[str, Any], await self.call("map/tasks/create", {"task": dict(task)}))

    async def assign_task(self, task_id: str, agent_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("map/tasks/assign", {"taskId": task_id, "agentId": agent_id}))

    async def update_task(self, task_id: str, **changes: Any) -> dict[str, Any]:
        """`map/tasks/update`: `status`, `title`, `description`, `assignee`, `meta`."""
        return cast(dict[str, Any], await self.call("map/tasks/update", {"taskId": task_id, **changes}))

    async def list_tasks(
        self, filter: Mapping[str, Any] | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        params = _page(filter, limit, cursor)
        return cast(dict[str, Any], await self.call("map/tasks/list", params))

    async def get_task(self, task_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("map/tasks/get", {"taskId": task_id}))

    # -- mail (conversations) ---------------------------------------------------------------

    async def create_conversation(self, **params: Any) -> dict[str, Any]:
        """`mail/create` (`subject`, `type`, `initialParticipants`, `initialTurn`, `metadata`)."""
        return cast(dict[str, Any], await self.call("mail/create", params))

    async def get_conversation(self, conversation_id: str, include: Mapping[str, Any] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"conversationId": conversation_id}
        if include:
            params["include"] = include
        return cast(dict[str, Any], await self.call("mail/get", params))

    async def list_conversations(self, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/list", params))

    async def close_conversation(self, conversation_id: str, reason: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"conversationId": conversation_id}
        if reason is not None:
            params["reason"] = reason
        return cast(dict[str, Any], await self.call("mail/close", params))

    async def join_conversation(self, conversation_id: str, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/join", {"conversationId": conversation_id, **params}))

    async def leave_conversation(self, conversation_id: str, reason: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"conversationId": conversation_id}
        if reason is not None:
            params["reason"] = reason
        return cast(dict[str, Any], await self.call("mail/leave", params))

    async def invite_to_conversation(self, conversation_id: str, participant: Mapping[str, Any], **params: Any) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            await self.call("mail/invite", {"conversationId": conversation_id, "participant": participant, **params}),
        )

    async def record_turn(self, conversation_id: str, content_type: str, content: Any, **params: Any) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            await self.call(
                "mail/turn", {"conversationId": conversation_id, "contentType": content_type, "content": content, **params}
            ),
        )

    async def list_turns(self, conversation_id: str, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/turns/list", {"conversationId": conversation_id, **params}))

    async def create_thread(self, conversation_id: str, root_turn_id: str, **params: Any) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            await self.call("mail/thread/create", {"conversationId": conversation_id, "rootTurnId": root_turn_id, **params}),
        )

    async def list_threads(self, conversation_id: str, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/thread/list", {"conversationId": conversation_id, **params}))

    async def get_conversation_summary(self, conversation_id: str, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/summary", {"conversationId": conversation_id, **params}))

    async def replay_conversation(self, conversation_id: str, **params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("mail/replay", {"conversationId": conversation_id, **params}))

    async def send_with_mail(
        self,
        to: Address,
        payload: Any,
        conversation_id: str,
        *,
        thread_id: str | None = None,
        meta: MessageMeta | None = None,
    ) -> SendResult:
        """A send recorded as a turn of a conversation (`meta.mail`)."""
        mail: dict[str, Any] = {"conversationId": conversation_id}
        if thread_id is not None:
            mail["threadId"] = thread_id
        full: MessageMeta = {**(meta or {}), "mail": mail}
        return await self.send(to, payload, full)

    # -- trajectory -----------------------------------------------------------------------

    async def list_checkpoints(
        self, filter: Mapping[str, Any] | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        params = _page(filter, limit, cursor)
        return cast(dict[str, Any], await self.call("trajectory/list", params))

    async def get_checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("trajectory/get", {"checkpointId": checkpoint_id}))

    async def get_checkpoint_content(self, checkpoint_id: str, include: list[str] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"checkpointId": checkpoint_id}
        if include is not None:
            params["include"] = include
        return cast(dict[str, Any], await self.call("trajectory/content", params))
