"""Issue 14's acceptance through the official Python A2A client (a2a-sdk==1.3.0, pinned in
requirements.txt), against the A2A gateway of the map-router binary: once in A2A v1.0 (the
SDK's default) and once in v0.3 mode (the card at /.well-known/agent.json, which the SDK reads
as a v0.3 interface and calls through its compat transport).

The MAP agent behind the gateway is written with the official MAP SDK (tests/interop/
echo_agent.mjs): it answers every message with reply(message, message.payload).

For each version: card discovery; send -> a completed task with the echo artifact; stream ->
task, working, artifact, completed (in that order); GetTask agrees with what the stream said;
CancelTask of the finished task is -32002; GetTask of an unknown task is -32001.

    python tests/a2a_py/acceptance.py --bin target/debug/map-router

Prints `ok - name` / `FAIL - name: reason` per scenario, then `N passed, M failed`; exits 0 only
when nothing failed. Every wait is bounded (asyncio.wait_for, process timeouts).
"""

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import uuid

from a2a.client import ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, TaskNotCancelableError, TaskNotFoundError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WAIT_S = 10.0


class Router:
    """The map-router binary on 127.0.0.1:0 with a throw-away data directory."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="map-router-a2a-py-")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None

    async def started(self):
        loop = asyncio.get_running_loop()

        def wait_for_port():
            for line in self.proc.stderr:
                m = re.search(r"map-router listening on (ws://127\.0\.0\.1:\d+/)", line)
                if m:
                    return m.group(1)
            return None

        self.url = await asyncio.wait_for(loop.run_in_executor(None, wait_for_port), WAIT_S)
        if not self.url:
            raise RuntimeError("the router exited before listening")
        # Keep draining stderr so the router never blocks on a full pipe.
        loop.run_in_executor(None, lambda: [None for _ in self.proc.stderr])
        return self

    @property
    def http(self):
        return self.url.replace("ws://", "http://").rstrip("/")

    def stop(self):
        self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class EchoAgent:
    """tests/interop/echo_agent.mjs: a MAP SDK agent that echoes."""

    def __init__(self, router_url, name):
        self.proc = subprocess.Popen(
            ["node", os.path.join(ROOT, "tests", "interop", "echo_agent.mjs"), router_url, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.id = None

    async def ready(self):
        loop = asyncio.get_running_loop()
        line = await asyncio.wait_for(loop.run_in_executor(None, self.proc.stdout.readline), WAIT_S)
        m = re.match(r"ready (\S+)", line or "")
        if not m:
            raise RuntimeError(f"the echo agent did not start: {line!r}")
        self.id = m.group(1)
        return self

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=5)


def text_message(text):
    return Message(message_id=f"m-{uuid.uuid4().hex}", role=Role.ROLE_USER, parts=[Part(text=text)])


async def bounded(awaitable, what):
    try:
        return await asyncio.wait_for(awaitable, WAIT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} timed out after {WAIT_S} s") from None


async def collect(aiter, what):
    async def run():
        return [x async for x in aiter]

    return await bounded(run(), what)


async def expect_error(awaitable, error_type, code, what):
    try:
        result = await bounded(awaitable, what)
    except error_type as e:
        # The SDK raises the type its JSON_RPC_ERROR_CODE_MAP gives the answer's code.
        assert JSON_RPC_ERROR_CODE_MAP[error_type] == code, (error_type, code)
        return e
    raise AssertionError(f"{what}: expected {error_type.__name__} ({code}), got {result!r}")


async def acceptance(router, agent, legacy):
    """The flow, in v1.0 or (legacy) v0.3 mode."""
    base = f"{router.http}/a2a/agents/{agent.id}"
    card_path = "/.well-known/agent.json" if legacy else None
    # Card discovery.
    blocking = ClientFactory(ClientConfig(streaming=False))
    client = await bounded(blocking.create_from_url(base, relative_card_path=card_path), "card discovery")
    card = client._card  # the card the SDK resolved (no public getter without a network call)
    assert card.name == "echo", card.name
    versions = [i.protocol_version for i in card.supported_interfaces]
    if legacy:
        assert any(v.startswith("0.3") for v in versions), versions
    else:
        assert "1.0" in versions, versions
    assert card.capabilities.streaming
    # The SDK picked its v0.3 compat transport for the v0.3 card, its v1.0 one otherwise.
    transport = type(client._transport).__name__
    assert transport == ("CompatJsonRpcTransport" if legacy else "JsonRpcTransport"), transport

    # Send: a completed task whose artifact is the echo.
    events = await collect(client.send_message(SendMessageRequest(message=text_message("hello"))), "send")
    assert len(events) == 1 and events[0].HasField("task"), events
    task = events[0].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
    assert task.artifacts[0].parts[0].text == "hello", task.artifacts

    # GetTask agrees.
    got = await bounded(client.get_task(GetTaskRequest(id=task.id)), "get_task")
    assert got.id == task.id and got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for a in got.artifacts for p in a.parts] == ["hello"]

    # Cancel of a finished task: -32002. GetTask of an unknown task: -32001.
    await expect_error(client.cancel_task(CancelTaskRequest(id=task.id)), TaskNotCancelableError, -32002, "cancel")
    await expect_error(client.get_task(GetTaskRequest(id="no-such-task")), TaskNotFoundError, -32001, "get unknown")
    await client.close()

    # Stream: task, working, artifact, completed.
    streaming = ClientFactory(ClientConfig(streaming=True))
    sclient = await bounded(streaming.create_from_url(base, relative_card_path=card_path), "card discovery (stream)")
    events = await collect(sclient.send_message(SendMessageRequest(message=text_message("streamed"))), "stream")
    kinds = []
    for e in events:
        if e.HasField("task"):
            kinds.append(("task", e.task.status.state))
        elif e.HasField("status_update"):
            kinds.append(("status", e.status_update.status.state))
        elif e.HasField("artifact_update"):
            kinds.append(("artifact", e.artifact_update.artifact.parts[0].text))
        else:
            kinds.append(("message", None))
    assert kinds[0][0] == "task", kinds
    working = kinds.index(("status", TaskState.TASK_STATE_WORKING))
    artifact = kinds.index(("artifact", "streamed"))
    assert working < artifact, kinds
    assert kinds[-1] == ("status", TaskState.TASK_STATE_COMPLETED), kinds
    stream_task_id = events[0].task.id
    got = await bounded(sclient.get_task(GetTaskRequest(id=stream_task_id)), "get_task after stream")
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for a in got.artifacts for p in a.parts] == ["streamed"]
    await sclient.close()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "map-router"))
    args = parser.parse_args()
    if not os.path.exists(args.bin):
        print(f"FAIL - setup: router binary not found at {args.bin}")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    for name, legacy in (("a2a-sdk 1.3.0 client, A2A v1.0", False), ("a2a-sdk 1.3.0 client, A2A v0.3 mode", True)):
        router = agent = None
        try:
            router = await Router(args.bin).started()
            agent = await EchoAgent(router.url, "echo").ready()
            await asyncio.wait_for(acceptance(router, agent, legacy), 60)
            passed += 1
            print(f"ok - {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure the same way
            failed += 1
            print(f"FAIL - {name}: {type(e).__name__}: {e}", flush=True)
            if os.environ.get("A2A_PY_VERBOSE"):
                traceback.print_exc()
        finally:
            if agent:
                agent.stop()
            if router:
                router.stop()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
