#!/usr/bin/env python3
"""An echo agent: answers every message with `{"echo": <payload>, "by": <its name>}`.

    python echo_agent.py ws://127.0.0.1:4500/            # over WebSocket
    map-router spawn --name echo -- python echo_agent.py stdio:   # started by the router

It exits when the router sends it a stop control message (`map-router stop echo`), or when
its connection ends. Over stdio, `print()` goes to stderr (the router's log): stdout carries MAP.
"""

from __future__ import annotations

import asyncio
import os
import sys

from map_client import AgentConnection, control_of


async def main(url: str) -> None:
    async with AgentConnection.connect(url, name=os.environ.get("MAP_AGENT_NAME", "echo"), role="echo") as agent:
        print(f"echo agent {agent.agent_id} ready", flush=True)
        async for message in agent.messages():
            if control_of(message) == "stop":
                await agent.done(exit_reason="stopped by the router")
                return
            if message["from"] == "system" or message.get("meta", {}).get("isResult"):
                continue  # suspend/resume, steering, and answers to nothing we asked
            await agent.reply(message, {"echo": message.get("payload"), "by": agent.name})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MAP_ROUTER_URL", "ws://127.0.0.1:4500/")))
