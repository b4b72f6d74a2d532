"""Core scenarios: connect, agents, scopes, addresses, request/reply, events, replay, errors."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import QUIET, STEP, Ctx, bounded, check, eq, expect_code, scenario, until

from map_client import (
    AgentConnection,
    AgentError,
    AuthError,
    ClientConnection,
    Event,
    Message,
    ProtocolError,
    RoutingError,
    Subscription,
)


class Inbox:
    """Every message an agent (or client) receives, via on_message."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.messages: list[Message] = []
        conn.on_message(self.messages.append)

    async def wait(self, pred: Any, what: str) -> Message:
        return await until(lambda: next((m for m in self.messages if pred(m)), None), what)  # type: ignore[no-any-return]

    def has(self, message_id: str) -> bool:
        return any(m["id"] == message_id for m in self.messages)


async def agent(ctx: Ctx, name: str, **kw: Any) -> AgentConnection:
    a = await bounded(AgentConnection.connect(ctx.url, name=name, **kw), f"agent {name} connects")
    ctx.defer(a.abort)
    a.inbox = Inbox(a)  # type: ignore[attr-defined]
    return a


async def client(ctx: Ctx, name: str = "client", **kw: Any) -> ClientConnection:
    c = await bounded(ClientConnection.connect(ctx.url, name=name, **kw), f"client {name} connects")
    ctx.defer(c.abort)
    return c


def inbox(a: Any) -> Inbox:
    return a.inbox  # type: ignore[no-any-return]


async def next_event(sub: Subscription, pred: Any = None, what: str = "event") -> Event:
    async def find() -> Event:
        async for e in sub:
            if pred is None or pred(e):
                return e
        raise AssertionError(f"subscription ended before {what}")

    return await bounded(find(), what)


async def take(sub: Subscription, n: int, what: str) -> list[Event]:
    out: list[Event] = []

    async def fill() -> None:
        async for e in sub:
            out.append(e)
            if len(out) == n:
                return

    try:
        await asyncio.wait_for(fill(), STEP)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out after {STEP} s: {what} ({len(out)} of {n})") from None
    if len(out) < n:
        raise AssertionError(f"the stream ended: {what} ({len(out)} of {n})")
    return out


async def quiet(sub: Subscription, pred: Any, what: str) -> None:
    """Nothing matching `pred` arrives within QUIET seconds."""
    try:
        e = await asyncio.wait_for(next_event(sub, pred, what), QUIET)
    except (asyncio.TimeoutError, AssertionError):
        return
    raise AssertionError(f"{what}: got {e}")


async def family(ctx: Ctx) -> dict[str, AgentConnection]:
    a = await agent(ctx, "A", role="lead")
    b = await agent(ctx, "B", role="worker", parent=a.agent_id)
    c = await agent(ctx, "C", role="worker", parent=a.agent_id)
    g = await agent(ctx, "G", role="helper", parent=b.agent_id)
    return {"A": a, "B": b, "C": c, "G": g}


async def expect_delivery(res: Any, expected: list[AgentConnection], everyone: list[AgentConnection], what: str) -> None:
    check(isinstance(res["messageId"], str), f"{what}: messageId")
    eq(sorted(res["delivered"]), sorted(a.agent_id for a in expected), f"{what}: delivered")
    for a in expected:
        await until(lambda a=a: inbox(a).has(res["messageId"]), f"{what}: {a.name} receives it")
    await asyncio.sleep(QUIET)
    for a in everyone:
        if a not in expected:
            check(not inbox(a).has(res["messageId"]), f"{what}: {a.name} must not receive it")


# ------------------------------------------------------------------------------------------
# connect


@scenario("connect: client and agent results, ids and capabilities")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    c = await client(ctx, "dash")
    check(isinstance(c.session_id, str) and c.session_id, "client session id")
    eq(c.connect_result.get("participantType"), "client", "participant type")
    eq(c.capabilities["messaging"]["canReceive"], False, "clients do not receive by default")
    check(isinstance(c.resume_token, str), "resume token")
    a = await agent(ctx, "worker", role="w")
    eq(a.agent_id, a.participant_id, "an agent connection's first agent id is its participant id")
    eq(a.agent["state"] if a.agent else None, "registered", "initial state")
    eq(a.agent["name"] if a.agent else None, "worker", "name")


@scenario("connect: async with closes the session; participant events")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx, "observer")
    sub = await obs.subscribe({"eventTypes": ["participant_connected", "participant_disconnected", "agent_unregistered"]})
    async with AgentConnection.connect(ctx.url, name="short") as a:
        aid = a.agent_id
        e = await next_event(sub, lambda e: e["type"] == "participant_connected", "participant_connected")
        eq(e["data"]["participantId"], aid, "connected participant")
    check(a.state == "closed", "closed after the block")
    eq(await bounded(_all(a.messages()), "messages() after close"), [], "messages() ends on a closed connection")
    await next_event(sub, lambda e: e["type"] == "participant_disconnected", "participant_disconnected")
    e = await next_event(sub, lambda e: e["type"] == "agent_unregistered", "agent_unregistered")
    eq(e["data"]["agentId"], aid, "its agent unregistered")
    eq(e["data"].get("reason"), "owner_disconnected", "reason")


@scenario("connect: a resume token resumes the session on a new connection")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    c = await client(ctx)
    token = await c.disconnect()
    check(isinstance(token, str), "disconnect returns a resume token")
    again = await client(ctx, resume_token=token)
    eq(again.session_id, c.session_id, "same session")
    eq(again.reconnected, True, "reconnected")
    fresh = await client(ctx, resume_token="resume_unknown")
    check(fresh.session_id != c.session_id and not fresh.reconnected, "an unknown token starts a new session")


# ------------------------------------------------------------------------------------------
# agents


@scenario("agents: register, list with filters, get with include, graph")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    f = await family(ctx)
    c = await client(ctx)
    listed = await c.list_agents()
    eq(len(listed["agents"]), 4, "four agents")
    workers = await c.list_agents({"roles": ["worker"]})
    eq(sorted(a["name"] for a in workers["agents"]), ["B", "C"], "roles filter")
    kids = await c.list_agents({"parent": f["A"].agent_id})
    eq(sorted(a["name"] for a in kids["agents"]), ["B", "C"], "parent filter")
    page = await c.list_agents(limit=3)
    eq(len(page["agents"]), 3, "first page")
    rest = await c.list_agents(limit=3, cursor=page["nextCursor"])
    eq(len(rest["agents"]), 1, "second page")
    got = await c.get_agent(f["B"].agent_id, include={"parent": True, "children": True})
    eq(got["agent"]["name"], "B", "get")
    eq(got["parent"]["name"], "A", "include parent")
    eq([a["name"] for a in got["children"]], ["G"], "include children")
    graph = await c.get_structure_graph()
    edges = {(e["from"], e["to"]) for e in graph["edges"] if e["type"] == "parent-child"}
    check((f["A"].agent_id, f["B"].agent_id) in edges and (f["B"].agent_id, f["G"].agent_id) in edges, "graph edges")


@scenario("agents: state, metadata, done; spawn with initialMessage; unregister")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    sub = await obs.subscribe({"eventTypes": ["agent_state_changed"]})
    a = await agent(ctx, "stateful")
    await a.busy()
    e = await next_event(sub, what="busy")
    eq((e["data"]["previousState"], e["data"]["newState"]), ("registered", "busy"), "busy transition")
    updated = await a.update_metadata({"k": 1})
    eq(updated.get("metadata", {}).get("k"), 1, "metadata merged")
    spawned = await a.spawn(name="kid", role="child", initial_message={"payload": {"hello": "kid"}})
    kid = spawned["agent"]
    eq(kid["parent"], a.agent_id, "spawned child's parent")
    msg = await inbox(a).wait(lambda m: m["to"] == {"agent": kid["id"]}, "initialMessage reaches the spawner's connection")
    eq(msg.get("payload"), {"hello": "kid"}, "initial payload")
    await a.done()
    e = await next_event(sub, lambda e: e["data"]["newState"] == "stopped", "stopped")
    await expect_code(a.busy(), 3001, "nothing leaves stopped")


@scenario("agents: clients may not register or create scopes (1003); taken id is 3000")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    c = await client(ctx)
    err = await expect_code(c.call("map/agents/register", {"name": "x"}), 1003, "client register")
    check(isinstance(err, AuthError), "1003 is an AuthError")
    a = await agent(ctx, "one")
    err = await expect_code(AgentConnection.connect(ctx.url, name="two", agent_id=a.agent_id, reconnect=False), 3000,
                            "a live agent id")
    check(isinstance(err, AgentError), "3000 is an AgentError")


# ------------------------------------------------------------------------------------------
# scopes


@scenario("scopes: create, list, get, join, members, leave, delete with events")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    sub = await obs.subscribe({"eventTypes": ["scope_created", "scope_member_joined", "scope_member_left", "scope_deleted"]})
    a = await agent(ctx, "owner")
    b = await agent(ctx, "member")
    team = await a.create_scope("team", sendPolicy="any")
    e = await next_event(sub, what="scope_created")
    eq(e["data"]["scopeId"], team["id"], "scope_created")
    eq([s["id"] for s in (await obs.list_scopes())["scopes"]], [team["id"]], "list")
    eq((await obs.get_scope(team["id"]))["name"], "team", "get")
    await a.join_scope(team["id"])
    await b.join_scope(team["id"])
    members = await obs.get_scope_members(team["id"])
    eq(sorted(members["members"]), sorted([a.agent_id, b.agent_id]), "members")
    await b.leave_scope(team["id"])
    types = [e["type"] for e in await take(sub, 3, "join, join, leave")]
    eq(types, ["scope_member_joined", "scope_member_joined", "scope_member_left"], "membership events")
    await a.delete_scope(team["id"])
    e = await next_event(sub, what="scope_deleted")
    eq(e["type"], "scope_deleted", "deleted")
    err = await expect_code(obs.get_scope(team["id"]), 2002, "deleted scope")
    check(isinstance(err, RoutingError), "2002 is a RoutingError")


# ------------------------------------------------------------------------------------------
# addresses


@scenario("send: every address form reaches exactly its recipients")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    f = await family(ctx)
    A, B, C, G = f["A"], f["B"], f["C"], f["G"]
    everyone = [A, B, C, G]
    team = await A.create_scope("team")
    await A.join_scope(team["id"])
    await B.join_scope(team["id"])
    await C.join_scope(team["id"])
    await expect_delivery(await A.send(B.agent_id, {"n": 1}), [B], everyone, "string id")
    await expect_delivery(await A.send(f"agent:{C.agent_id}", {"n": 2}), [C], everyone, "agent: prefix")
    await expect_delivery(await A.send({"agent": G.agent_id}, {"n": 3}), [G], everyone, "{agent}")
    await expect_delivery(await A.send({"agents": [B.agent_id, C.agent_id, B.agent_id]}, {"n": 4}), [B, C], everyone, "{agents}")
    await expect_delivery(await A.send_to_scope(team["id"], {"n": 5}), [B, C], everyone, "{scope}")
    await expect_delivery(await A.send_to_role("worker", {"n": 6}), [B, C], everyone, "{role}")
    await expect_delivery(await G.send_to_role("worker", {"n": 7}, within=team["id"]), [B, C], everyone, "{role, within}")
    await expect_delivery(await G.send_to_parent({"n": 8}), [B], everyone, "{parent}")
    await expect_delivery(await A.send_to_children({"n": 9}), [B, C], everyone, "{children}")
    await expect_delivery(await G.send({"ancestors": True}, {"n": 10}), [A, B], everyone, "{ancestors}")
    await expect_delivery(await A.send({"descendants": True, "depth": 2}, {"n": 11}), [B, C, G], everyone, "{descendants}")
    await expect_delivery(await B.send_to_siblings({"n": 12}), [C], everyone, "{siblings}")
    await expect_delivery(await A.broadcast({"n": 13}), [B, C, G], everyone, "{broadcast}")
    res = await A.send({"system": True}, {"n": 14})
    eq(res["delivered"], [], "{system: true}")
    c = await client(ctx, "watcher")
    cin = Inbox(c)
    res = await A.send({"participant": c.participant_id}, {"n": 15})
    eq(res["delivered"], [c.participant_id], "{participant}")
    await cin.wait(lambda m: m["id"] == res["messageId"], "the client gets it")
    res = await A.send({"participants": "clients"}, {"n": 16})
    eq(res["delivered"], [c.participant_id], "{participants: clients}")
    await expect_code(A.send("nobody-here", {}), 2000, "unknown string address")
    await expect_code(A.send({"agent": "nobody"}, {}), 2001, "unknown agent")
    await expect_code(A.send({"scope": "nope"}, {}), 2002, "unknown scope")
    await expect_code(c.send({"broadcast": True}, {}), 1003, "clients may not broadcast")
    await expect_code(A.send({"system": "elsewhere", "agent": "x"}, {}), 5001, "unknown system")


@scenario("send: to, meta and payload arrive as sent")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "sender")
    b = await agent(ctx, "receiver")
    payload = {"z": 1, "a": [1, 2, {"nested": "ü"}], "m": None}
    res = await a.send({"agent": b.agent_id}, payload, {"priority": "high", "protocol": "x-custom"})  # type: ignore[typeddict-unknown-key]
    got = await inbox(b).wait(lambda m: m["id"] == res["messageId"], "message")
    eq(got["from"], a.agent_id, "from")
    eq(got["to"], {"agent": b.agent_id}, "to as sent")
    eq(got.get("payload"), payload, "payload")
    eq(list((got.get("payload") or {}).keys()), ["z", "a", "m"], "key order")
    eq(got.get("meta", {}).get("protocol"), "x-custom", "meta extension kept")


# ------------------------------------------------------------------------------------------
# request / reply


@scenario("request: a client's request gets the agent's reply, not its own request")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "echo")

    @a.on_message
    async def answer(m: Message) -> None:
        await a.reply(m, {"echo": m.get("payload")})

    c = await client(ctx)
    reply = await bounded(c.request({"agent": a.agent_id}, {"q": 1}, timeout=STEP), "reply")
    eq(reply.get("payload"), {"echo": {"q": 1}}, "reply payload")
    eq(reply["from"], a.agent_id, "from the agent")
    check(reply.get("meta", {}).get("isResult") is True, "isResult")
    # Concurrent requests are matched by correlation id, each to its own reply.
    replies = await bounded(asyncio.gather(*(c.request(a.agent_id, {"i": i}, timeout=STEP) for i in range(20))), "20 replies")
    eq([r.get("payload") for r in replies], [{"echo": {"i": i}} for i in range(20)], "each its own reply")
    # The replies went to the requests, not to the client's inbox.
    cin = Inbox(c)
    await asyncio.sleep(QUIET)
    eq(cin.messages, [], "no reply leaks into messages")


@scenario("request: agent to agent, handler awaiting inside messages(); a timeout raises")
async def _(ctx: Ctx) -> None:
    from map_client import MapTimeoutError

    await ctx.start_router()
    server = await bounded(AgentConnection.connect(ctx.url, name="server"), "server")
    ctx.defer(server.abort)

    async def serve() -> None:
        async for m in server.messages():
            # Awaiting another call inside the loop must not deadlock the connection.
            await server.update_metadata({"last": m.get("payload")})
            await server.reply(m, {"ok": m.get("payload")})

    task = asyncio.get_running_loop().create_task(serve())
    ctx.defer(lambda: asyncio.sleep(0, task.cancel()))
    asker = await agent(ctx, "asker")
    r = await bounded(asker.request(server.agent_id, "ping", timeout=STEP), "reply")
    eq(r.get("payload"), {"ok": "ping"}, "reply")
    silent = await agent(ctx, "silent")
    try:
        await asker.request(silent.agent_id, "anyone?", timeout=0.3)
    except MapTimeoutError:
        pass
    else:
        raise AssertionError("a request nobody answers must time out")


# ------------------------------------------------------------------------------------------
# subscriptions


@scenario("subscribe: unfiltered stream in order; message_sent then message_delivered")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    sub = await obs.subscribe()
    a = await agent(ctx, "a")
    b = await agent(ctx, "b")
    res = await a.send(b.agent_id, {"x": 1})
    sent = await next_event(sub, lambda e: e["type"] == "message_sent", "message_sent")
    eq(sent["data"]["messageId"], res["messageId"], "message_sent id")
    got = await next_event(sub, lambda e: e["type"] == "message_delivered", "message_delivered")
    eq(got["data"]["deliveredTo"], [b.agent_id], "deliveredTo")
    eq(got["data"]["message"].get("payload"), {"x": 1}, "the message in the event")
    check(sent["id"] < got["id"], "event ids increase")


@scenario("subscribe: filters (eventTypes both spellings, wildcard, fromAgents, roles, scopes)")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    dotted = await obs.subscribe({"eventTypes": ["agent.registered"]})
    wild = await obs.subscribe({"eventTypes": ["agent.*"]})
    a = await agent(ctx, "a", role="lead")
    b = await agent(ctx, "b", role="worker")
    from_b = await obs.subscribe({"fromAgents": [b.agent_id]})
    roles = await obs.subscribe({"roles": ["worker"], "eventTypes": ["agent_state_changed"]})
    team = await a.create_scope("team")
    scoped = await obs.subscribe({"scopes": [team["id"]]})
    e = await next_event(dotted, what="dotted")
    eq((e["type"], e["data"]["agentId"]), ("agent_registered", a.agent_id), "agent.registered matches agent_registered")
    await a.busy()
    await b.busy()
    eq((await next_event(roles, what="roles"))["data"]["agentId"], b.agent_id, "roles: only the worker")
    await quiet(roles, lambda e: e["data"]["agentId"] == a.agent_id, "roles must not match the lead")
    eq((await next_event(from_b, what="fromAgents"))["source"], b.agent_id, "fromAgents")
    types = [e["type"] for e in await take(wild, 4, "agent.*")]
    eq(types, ["agent_registered", "agent_registered", "agent_state_changed", "agent_state_changed"], "wildcard")
    await a.join_scope(team["id"])
    await a.send_to_agent(b.agent_id, "not in the scope")
    e = await next_event(scoped, what="scope event")
    eq((e["type"], e["data"]["scopeId"]), ("scope_member_joined", team["id"]), "scopes filter")
    await quiet(scoped, lambda e: e["type"].startswith("message"), "a direct send is not a scope event")


@scenario("subscribe: unsubscribe ends the stream; excludeOwnEvents")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "a")
    own = await a.subscribe({"eventTypes": ["agent_state_changed"]}, exclude_own_events=True)
    b = await agent(ctx, "b")
    await a.busy()
    await b.busy()
    e = await next_event(own, what="b's event")
    eq(e["data"]["agentId"], b.agent_id, "own events excluded")
    await own.unsubscribe()
    check(own.closed, "closed")
    rest = [e async for e in own]
    eq(rest, [], "nothing after unsubscribe")


@scenario("subscribe: credit window: a slow reader holds the router at its window, nothing lost")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    sub = await obs.subscribe({"eventTypes": ["agent_state_changed"]}, window=8)
    a = await agent(ctx, "a")
    for i in range(40):
        await a.update_state("busy" if i % 2 == 0 else "idle")
    await until(lambda: sub.pending >= 8, "the window filled")
    await asyncio.sleep(QUIET)
    check(sub.pending <= 8, f"at most the window is queued here, got {sub.pending}")
    events = await take(sub, 40, "all 40 after taking")
    eq([e["data"]["newState"] for e in events], ["busy" if i % 2 == 0 else "idle" for i in range(40)], "in order, none lost")


# ------------------------------------------------------------------------------------------
# replay


@scenario("replay: pages, hasMore, filters, replay_all and replay_from on subscribe")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    obs = await client(ctx)
    a = await agent(ctx, "a")
    for i in range(6):
        await a.update_state("busy" if i % 2 == 0 else "idle")
    page = await obs.replay(filter={"eventTypes": ["agent_state_changed"]}, limit=4)
    eq(len(page["events"]), 4, "page size")
    eq(page["hasMore"], True, "hasMore")
    nxt = await obs.replay(after_event_id=page["events"][-1]["eventId"], filter={"eventTypes": ["agent_state_changed"]}, limit=4)
    eq(len(nxt["events"]), 2, "the rest")
    eq(nxt["hasMore"], False, "no more")
    everything = [e async for e in obs.replay_all(filter={"eventTypes": ["agent_state_changed"]}, page=2)]
    eq([e["eventId"] for e in everything], [e["eventId"] for e in page["events"] + nxt["events"]], "replay_all pages")
    third = everything[2]["eventId"]
    sub = await obs.subscribe({"eventTypes": ["agent_state_changed"]}, replay_from=third)
    got = await take(sub, 3, "history after the third")
    eq([e["id"] for e in got], [e["eventId"] for e in everything[3:]], "replay_from continues after the id")
    await a.busy()
    live = await next_event(sub, what="then live")
    eq(live["data"]["newState"], "busy", "live after history")
    await expect_code(obs.replay(after_event_id="not-an-id"), -32602, "malformed id")


# ------------------------------------------------------------------------------------------
# errors


@scenario("errors: codes, categories and data")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    c = await client(ctx)
    e = await expect_code(c.call("map/nope"), -32601, "unknown method")
    check(isinstance(e, ProtocolError), "ProtocolError")
    eq(e.message, "Method not found: map/nope", "message")
    e = await expect_code(c.call("map/agents/get", {}), -32602, "missing agentId")
    check(isinstance(e.details, dict) and e.details, "details say why")
    e = await expect_code(c.get_agent("nope"), 2001, "unknown agent")
    eq(e.data.get("category"), "routing", "category")
    check(isinstance(e, RoutingError), "RoutingError")
    eq(str(e), "2001 Agent not found: nope", "str")


async def _all(it: Any) -> list[Any]:
    return [x async for x in it]


@scenario("bounds: messages nobody reads never stall the connection (the newest kept, the rest counted)")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    dash = await client(ctx, "dash", max_queued_messages=8)
    events = await dash.subscribe({"eventTypes": ["agent_state_changed"]})
    a = await agent(ctx, "chatty")
    for i in range(20):
        await a.send({"participant": dash.participant_id}, {"i": i})
    await until(lambda: dash.dropped_messages == 12, f"12 dropped (got {dash.dropped_messages})")
    listed = await bounded(dash.list_agents(), "calls still answered")
    eq(len(listed["agents"]), 1, "list")
    await a.busy()
    eq((await next_event(events, what="events still flow"))["data"]["newState"], "busy", "event")
    got = []
    async for m in dash.messages():
        got.append(m.get("payload", {}).get("i"))
        if len(got) == 8:
            break
    eq(got, list(range(12, 20)), "the newest 8 kept, in order")


@scenario("messages: every messages() iterator and every handler sees every message, in order")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "fanout")  # has an on_message handler already (its inbox)
    got: list[list[Any]] = [[], []]

    async def read(i: int) -> None:
        async for m in a.messages():
            got[i].append(m.get("payload"))
            if len(got[i]) == 5:
                return

    loop = asyncio.get_running_loop()
    readers = [loop.create_task(read(0)), loop.create_task(read(1))]
    await asyncio.sleep(0)  # both iterators registered before anything arrives
    s = await agent(ctx, "sender")
    for i in range(5):
        await s.send(a.agent_id, i)
    await bounded(asyncio.gather(*readers), "both iterators")
    eq(got, [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]], "each iterator")
    await until(lambda: len(inbox(a).messages) == 5, "the handler")
    eq([m.get("payload") for m in inbox(a).messages], [0, 1, 2, 3, 4], "the handler, in order")
