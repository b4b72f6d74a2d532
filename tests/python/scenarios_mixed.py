"""Python agents and clients with TypeScript SDK agents and clients, through one router."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harness import ROOT, STEP, Ctx, bounded, check, eq, scenario
from scenarios_core import agent, client

from map_client import Message

PEER = ROOT / "tests" / "python" / "ts_peer.mjs"


async def node(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "node", str(PEER), *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


async def line(proc: asyncio.subprocess.Process, prefix: str) -> str:
    assert proc.stdout is not None
    raw = await bounded(proc.stdout.readline(), f"node prints {prefix!r}", STEP * 2)
    text = raw.decode().rstrip()
    if not text.startswith(prefix):
        err = (await proc.stderr.read()).decode() if proc.stderr and proc.returncode is not None else ""
        raise AssertionError(f"node: expected {prefix!r}, got {text!r} {err[-400:]}")
    return text[len(prefix):].strip()


async def finish(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), STEP)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()


@scenario("mixed: a Python client and a Python agent ask a TypeScript SDK agent", timeout=40)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    ts = await node("echo", ctx.url, "ts-echo")
    ctx.defer(lambda: finish(ts))
    ts_id = await line(ts, "ready ")
    c = await client(ctx, "py-client")
    r = await c.request({"agent": ts_id}, {"from": "python"}, timeout=STEP)
    eq(r.get("payload"), {"ts": {"from": "python"}}, "the TS agent's reply to a Python client")
    eq(r["from"], ts_id, "from the TS agent")
    py = await agent(ctx, "py-agent")
    r = await py.request(ts_id, [1, "two"], timeout=STEP)
    eq(r.get("payload"), {"ts": [1, "two"]}, "the TS agent's reply to a Python agent")
    listed = {a["id"]: a for a in (await c.list_agents())["agents"]}
    eq(listed[ts_id].get("role"), "ts", "the Python client lists the TS agent")


@scenario("mixed: TypeScript SDK clients and agents ask a Python agent; a TS dashboard sees its events", timeout=40)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    py = await agent(ctx, "py-echo", role="py")

    @py.on_message
    async def answer(m: Message) -> None:
        if not m.get("meta", {}).get("isResult"):
            await py.reply(m, {"py": m.get("payload")})

    watcher = await node("watch", ctx.url, py.agent_id, "2")
    ctx.defer(lambda: finish(watcher))
    await line(watcher, "watching")
    asker = await node("ask", ctx.url, py.agent_id, json.dumps({"q": "from ts"}))
    got: dict[str, Any] = json.loads(await line(asker, "reply "))
    await finish(asker)
    eq(got["payload"], {"py": {"q": "from ts"}}, "TS ClientConnection.request() resolves with the Python reply")
    eq(got["from"], py.agent_id, "from the Python agent")
    check(got["meta"].get("isResult") is True, "isResult")
    sender = await node("send", ctx.url, py.agent_id, json.dumps({"n": 7}))
    got = json.loads(await line(sender, "reply "))
    await finish(sender)
    eq(got["delivered"], [py.agent_id], "the TS agent's send reached the Python agent")
    eq(got["payload"], {"py": {"n": 7}}, "the reply reaches the TS agent's onMessage")
    eq(got["meta"].get("correlationId"), "ts-corr-1", "with its correlationId")
    await py.busy()
    await py.idle()
    first = json.loads(await line(watcher, "event "))
    second = json.loads(await line(watcher, "event "))
    eq([first["data"]["newState"], second["data"]["newState"]], ["busy", "idle"], "the TS subscription sees the Python agent")
    eq(first["source"], py.agent_id, "source")

