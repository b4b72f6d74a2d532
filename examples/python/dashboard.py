#!/usr/bin/env python3
"""A dashboard: the agents there are now, then every event as it happens, one line each.

    python dashboard.py [ws://127.0.0.1:4500/] [--types 'agent.*'] [--max-events N]

It draws the snapshot and continues the stream from exactly where the snapshot was taken
(`asOf`), so nothing happens between the two unseen or twice. When the router goes away it
reconnects and continues from the last event it printed. With authentication on, set
MAP_ROUTER_API_KEY (or MAP_ROUTER_TOKEN for a JWT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from map_client import Auth, ClientConnection


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", nargs="?", default=os.environ.get("MAP_ROUTER_URL", "ws://127.0.0.1:4500/"))
    ap.add_argument("--types", action="append", help="event types, e.g. 'agent.*' (repeatable)")
    ap.add_argument("--max-events", type=int, default=0, help="exit after this many events (0: never)")
    args = ap.parse_args()
    auth = None
    if os.environ.get("MAP_ROUTER_API_KEY"):
        auth = Auth.api_key(os.environ["MAP_ROUTER_API_KEY"])
    elif os.environ.get("MAP_ROUTER_TOKEN"):
        auth = Auth.bearer(os.environ["MAP_ROUTER_TOKEN"])

    async with ClientConnection.connect(args.url, name="py-dashboard", auth=auth) as client:
        snapshot = await client.list_agents()
        print(f"{len(snapshot['agents'])} agents")
        for agent in snapshot["agents"]:
            print(f"  {agent['id']}  {agent.get('name', '-'):<16} {agent.get('role', '-'):<10} {agent['state']}")
        events = await client.subscribe(
            {"eventTypes": args.types} if args.types else None,
            replay_from=snapshot.get("asOf"),
        )
        print("watching", flush=True)
        seen = 0
        async for event in events:
            stamp = time.strftime("%H:%M:%S", time.gmtime(event["timestamp"] / 1000))
            print(f"{stamp} {event['type']:<24} {event.get('source', '-')} {json.dumps(event.get('data'))[:160]}", flush=True)
            seen += 1
            if args.max_events and seen >= args.max_events:
                return


if __name__ == "__main__":
    asyncio.run(main())
