#!/usr/bin/env python3
"""Benchmark (not a test): how fast the Python client takes messages and events.

    tests/python/.venv/bin/python tests/python/bench.py --bin target/release/map-router \\
        --load target/release/deps/load-<hash> [--messages 100000] [--rate 5000]

Three measurements, each printed as one JSON line:

1. `decode`: the client alone. Pre-encoded `map/message` frames are fed through an
   `AgentConnection` (a transport in memory) to an `async for ... in agent.messages()` loop:
   the client's ceiling, with no router and no socket.
2. `agent`: a Python agent (its own process) joins the scope the router's own load generator
   (`benches/load.rs`, fan-out, unpaced) sends to, and counts what it receives per second.
3. `dashboard`: a Python dashboard (its own process) subscribed to every event while the load
   generator sends at `--rate` messages/s (two events each: `message_sent`, `message_delivered`),
   i.e. 2 x rate events/s. It reports the rate it took events at, and how far behind the last
   event was when the generator stopped (its lag).

Everything is on loopback; every wait is bounded; the router runs with --ephemeral and no rate
limits. On 2 cores the router, the generator and the Python process share the CPU, so (2) and
(3) are lower bounds of what the client can do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "src"))

from map_client import AgentConnection, ClientConnection  # noqa: E402

BOUND = 120.0


# ------------------------------------------------------------------------------------------
# 1. the client alone


class MemoryTransport:
    def __init__(self, frames: list[str]) -> None:
        self.frames = frames
        self.i = 0
        self.handshake: list[str] = []

    async def send(self, text: str) -> None:
        req = json.loads(text)
        if req.get("method") == "map/connect":
            result: Any = {"sessionId": "s", "participantId": "a", "resumeToken": "r"}
        elif req.get("method") == "map/agents/register":
            result = {"agent": {"id": "a", "state": "registered"}}
        else:
            result = {}
        self.handshake.append(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}))

    async def recv(self) -> str | None:
        if self.handshake:
            return self.handshake.pop(0)
        if self.i < len(self.frames):
            self.i += 1
            if self.i % 256 == 0:
                await asyncio.sleep(0)  # a socket yields now and then too
            return self.frames[self.i - 1]
        await asyncio.sleep(3600)
        return None

    async def close(self) -> None:
        pass


async def bench_decode(n: int) -> dict[str, Any]:
    frames = [
        json.dumps({"jsonrpc": "2.0", "method": "map/message", "params": {"message": {
            "id": f"01M8MV{i:020d}", "from": "sender", "to": {"scope": "s"}, "timestamp": 1795996077032,
            "payload": {"seq": i, "sentAt": 1795996077032, "pad": "x" * 64}, "meta": {"priority": "normal"}}}})
        for i in range(n)
    ]
    transport = MemoryTransport(frames)

    async def opener() -> Any:
        return transport

    agent = AgentConnection(opener, name="bench", auth=None, timeout=10, reconnect=None,
                            max_queued_messages=4096, register={"name": "bench"})
    await agent._start()
    t0 = time.perf_counter()
    count = 0
    async for _ in agent.messages():
        count += 1
        if count == n:
            break
    took = time.perf_counter() - t0
    await agent.abort()
    return {"bench": "decode", "messages": n, "seconds": round(took, 3), "msgs_per_s": round(n / took)}


# ------------------------------------------------------------------------------------------
# 2 and 3: processes of their own against the router


async def run_agent(url: str, seconds: float) -> None:
    """Joins the first scope created, counts messages until `seconds` pass with none."""
    async with AgentConnection.connect(url, name="py-bench-agent", role="bench") as agent:
        scopes = await agent.subscribe({"eventTypes": ["scope_created"]})
        print("ready", flush=True)
        created = await scopes.next(BOUND)
        await agent.join_scope(created["data"]["scopeId"])
        count, first, last = 0, 0.0, 0.0
        it = agent.messages().__aiter__()
        while True:
            try:
                await asyncio.wait_for(it.__anext__(), seconds if count else BOUND)
            except asyncio.TimeoutError:
                break
            last = time.perf_counter()
            if count == 0:
                first = last
            count += 1
        rate = (count - 1) / (last - first) if count > 1 and last > first else 0
        print(json.dumps({"bench": "agent", "messages": count, "seconds": round(last - first, 3),
                          "msgs_per_s": round(rate)}), flush=True)


async def run_dashboard(url: str, seconds: float) -> None:
    """Every event; reports the rate taken and the lag behind each event's router timestamp."""
    async with ClientConnection.connect(url, name="py-bench-dashboard") as client:
        sub = await client.subscribe()
        print("ready", flush=True)
        count, first, last, lag_max, lag_last = 0, 0.0, 0.0, 0.0, 0.0
        while True:
            try:
                event = await sub.next(seconds if count else BOUND)
            except asyncio.TimeoutError:
                break
            last = time.perf_counter()
            if count == 0:
                first = last
            count += 1
            lag_last = time.time() - event["timestamp"] / 1000
            lag_max = max(lag_max, lag_last)
        rate = (count - 1) / (last - first) if count > 1 and last > first else 0
        print(json.dumps({"bench": "dashboard", "events": count, "seconds": round(last - first, 3),
                          "events_per_s": round(rate), "lag_last_ms": round(lag_last * 1000, 1),
                          "lag_max_ms": round(lag_max * 1000, 1)}), flush=True)


def start_router(binary: str, work: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--ephemeral", "--rate-per-connection", "0",
         "--rate-per-principal", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=work)
    assert proc.stderr is not None
    deadline = time.time() + 10
    while time.time() < deadline:
        line = proc.stderr.readline().decode()
        m = re.search(r"map-router listening on (ws://127\.0\.0\.1:\d+/)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("the router did not listen")


def side(mode: str, url: str, quiet_s: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, __file__, "--side", mode, "--url", url, "--quiet-s", str(quiet_s)],
                            stdout=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None
    ready = proc.stdout.readline().decode().strip()
    if ready != "ready":
        proc.kill()
        raise SystemExit(f"{mode}: {ready}")
    return proc


def load(args: argparse.Namespace, url: str, rate: float, messages: int) -> dict[str, Any]:
    out = subprocess.run(
        [args.load, "--bench", "--url", url, "--test", "fanout", "--publishers", "2", "--agents", "1",
         "--subscribers", "0", "--messages", str(messages), "--rate", str(rate), "--window", "64",
         "--payload-bytes", "64"],
        capture_output=True, timeout=BOUND, cwd=ROOT)
    lines = [line for line in out.stdout.decode().splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"load generator failed: {out.stderr.decode()[-800:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/map-router"))
    ap.add_argument("--load", help="the load generator binary (target/release/deps/load-<hash>)")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=5000, help="dashboard run: messages/s (2 events each)")
    ap.add_argument("--agent-rate", type=float, default=0, help="agent run: messages/s (0: unpaced)")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--quiet-s", type=float, default=2.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.bin = str(Path(args.bin).resolve())
    if args.load:
        args.load = str(Path(args.load).resolve())
    if args.side == "agent":
        asyncio.run(run_agent(args.url, args.quiet_s))
        return
    if args.side == "dashboard":
        asyncio.run(run_dashboard(args.url, args.quiet_s))
        return

    print(json.dumps(asyncio.run(bench_decode(args.messages))), flush=True)
    if not args.load:
        print("(no --load: the router runs skipped)", file=sys.stderr)
        return
    for mode, rate in (("agent", args.agent_rate), ("dashboard", args.rate)):
        with tempfile.TemporaryDirectory() as work:
            router, url = start_router(args.bin, work)
            try:
                proc = side(mode, url, 2.0)
                messages = args.messages if mode == "agent" else int(args.rate * 10)
                generated = load(args, url, rate, messages)
                out, _ = proc.communicate(timeout=BOUND)
                result = json.loads(out.decode().strip().splitlines()[-1])
                result["generator"] = {k: generated.get(k) for k in ("msgs_per_s", "deliveries_per_s", "rate", "messages")}
                print(json.dumps(result), flush=True)
            finally:
                router.kill()
                router.wait(10)


if __name__ == "__main__":
    main()
