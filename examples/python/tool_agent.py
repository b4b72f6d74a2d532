#!/usr/bin/env python3
"""A tool-using agent loop in the style of LangGraph or CrewAI, with a deterministic policy in
place of the model (no model calls), so it runs the same every time.

    python tool_agent.py [ws://127.0.0.1:4500/] [--ask "population of Paris plus population of Lyon"]

Three MAP participants:
- `tools`: an agent serving tools (`lookup`, `add`, `multiply`, `word_count`) by request/reply;
- `assistant`: the loop. For each task it keeps a state, asks its policy for the next step (a
  tool call or the final answer), calls the tool through MAP, records each step as a trajectory
  checkpoint, and keeps a task on the task board up to date; it answers with `reply()`;
- a client that asks the assistant one question (`--ask`) and prints the answer.

Without `--ask` the two agents serve until interrupted. Replace `policy()` with a model call and
the rest stays as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from dataclasses import dataclass, field
from typing import Any, Union

from map_client import AgentConnection, ClientConnection, Message

FACTS = {"paris": 2_102_650, "lyon": 522_250, "marseille": 873_076}


def run_tool(name: str, args: dict[str, Any]) -> Any:
    if name == "lookup":
        return FACTS[str(args["city"]).lower()]
    if name == "add":
        return args["a"] + args["b"]
    if name == "multiply":
        return args["a"] * args["b"]
    if name == "word_count":
        return len(str(args["text"]).split())
    raise KeyError(f"no tool {name}")


@dataclass
class ToolCall:
    tool: str
    args: dict[str, Any]


@dataclass
class Final:
    answer: str


@dataclass
class State:
    task: str
    observations: list[Any] = field(default_factory=list)


def policy(state: State) -> Union[ToolCall, Final]:
    """The stand-in for the model: the next step from the task and what the tools said so far."""
    m = re.fullmatch(r"population of (\w+) plus population of (\w+)", state.task.strip().lower())
    if m:
        a, b = m.groups()
        steps: list[ToolCall] = [ToolCall("lookup", {"city": a}), ToolCall("lookup", {"city": b})]
        if len(state.observations) < 2:
            return steps[len(state.observations)]
        if len(state.observations) == 2:
            return ToolCall("add", {"a": state.observations[0], "b": state.observations[1]})
        return Final(f"{state.observations[2]}")
    m = re.fullmatch(r"words in '(.*)' times (\d+)", state.task.strip())
    if m:
        if not state.observations:
            return ToolCall("word_count", {"text": m.group(1)})
        if len(state.observations) == 1:
            return ToolCall("multiply", {"a": state.observations[0], "b": int(m.group(2))})
        return Final(f"{state.observations[1]}")
    return Final("I cannot do that")


async def serve_tools(tools: AgentConnection) -> None:
    async for message in tools.messages():
        payload = message.get("payload") or {}
        try:
            result = {"result": run_tool(payload["tool"], payload.get("args", {}))}
        except (KeyError, TypeError) as e:
            result = {"error": str(e)}
        await tools.reply(message, result)


async def serve_assistant(assistant: AgentConnection, tools_id: str) -> None:
    async for message in assistant.messages():
        if message["from"] == "system":
            continue
        await handle(assistant, tools_id, message)


async def handle(assistant: AgentConnection, tools_id: str, message: Message) -> None:
    task_text = str((message.get("payload") or {}).get("task", ""))
    board = await assistant.create_task({"title": task_text, "assignee": assistant.agent_id})
    task_id = board["task"]["id"]
    await assistant.update_task(task_id, status="in_progress")
    await assistant.busy()
    state = State(task_text)
    step = 0
    while True:
        decision = policy(state)
        step += 1
        if isinstance(decision, Final):
            await assistant.report_checkpoint(f"{task_id}-{step}", label="final", metadata={"answer": decision.answer})
            break
        answer = await assistant.request(tools_id, {"tool": decision.tool, "args": decision.args}, timeout=10)
        observation = (answer.get("payload") or {}).get("result")
        state.observations.append(observation)
        await assistant.report_checkpoint(
            f"{task_id}-{step}", label=decision.tool, metadata={"args": decision.args, "result": observation}
        )
    await assistant.update_task(task_id, status="completed")
    await assistant.idle()
    await assistant.reply(message, {"answer": decision.answer, "steps": step, "taskId": task_id})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", nargs="?", default=os.environ.get("MAP_ROUTER_URL", "ws://127.0.0.1:4500/"))
    ap.add_argument("--ask")
    args = ap.parse_args()
    async with AgentConnection.connect(args.url, name="tools", role="tools") as tools, \
            AgentConnection.connect(args.url, name="assistant", role="assistant") as assistant:
        loop = asyncio.get_running_loop()
        workers = [loop.create_task(serve_tools(tools)), loop.create_task(serve_assistant(assistant, tools.agent_id))]
        try:
            if args.ask is None:
                await asyncio.gather(*workers)
                return
            async with ClientConnection.connect(args.url, name="user") as user:
                reply = await user.request(assistant.agent_id, {"task": args.ask}, timeout=30)
                payload = reply.get("payload") or {}
                print(f"answer: {payload.get('answer')} ({payload.get('steps')} steps, task {payload.get('taskId')})")
                checkpoints = await user.list_checkpoints({"agentId": assistant.agent_id})
                print("trajectory:", ", ".join(c.get("label", "?") for c in reversed(checkpoints["checkpoints"])))
        finally:
            for w in workers:
                w.cancel()


if __name__ == "__main__":
    asyncio.run(main())
