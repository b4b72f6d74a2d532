"""Extensions and sessions through the Python client: tasks, mail, trajectory, steering,
sessions, and a credential refreshed on `map/auth/expiring`."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import QUIET, STEP, Ctx, bounded, check, eq, expect_code, scenario, until
from scenarios_core import agent, client, inbox, next_event
from scenarios_more import AUTH_CONFIG, jwt

from map_client import Auth, ClientConnection, MailError, MapConnectionError, ResourceError, TrajectoryError, control_of


@scenario("tasks: create, assign, update, list and get; task.* events; unknown task is 14001")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    c = await client(ctx)
    events = await c.subscribe({"eventTypes": ["task.*"]})
    a = await agent(ctx, "doer")
    task = (await c.create_task({"title": "write it", "meta": {"z": 1}}))["task"]
    check(task["id"].startswith("task-"), task["id"])
    eq((await next_event(events, what="task.created"))["type"], "task.created", "created")
    assigned = (await c.assign_task(task["id"], a.agent_id))["task"]
    eq(assigned["assignee"], a.agent_id, "assigned")
    started = (await a.update_task(task["id"], status="in_progress", meta={"step": 1}))["task"]
    eq(started["status"], "in_progress", "status")
    await a.update_task(task["id"], status="completed")
    mine = await a.list_tasks({"assignee": a.agent_id, "status": ["completed"]})
    eq([t["id"] for t in mine["tasks"]], [task["id"]], "list with a filter")
    eq((await c.get_task(task["id"]))["task"]["status"], "completed", "get")
    types = [t async for t in _take_types(events, {"task.completed"})]
    check("task.assigned" in types and "task.status" in types, f"events {types}")
    err = await expect_code(c.update_task("no-such-task", status="failed"), 14001, "unknown task")
    check(isinstance(err, ResourceError), "tasks errors are ResourceError (category resource)")


async def _take_types(sub: Any, last: set[str]) -> Any:
    while True:
        e = await sub.next(STEP)
        yield e["type"]
        if e["type"] in last:
            return


@scenario("mail: conversations, send_with_mail turns, list_turns, close; an outsider sees nothing")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "alice")
    b = await agent(ctx, "bob")
    eve = await agent(ctx, "eve")
    eve_events = await eve.subscribe({"eventTypes": ["mail.*"]})
    created = await a.create_conversation(subject="py", metadata={"z": 1, "a": 2})
    conv = created["conversation"]
    check(conv["id"].startswith("conv-"), conv["id"])
    eq(created["participant"]["role"], "initiator", "initiator")
    await a.send_with_mail({"agent": b.agent_id}, {"hello": "bob"}, conv["id"])
    got = await inbox(b).wait(lambda m: m.get("meta", {}).get("mail", {}).get("conversationId") == conv["id"], "bob")
    eq(got.get("payload"), {"hello": "bob"}, "payload")
    await b.send_with_mail({"agent": a.agent_id}, "hello alice", conv["id"])
    await a.record_turn(conv["id"], "text", "noted")
    turns = (await a.list_turns(conv["id"]))["turns"]
    eq([t["content"] for t in turns], [{"hello": "bob"}, "hello alice", "noted"], "turns")
    eq((await a.close_conversation(conv["id"], "done"))["conversation"]["status"], "completed", "closed")
    err = await expect_code(b.send_with_mail({"agent": a.agent_id}, "late", conv["id"]), 10001, "closed conversation")
    check(isinstance(err, MailError), "MailError")
    await expect_code(eve.get_conversation(conv["id"]), 10000, "outsider get")
    eq((await eve.list_conversations())["conversations"], [], "outsider lists nothing")
    try:
        e = await eve_events.next(QUIET)
    except asyncio.TimeoutError:
        pass
    else:
        raise AssertionError(f"the outsider saw {e}")


@scenario("trajectory: report, list, get; unknown checkpoint is 13001; content asked of the agent")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "worker")

    def provide(params: Any) -> None:
        asyncio.get_running_loop().create_task(a.notify(
            "trajectory/content.response",
            {"requestId": params["requestId"], "artifacts": {"notes": f"content of {params['checkpointId']}"}}))

    a.on_notification("trajectory/content.request", provide)
    c = await client(ctx)
    seen = await c.subscribe({"eventTypes": ["trajectory.checkpoint"]})
    cp = (await a.report_checkpoint("cp-1", label="step one", metadata={"k": 1}))["checkpoint"]
    eq((cp["id"], cp["agentId"]), ("cp-1", a.agent_id), "checkpoint")
    check(isinstance(cp.get("timestamp"), int), "server timestamp")
    eq((await next_event(seen, what="event"))["data"]["checkpoint"]["id"], "cp-1", "trajectory.checkpoint event")
    eq([x["id"] for x in (await c.list_checkpoints({"agentId": a.agent_id}))["checkpoints"]], ["cp-1"], "list")
    eq((await c.get_checkpoint("cp-1"))["checkpoint"]["label"], "step one", "get")
    content = (await c.get_checkpoint_content("cp-1"))["content"]
    eq(content["artifacts"], {"notes": "content of cp-1"}, "content from the agent")
    err = await expect_code(c.get_checkpoint("nope"), 13001, "unknown checkpoint")
    check(isinstance(err, TrajectoryError), "TrajectoryError")


@scenario("steering: inject, suspend, resume and stop reach the agent as control messages")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    a = await agent(ctx, "steered")
    c = await client(ctx)
    r = await c.inject(a.agent_id, "focus", "queue")
    eq(r.get("injected"), True, "injected")
    m = await inbox(a).wait(lambda m: m["from"] == "system" and m.get("payload") is not None, "injected content")
    check(control_of(m) is None, "injected content is not a control message")
    eq((await c.suspend_agent(a.agent_id))["agent"]["state"], "suspended", "suspended")
    await inbox(a).wait(lambda m: control_of(m) == "suspend", "suspend control")
    await expect_code(c.suspend_agent(a.agent_id), 3001, "suspending twice")
    await c.resume_agent(a.agent_id)
    await inbox(a).wait(lambda m: control_of(m) == "resume", "resume control")
    stopping = await c.stop_agent(a.agent_id, reason="enough")
    eq(stopping["agent"]["state"], "stopping", "stopping")
    stop = await inbox(a).wait(lambda m: control_of(m) == "stop", "stop control")
    eq(stop.get("payload", {}).get("reason"), "enough", "reason")


@scenario("sessions: list_sessions shows a principal its own; close_session ends a detached one", timeout=30)
async def _(ctx: Ctx) -> None:
    await ctx.start_router(AUTH_CONFIG)
    key = Auth.api_key("ak-interop-alice-0123456789")
    a1 = await client(ctx, "a1", auth=key)
    a2 = await client(ctx, "a2", auth=key)
    b = await client(ctx, "b", auth=Auth.bearer(jwt("bob")))
    mine = sorted(s["id"] for s in (await a2.list_sessions())["sessions"])
    eq(mine, sorted([a1.session_id, a2.session_id]), "alice's sessions")
    eq([s["id"] for s in (await b.list_sessions())["sessions"]], [b.session_id], "bob's")
    dropped = await agent(ctx, "dropped", auth=key, reconnect=False)
    watch = await a1.subscribe({"eventTypes": ["agent_orphaned", "agent_unregistered"]})
    await dropped.abort()
    await next_event(watch, lambda e: e["type"] == "agent_orphaned", "orphaned")
    closed = await a1.close_session(dropped.session_id)
    eq(closed["closed"], True, "closed")
    e = await next_event(watch, lambda e: e["type"] == "agent_unregistered", "unregistered")
    eq(e["data"].get("reason"), "session_closed", "reason")
    await expect_code(b.load_session(a1.session_id or ""), 16000, "another principal's session")


@scenario("auth: map/auth/expiring, then refresh_auth keeps the session; without a refresh it ends (4001)", timeout=30)
async def _(ctx: Ctx) -> None:
    await ctx.start_router(AUTH_CONFIG)
    c = await bounded(ClientConnection.connect(ctx.url, name="refresher", auth=Auth.bearer(jwt("dash", 2)),
                                               reconnect=False), "connect")
    ctx.defer(c.abort)
    notices: list[Any] = []
    refreshed: list[Any] = []

    def on_expiring(params: Any) -> None:
        notices.append(params)

        async def refresh() -> None:
            refreshed.append(await c.refresh_auth(Auth.bearer(jwt("dash", 600))))

        asyncio.get_running_loop().create_task(refresh())

    c.on_notification("map/auth/expiring", on_expiring)
    lapsing = await bounded(ClientConnection.connect(ctx.url, name="lapse", auth=Auth.bearer(jwt("lapse", 2)),
                                                     reconnect=False), "connect")
    ctx.defer(lapsing.abort)
    await until(lambda: refreshed, "map/auth/expiring and the refresh", timeout=STEP)
    check(isinstance(notices[0].get("expiresAt"), int), f"notice {notices[0]}")
    eq(refreshed[0].get("success"), True, "refreshed")
    try:
        await bounded(lapsing.wait_closed(), "the unrefreshed session ends", timeout=STEP)
    except MapConnectionError as e:
        check("4001" in str(e), f"closed with 4001: {e}")
    else:
        raise AssertionError("the connection whose credential expired must end with an error")
    await asyncio.sleep(0.5)
    check(c.is_connected, "the refreshed session outlives its first credential")
    listed = await c.list_agents()
    check("agents" in listed, "and still answers")
