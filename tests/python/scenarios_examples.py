"""The examples of examples/python, each run as a user would run it, against its own router."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from typing import Any

from harness import ROOT, STEP, Ctx, bounded, check, eq, scenario
from scenarios_core import agent

EXAMPLES = ROOT / "examples" / "python"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "python" / "src"), "PYTHONUNBUFFERED": "1"}


async def run_example(ctx: Ctx, name: str, *args: str, timeout: float = 60) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / name), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=ENV)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{name} did not finish within {timeout} s") from None
    text = out.decode(errors="replace")
    eq(proc.returncode, 0, f"{name} exit code; output: {text[-600:]}")
    return text


@scenario("examples: tool_agent.py answers through its tools, with a trajectory and a task", timeout=60)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    out = await run_example(ctx, "tool_agent.py", ctx.url, "--ask", "population of Paris plus population of Lyon")
    check(re.search(r"^answer: 2624900 \(4 steps, task task-\S+\)$", out, re.M), out)
    check("trajectory: lookup, lookup, add, final" in out, out)
    out = await run_example(ctx, "tool_agent.py", ctx.url, "--ask", "words in 'the quick brown fox' times 3")
    check(re.search(r"^answer: 12 \(3 steps", out, re.M), out)


@scenario("examples: orchestrator.py spawns stdio workers, asks, steers, suspends, resumes and stops them", timeout=90)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    out = await run_example(ctx, "orchestrator.py", ctx.url, "--workers", "2", timeout=80)
    eq(len(re.findall(r"^spawned worker-\d", out, re.M)), 2, "two workers")
    check("task to the team: delivered to 2 workers" in out, out)
    eq(len(re.findall(r"answered \{'echo': \{'question': 'status\?'\}, 'by': 'worker-\d'\}", out)), 2, "both answered")
    check("suspended: suspended" in out and "resumed: registered" in out, out)
    check(out.rstrip().endswith("all workers stopped"), out)


@scenario("examples: dashboard.py shows the snapshot, then the events that follow", timeout=40)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    before = await agent(ctx, "already-here", role="old")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / "dashboard.py"), ctx.url, "--types", "agent.*", "--max-events", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not lines or lines[-1] != "watching":
            raw = await bounded(proc.stdout.readline(), "the dashboard's snapshot")
            check(raw, f"the dashboard ended early: {lines}")
            lines.append(raw.decode().rstrip())
        check(any(before.agent_id in line and "already-here" in line for line in lines), f"snapshot: {lines}")
        late = await agent(ctx, "late", role="new")
        await late.busy()
        await late.idle()
        out, _ = await bounded(proc.communicate(), "the dashboard exits after 3 events")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    events = out.decode().splitlines()
    eq([line.split()[1] for line in events], ["agent_registered", "agent_state_changed", "agent_state_changed"], "events")
    check(late.agent_id in events[0], events[0])
    eq(proc.returncode, 0, "exit code")


@scenario("examples: echo_agent.py over WebSocket answers and stops on the router's stop", timeout=40)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    from map_client import ClientConnection

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / "echo_agent.py"), ctx.url, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env={**ENV, "MAP_AGENT_NAME": "ws-echo"})
    assert proc.stdout is not None
    try:
        ready = (await bounded(proc.stdout.readline(), "ready line")).decode()
        m = re.match(r"echo agent (\S+) ready", ready)
        check(m, ready)
        assert m is not None
        async with ClientConnection.connect(ctx.url, name="asker") as c:
            r = await c.request(m.group(1), [1, 2, 3], timeout=STEP)
            eq(r.get("payload"), {"echo": [1, 2, 3], "by": "ws-echo"}, "echo")
            states = await c.subscribe({"eventTypes": ["agent_state_changed"], "fromAgents": [m.group(1)]})
            await c.stop_agent(m.group(1), reason="done")
            await bounded(proc.wait(), "the agent exits on stop")
            seen = [e["data"]["newState"] async for e in _until_stopped(states)]
            eq(seen[-1], "stopped", f"it marked itself stopped: {seen}")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    eq(proc.returncode, 0, "exit code")


async def _until_stopped(sub: Any) -> Any:
    while True:
        e = await sub.next(STEP)
        yield e
        if e["data"]["newState"] == "stopped":
            return


@scenario("examples: echo_agent.py stdio: bridged by `map-router agent --`, with an API key", timeout=40)
async def _(ctx: Ctx) -> None:
    from map_client import Auth, ClientConnection
    from scenarios_more import ALICE_KEY, AUTH_CONFIG

    r = await ctx.start_router(AUTH_CONFIG)
    proc = await asyncio.create_subprocess_exec(
        r.binary, "agent", "--url", ctx.url, "--name", "bridged", "--role", "echo", "--",
        sys.executable, str(EXAMPLES / "echo_agent.py"), "stdio:",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={**ENV, "MAP_ROUTER_API_KEY": ALICE_KEY})
    try:
        async with ClientConnection.connect(ctx.url, name="asker", auth=Auth.api_key(ALICE_KEY)) as c:
            async def bridged() -> str:
                while True:
                    for a in (await c.list_agents({"roles": ["echo"]}))["agents"]:
                        return a["id"]
                    await asyncio.sleep(0.05)

            aid = await bounded(bridged(), "the bridged agent registers")
            reply = await c.request(aid, {"via": "bridge"}, timeout=STEP)
            eq(reply.get("payload"), {"echo": {"via": "bridge"}, "by": "bridged"}, "the bridged Python agent answers")
            await c.stop_agent(aid, reason="done")
            await bounded(proc.wait(), "the bridge exits with its program")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    eq(proc.returncode, 0, "exit code of the program")
