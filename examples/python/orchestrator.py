#!/usr/bin/env python3
"""An orchestrator: spawns workers as supervised processes, gives them work, steers them,
suspends and resumes one, and stops them all.

    python orchestrator.py [ws://127.0.0.1:4500/] [--workers 2]

The workers are `echo_agent.py` beside this file, started by the router over stdio (they
inherit this Python, so `map_client` must be importable there: installed, or on PYTHONPATH).
It prints what happens and exits 0 once every worker has stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from map_client import AgentConnection, ClientConnection

HERE = Path(__file__).resolve().parent


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", nargs="?", default=os.environ.get("MAP_ROUTER_URL", "ws://127.0.0.1:4500/"))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    async with AgentConnection.connect(args.url, name="orchestrator", role="lead") as boss:
        # Everything about our workers, from the start (ours: we spawn them).
        events = await boss.subscribe({"eventTypes": ["agent_state_changed"]})
        team = await boss.create_scope("team")
        await boss.join_scope(team["id"])
        workers = []
        for i in range(args.workers):
            spawned = await boss.spawn(
                name=f"worker-{i}",
                role="worker",
                scopes=[team["id"]],
                command={
                    "program": sys.executable,
                    "args": [str(HERE / "echo_agent.py"), "stdio:"],
                    "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                },
            )
            workers.append(spawned["agent"]["id"])
            print(f"spawned {spawned['agent']['name']} ({spawned['agent']['id']}), pid {spawned.get('process', {}).get('pid')}")

        sent = await boss.send_to_scope(team["id"], {"task": "summarize the logs"})
        print(f"task to the team: delivered to {len(sent['delivered'])} workers")
        for worker in workers:
            answer = await boss.request(worker, {"question": "status?"}, timeout=10)
            print(f"{worker} answered {answer.get('payload')}")

        async with ClientConnection.connect(args.url, name="orchestrator-ops") as ops:
            steered = await ops.inject(workers[0], "focus on the failing test", "queue")
            print(f"steered {workers[0]}: {steered}")
            suspended = await ops.suspend_agent(workers[0], "pause")
            print(f"suspended: {suspended['agent']['state']}")
            resumed = await ops.resume_agent(workers[0])
            print(f"resumed: {resumed['agent']['state']}")
            for worker in workers:
                await ops.stop_agent(worker, reason="done")

        stopped: set[str] = set()
        async for event in events:
            data = event["data"]
            if data["agentId"] in workers and data["newState"] == "stopped":
                stopped.add(data["agentId"])
                print(f"{data['agentId']} stopped")
                if stopped == set(workers):
                    break
        print("all workers stopped")


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(), 120))
