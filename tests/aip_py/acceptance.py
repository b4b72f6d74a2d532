"""Issue 25's acceptance: Python gRPC (grpcio 1.73.1, the version upstream's atlink-aip pins)
drives the AIP gateway of the map-router binary with stubs generated from
src/gateway/aip/proto/schema.proto by grpcio-tools (scripts/aip_py.sh makes them).

The AIP nodes here are real gRPC servers on loopback that behave as upstream's Agent and Tool
classes do (CLIENT_NOTES.md): an agent answers START_QUEST/HOLD_QUEST with HOLD_RESPONSE and
STOP_QUEST with STOP_RESPONSE, then ends its stream; a function tool answers one text item, or
is_error with "Error executing tool: ..." when the function raises. The MAP agent on the other
side is written with the official TypeScript SDK (tests/interop/aip_map_agent.mjs).

    python tests/aip_py/acceptance.py --bin target/debug/map-router --stubs DIR [--spread]

With --spread every router is a cluster on one nats-server (started here): a live node and a
standby; the AIP nodes call the standby's gateway and MAP calls over HTTP go to the standby
(both relayed to the live node), the MAP SDK agent connects to the live node, so every
exchange crosses nodes; the restart scenario kills the live node instead, and the standby
that takes over serves the same AIP port (docs/cluster.md, "Gateways on every node").

Prints `ok - name` / `FAIL - name: reason` per scenario, then `N passed, M failed`; exits 0 only
when nothing failed. Every wait is bounded (asyncio.wait_for, process timeouts, gRPC deadlines).
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WAIT_S = 10.0

parser = argparse.ArgumentParser()
parser.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "map-router"))
parser.add_argument("--stubs", required=True)
parser.add_argument("--spread", action="store_true",
                    help="a live node and a standby on one nats-server: the AIP nodes call the standby's gateway")
ARGS = parser.parse_args()
sys.path.insert(0, ARGS.stubs)

import grpc  # noqa: E402
import schema_pb2 as pb  # noqa: E402
import schema_pb2_grpc as pbg  # noqa: E402

AM = pb.AgentMessage
KEYS = {"ops": "key-ops-0123456789", "alice": "key-alice-0123456789",
        "bob": "key-bob-0123456789", "viewer": "key-viewer-0123456789"}


# --------------------------------------------------------------------------------------------
# The router
# --------------------------------------------------------------------------------------------

def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nats:
    """`nats-server -js` on a free loopback port with a temporary store (--spread)."""

    def __init__(self):
        import socket
        import time
        self.dir = tempfile.mkdtemp(prefix="map-router-aip-nats-")
        port = free_port()
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", self.dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("nats-server did not listen")
                time.sleep(0.05)
        self.url = f"nats://127.0.0.1:{port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait(WAIT_S)
        shutil.rmtree(self.dir, ignore_errors=True)


NATS = None  # with --spread, the nats-server every Router's nodes share


class Router:
    """The map-router binary with --aip-listen and a config file: one node, or with --spread a
    live node and a standby on NATS (docs/cluster.md, "Gateways on every node"). `aip` is
    where the AIP nodes go and `http()` where MAP calls over HTTP go (the standby with
    --spread: they are relayed to the live node); `url` is where the MAP SDK agent connects
    (the live node), so that every exchange crosses nodes."""

    def __init__(self, config="", data_dir=None, extra=()):
        self.dir = tempfile.mkdtemp(prefix="map-router-aip-py-")
        self.data = data_dir or os.path.join(self.dir, "data")
        self.extra = extra
        self.cfg = os.path.join(self.dir, "router.toml")
        with open(os.path.join(self.dir, "api-keys"), "w") as f:
            f.write("".join(f"{key} {who}\n" for who, key in KEYS.items()))
        if NATS is not None:
            stream = "aip_" + uuid.uuid4().hex[:12]
            config += (f'\n[cluster]\nurl = "{NATS.url}"\nstream = "{stream}"\nsubject_prefix = "{stream}"\n'
                       'takeover_poll_ms = 100\nstandby = true\n')
        with open(self.cfg, "w") as f:
            f.write(config.replace("{dir}", self.dir))
        self.proc = subprocess.Popen(
            [ARGS.bin, "--listen", "127.0.0.1:0", "--aip-listen", "127.0.0.1:0",
             "--data-dir", self.data, "--config", self.cfg, *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.standby = None
        self.url = None
        self.aip = None
        self.base = None

    async def started(self):
        loop = asyncio.get_running_loop()

        def wait():
            while self.url is None or self.aip is None:
                line = self.proc.stderr.readline()
                if not line:
                    raise RuntimeError("the router exited before listening")
                m = re.match(r"map-router listening on (wss?://\S+)/", line)
                if m:
                    self.url = m.group(1)
                m = re.match(r"map-router AIP gateway listening on (\S+)", line)
                if m:
                    self.aip = m.group(1)
        await asyncio.wait_for(loop.run_in_executor(None, wait), WAIT_S)
        # Keep draining stderr so the router never blocks on a full pipe.
        loop.run_in_executor(None, lambda: [None for _ in self.proc.stderr])
        self.base = self.url.replace("ws", "http", 1)
        if NATS is not None:
            await self._start_standby()
        return self

    async def _start_standby(self):
        """The standby (node `n1`): it prints no "listening" line until it takes over, so it
        gets fixed ports and is ready once its /health says it serves."""
        import ssl
        import time
        listen, aip = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        cfg = self.cfg + ".standby.toml"
        with open(self.cfg) as f, open(cfg, "w") as out:
            out.write(f.read() + 'node = "n1"\n')
        self.standby = subprocess.Popen(
            [ARGS.bin, "--listen", listen, "--aip-listen", aip, "--data-dir", self.data + "-standby",
             "--config", cfg, *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        scheme = "https" if self.url.startswith("wss") else "http"
        unverified = ssl._create_unverified_context()  # the test CA is checked by the gRPC calls

        def wait():
            deadline = time.time() + 2 * WAIT_S
            while True:
                try:
                    with urllib.request.urlopen(f"{scheme}://{listen}/health", timeout=1, context=unverified) as r:
                        body = r.read().decode()
                except urllib.error.HTTPError as e:
                    body = e.read().decode()
                except OSError:
                    body = ""
                if "\nserving:" in body:
                    return
                if self.standby.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the standby never served: " + body)
                time.sleep(0.1)
        await asyncio.wait_for(loop_run(wait), 3 * WAIT_S)
        self.aip, self.base = aip, f"{scheme}://{listen}"

    async def take_over(self):
        """Kills the live node (SIGKILL): the standby takes over, its AIP port now the live
        node's gateway (--spread only)."""
        self.proc.kill()
        self.proc.wait(WAIT_S)

        def wait():
            import time
            deadline = time.time() + 2 * WAIT_S
            while True:
                try:
                    with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError("the standby did not take over")
                time.sleep(0.05)
        await asyncio.wait_for(loop_run(wait), 3 * WAIT_S)

    def http(self):
        return self.base

    def rpc(self, method, params, session=None, key=None, participant="system"):
        """One MAP call over POST /map/rpc (a fresh session unless given): (result, session)."""
        def post(body, session):
            headers = {"Content-Type": "application/json"}
            if session:
                headers["MAP-Session"] = session
            if key:
                headers["Authorization"] = f"Bearer {key}"
            req = urllib.request.Request(self.http() + "/map/rpc", json.dumps(body).encode(), headers)
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return json.loads(r.read()), r.headers.get("map-session")
        if session is None:
            hello = {"participantType": participant, "name": "aip-py"}
            if key:
                hello["auth"] = {"method": "api-key", "credential": key}
            _, session = post({"jsonrpc": "2.0", "id": 1, "method": "map/connect", "params": hello}, None)
        answer, _ = post({"jsonrpc": "2.0", "id": 2, "method": method, "params": params}, session)
        return answer, session

    def stop(self):
        for proc in (self.standby, self.proc):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


def loop_run(fn):
    return asyncio.get_running_loop().run_in_executor(None, fn)


class MapAgent:
    """tests/interop/aip_map_agent.mjs: a MAP SDK agent shown to AIP in domain `domain`."""

    def __init__(self, router_url, name, domain):
        self.proc = subprocess.Popen(
            ["node", os.path.join(ROOT, "tests", "interop", "aip_map_agent.mjs"), router_url, name, domain],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.id = None

    async def line(self, prefix):
        loop = asyncio.get_running_loop()
        while True:
            line = await asyncio.wait_for(loop.run_in_executor(None, self.proc.stdout.readline), WAIT_S)
            if not line:
                raise RuntimeError("the MAP agent exited")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    async def ready(self):
        self.id = await self.line("ready ")
        return self

    def post(self, to, payload, kept=False):
        self.proc.stdin.write(f"{'send-kept' if kept else 'send'} {to} {json.dumps(payload)}\n")
        self.proc.stdin.flush()

    async def answer(self):
        return json.loads(await self.line("answer "))

    async def send(self, to, payload):
        self.post(to, payload)
        return await self.answer()

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=5)


# --------------------------------------------------------------------------------------------
# AIP nodes as upstream's classes behave (CLIENT_NOTES.md)
# --------------------------------------------------------------------------------------------

def texts(content):
    return " ".join(c.text for c in content if c.WhichOneof("data") == "text")


class AgentServicer(pbg.AgentServiceServicer):
    """upstream's AgentServer.CallAgent with an echoing handler."""

    def __init__(self, agent_id):
        self.id = agent_id
        self.seen = []

    async def CallAgent(self, request_iterator, context):
        self.metadata = dict(context.invocation_metadata())
        first = True
        async for req in request_iterator:
            self.seen.append(req)
            if first and (req.session_status != AM.START_QUEST or not req.session_id):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "First message must be START_QUEST")
            first = False
            if req.session_status in (AM.START_QUEST, AM.HOLD_QUEST):
                status = AM.HOLD_RESPONSE
            else:
                status = AM.STOP_RESPONSE
            content = [pb.ContentItem(text=f"{self.id} heard: {texts(req.content)}")]
            content += [c for c in req.content if c.WhichOneof("data") != "text"]
            yield AM(sender_id=self.id, receiver_id=req.sender_id, session_id=req.session_id,
                     session_status=status, message_id=f"msg_{uuid.uuid4().hex[:8]}", content=content)
            if status == AM.STOP_RESPONSE:
                return


class ToolServicer(pbg.ToolServiceServicer):
    """upstream's ToolServer with a function tool: add, fail, sleep."""

    def __init__(self, tool_id):
        self.id = tool_id
        self.seen = []

    async def CallTool(self, request, context):
        self.seen.append(request)
        args = dict(request.arguments)
        try:
            if request.tool_name == "add":
                result = int(args["a"]) + int(args["b"])
            elif request.tool_name == "sleep":
                await asyncio.sleep(float(args.get("seconds", "5")))
                result = "slept"
            else:
                raise ValueError(f"boom {request.tool_name}")
        except Exception as e:  # noqa: BLE001 - upstream's rule
            return pb.ToolResponse(sender_id=self.id, receiver_id=request.sender_id,
                                   session_id=request.session_id, is_error=True,
                                   error_message=f"Error executing tool: {e}")
        return pb.ToolResponse(sender_id=self.id, receiver_id=request.sender_id,
                               session_id=request.session_id, is_error=False,
                               error_message="No Error", content=[pb.ContentItem(text=str(result))])


class Node:
    """An AIP node: its own gRPC server on loopback, and a channel to the gateway."""

    def __init__(self, gateway, kind, node_id=None, domain="lab", key=None):
        self.kind = kind
        self.id = node_id or f"{kind}_{uuid.uuid4().hex[:12]}"
        self.domain = domain
        self.gateway = gateway
        self.metadata = (("authorization", f"Bearer {key}"),) if key else None
        self.servicer = AgentServicer(self.id) if kind == "agent" else ToolServicer(self.id)

    async def start(self):
        self.server = grpc.aio.server()
        if self.kind == "agent":
            pbg.add_AgentServiceServicer_to_server(self.servicer, self.server)
        else:
            pbg.add_ToolServiceServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.gateway)
        self.stub = pbg.GatewayServiceStub(self.channel)
        return self

    def info(self, address=None):
        if self.kind == "agent":
            return pb.AgentInfo(agent_id=self.id, address=address or self.address, name=self.id,
                                domain=self.domain, input_mode=[pb.TEXT, pb.IMAGE], output_mode=[pb.TEXT],
                                description="an echo", version="1.0.0",
                                skills=[pb.AgentInfo.AgentSkill(skill_id="echo", capability="echoes")])
        return pb.ToolInfo(tool_id=self.id, address=address or self.address, name=self.id, domain=self.domain,
                           input_mode=[pb.TEXT], output_mode=[pb.TEXT], description="adds",
                           arguments={"a": "int", "b": "int"}, version="1.0.0")

    async def register(self, address=None):
        if self.kind == "agent":
            return await self.stub.RegisterAgent(self.info(address), timeout=WAIT_S, metadata=self.metadata)
        return await self.stub.RegisterTool(self.info(address), timeout=WAIT_S, metadata=self.metadata)

    def keep_alive(self, interval):
        """upstream's heartbeat task (every 10 s there; `interval` here, for a short timeout)."""
        async def beat():
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.heartbeat()
                except grpc.aio.AioRpcError:
                    pass  # logged and ignored upstream
        self.beats = asyncio.create_task(beat())

    async def heartbeat(self):
        return await self.stub.Heartbeat(pb.HeartbeatRequest(sender_id=self.id), timeout=WAIT_S,
                                         metadata=self.metadata)

    async def call_tool(self, tool_id, name, arguments, timeout=WAIT_S):
        return await self.stub.RouteToolCalling(
            pb.ToolRequest(sender_id=self.id, receiver_id=tool_id, session_id=f"tool_session_{uuid.uuid4()}",
                           tool_name=name, arguments=arguments), timeout=timeout, metadata=self.metadata)

    async def session(self, receiver, items_list, timeout=WAIT_S, metadata=None):
        """upstream's README flow: every quest (START, HOLD..., STOP) written before any answer
        is read; the answers until STOP_RESPONSE and the end of the stream."""
        sid = f"agent_session_{uuid.uuid4()}"
        msgs = []
        for i, items in enumerate(items_list):
            status = AM.START_QUEST if i == 0 else (AM.STOP_QUEST if i == len(items_list) - 1 else AM.HOLD_QUEST)
            msgs.append(AM(sender_id=self.id, receiver_id=receiver, session_id=sid, session_status=status,
                           task_info=pb.TaskInfo(task_id=f"task_{self.id}_{i}",
                                                 parent_task_ids=[f"task_{self.id}_{i - 1}"] if i else []),
                           message_id=f"msg_{uuid.uuid4().hex[:8]}", content=items))

        async def requests():
            for m in msgs:
                yield m
        call = self.stub.RouteAgentCalling(requests(), timeout=timeout, metadata=metadata or self.metadata)
        answers = [a async for a in call]
        return sid, answers

    async def stop(self):
        if getattr(self, "beats", None):
            self.beats.cancel()
        await self.channel.close()
        await self.server.stop(0)


async def expect_code(awaitable, code, what):
    try:
        await awaitable
    except grpc.aio.AioRpcError as e:
        if e.code() != code:
            raise AssertionError(f"{what}: {e.code()} {e.details()!r}, wanted {code}")
        return e
    raise AssertionError(f"{what}: succeeded, wanted {code}")


def peer_ids(peers):
    return sorted(p.agent_info.agent_id or p.tool_info.tool_id for p in peers)


def raw_call(addr, method, body, timeout=WAIT_S, metadata=None):
    """A unary call with a hand-made body (bytes as they are)."""
    channel = grpc.aio.insecure_channel(addr)
    fn = channel.unary_unary(f"/grpc_service.GatewayService/{method}",
                             request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return channel, fn(body, timeout=timeout, metadata=metadata)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------

CONFIG = """
[aip]
heartbeat_timeout_ms = 1500
on_silence = "offline"
tool_timeout_ms = 3000
max_message_bytes = 65536
first_message_timeout_ms = 1000
max_streams_per_connection = 8
max_sessions = 24
"""


async def scenarios(results):
    router = await Router(CONFIG).started()
    nodes = []
    mapagent = None
    try:
        gw = router.aip
        agent = await Node(gw, "agent").start()
        other = await Node(gw, "agent").start()
        tool = await Node(gw, "tool").start()
        nodes += [agent, other, tool]

        async def register_and_discover():
            r = await agent.register()
            assert r.success and agent.id in peer_ids(r.peers), peer_ids(r.peers)
            assert (await tool.register()).success
            assert (await other.register()).success
            for n in (agent, tool, other):
                n.keep_alive(0.3)
            got = await agent.stub.GetNodes(pb.GetNodesRequest(agent_id=agent.id, domain="lab"), timeout=WAIT_S)
            assert peer_ids(got.peers) == sorted([agent.id, other.id, tool.id]), peer_ids(got.peers)
            mine = [p.agent_info for p in got.peers if p.agent_info.agent_id == agent.id][0]
            assert mine == agent.info(), mine  # exactly as registered
            t = [p.tool_info for p in got.peers if p.tool_info.tool_id == tool.id][0]
            assert dict(t.arguments) == {"a": "int", "b": "int"}
            none = await agent.stub.GetNodes(pb.GetNodesRequest(agent_id=agent.id, domain="elsewhere"), timeout=WAIT_S)
            assert list(none.peers) == []
            await expect_code(agent.register(), grpc.StatusCode.ALREADY_EXISTS, "a second registration")
            # Each node is a MAP agent: role, scope aip:lab, metadata.aip.
            ans, _ = router.rpc("map/agents/get", {"agentId": tool.id})
            a = ans["result"]["agent"]
            assert a["role"] == "tool" and "aip:lab" in a["scopes"], a
            assert a["metadata"]["aip"]["arguments"] == {"a": "int", "b": "int"}, a
        await run(results, "register an agent and a tool (own gRPC servers), discover them by domain", register_and_discover)

        async def tool_calls():
            r = await agent.call_tool(tool.id, "add", {"a": "1", "b": "2"})
            assert not r.is_error and [c.text for c in r.content] == ["3"], r
            assert r.sender_id == tool.id and r.receiver_id == agent.id, r
            assert tool.servicer.seen[-1].sender_id == agent.id
            r = await agent.call_tool(tool.id, "explode", {})
            assert r.is_error and r.error_message.startswith("Error executing tool: boom"), r
            await expect_code(agent.call_tool(tool.id, "sleep", {"seconds": "10"}, timeout=1.0),
                              grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline")
            await expect_code(agent.call_tool(tool.id, "sleep", {"seconds": "10"}, timeout=20),
                              grpc.StatusCode.DEADLINE_EXCEEDED, "the gateway's tool_timeout_ms")
            # The next version's arguments: one JSON string in field 5.
            head = pb.ToolRequest(sender_id=agent.id, receiver_id=tool.id, session_id="s", tool_name="add").SerializeToString()
            js = json.dumps({"a": 20, "b": "22"}).encode()
            ch, call = raw_call(gw, "RouteToolCalling", head + b"\x2a" + bytes([len(js)]) + js)
            r = pb.ToolResponse.FromString(await call)
            await ch.close()
            assert [c.text for c in r.content] == ["42"], r
        await run(results, "tool calls: a round trip, a tool error, two timeouts, JSON-string arguments", tool_calls)

        mapagent = await MapAgent(router.url, "map-side", "lab").ready()

        async def session_with_map_agent():
            got = await agent.stub.GetNodes(pb.GetNodesRequest(agent_id=agent.id, domain="lab"), timeout=WAIT_S)
            assert mapagent.id in peer_ids(got.peers), "the MAP agent advertises itself in aip:lab"
            tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            sid, answers = await agent.session(mapagent.id, [[pb.ContentItem(text="hello")], [pb.ContentItem(text="more")],
                                                             [pb.ContentItem(text="bye")]],
                                               metadata=(("traceparent", tp),))
            statuses = [a.session_status for a in answers]
            assert statuses == [AM.HOLD_RESPONSE, AM.HOLD_RESPONSE, AM.STOP_RESPONSE], statuses
            assert [texts(a.content) for a in answers] == ["map agent heard: hello", "map agent heard: more",
                                                           "map agent heard: bye"], answers
            assert all(a.session_id == sid and a.sender_id == mapagent.id for a in answers), answers
            got = await mapagent.line("got ")
            assert got.startswith("START_QUEST hello") and got.endswith(f"trace={tp}"), got  # trace context carried
            # One session = one mail conversation; task_info = MAP tasks, parents = dependencies.
            ans, _ = router.rpc("mail/list", {})
            convs = [c for c in ans["result"]["conversations"]
                     if (c.get("metadata") or {}).get("aip", {}).get("sessionId") == sid]
            assert len(convs) == 1, ans
            ans, _ = router.rpc("map/tasks/get", {"taskId": f"task_{agent.id}_1"})
            task = ans["result"]["task"]
            assert task["meta"]["dependsOn"] == [f"task_{agent.id}_0"] and task["assignee"] == mapagent.id, task
        await run(results, "an agent session START_QUEST ... STOP_RESPONSE with a MAP SDK agent", session_with_map_agent)

        async def map_agent_calls_aip():
            a = await mapagent.send(agent.id, {"parts": [{"kind": "text", "text": "from MAP"}]})
            assert a["from"] == agent.id and a["meta"]["correlationId"] == "rev-1", a
            assert a["payload"]["parts"][0]["text"] == f"{agent.id} heard: from MAP", a
            assert a["payload"]["aip"]["statuses"] == ["HOLD_RESPONSE", "STOP_RESPONSE"], a
            seen = agent.servicer.seen[-2:]
            assert [m.session_status for m in seen] == [AM.START_QUEST, AM.STOP_QUEST]
            assert seen[0].sender_id == mapagent.id, seen[0]
            a = await mapagent.send(tool.id, {"tool": "add", "arguments": {"a": 5, "b": 6}})
            assert a["payload"]["parts"] == [{"kind": "text", "text": "11"}] and a["payload"]["isError"] is False, a
        await run(results, "the reverse: a MAP SDK agent calls the AIP agent and the AIP tool (plain map/send)", map_agent_calls_aip)

        async def aip_to_aip_multimodal():
            blob = bytes(range(256))
            items = [pb.ContentItem(text="pic"), pb.ContentItem(image=blob), pb.ContentItem(audio=blob[::-1]),
                     pb.ContentItem(embedded=b"\x00\xff")]
            tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            _, answers = await agent.session(other.id, [items, [pb.ContentItem(text="end")]],
                                             metadata=(("traceparent", tp),))
            assert other.servicer.metadata.get("traceparent") == tp, other.servicer.metadata  # carried through MAP
            assert [a.session_status for a in answers] == [AM.HOLD_RESPONSE, AM.STOP_RESPONSE]
            got = list(answers[0].content)[1:]
            assert got == items[1:], got  # byte-exact both ways through MAP
            assert other.servicer.seen[0].content == items[0:] or list(other.servicer.seen[0].content) == items
        await run(results, "AIP agent to AIP agent: image, audio and embedded bytes byte-exact", aip_to_aip_multimodal)

        async def subscribe_and_update():
            call = agent.stub.SubscribeToUpdates(pb.UpdateSubscriptionRequest(subscriber_id=agent.id, node_ids=[tool.id]),
                                                 timeout=WAIT_S)
            first = await asyncio.wait_for(call.read(), WAIT_S)
            assert first.update_type == pb.NodeUpdate.ADDED and first.node_id == tool.id, first
            info = tool.info()
            info.description = "adds, now better"
            r = await tool.stub.UpdateNodeInfo(pb.UpdateNodeInfoRequest(sender_id=tool.id, peer=pb.Peer(tool_info=info)),
                                               timeout=WAIT_S)
            assert r.success, r
            upd = await asyncio.wait_for(call.read(), WAIT_S)
            assert upd.update_type == pb.NodeUpdate.UPDATED and upd.peer.tool_info.description == "adds, now better", upd
            # Nobody updates another node's info.
            await expect_code(agent.stub.UpdateNodeInfo(pb.UpdateNodeInfoRequest(sender_id=agent.id, peer=pb.Peer(tool_info=info)),
                                                        timeout=WAIT_S), grpc.StatusCode.INVALID_ARGUMENT, "another's info")
            r = await agent.stub.Unsubscribe(pb.UnsubscribeRequest(subscriber_id=agent.id), timeout=WAIT_S)
            assert r.success
            call.cancel()
        await run(results, "UpdateNodeInfo, SubscribeToUpdates, Unsubscribe", subscribe_and_update)

        def presence(agent_id):
            ans, _ = router.rpc("map/agents/get", {"agentId": agent_id})
            a = ans["result"]["agent"]
            return a["state"], a.get("_meta", {}).get("mapRouter", {}).get("presence", {}).get("status")

        async def heartbeat_loss():
            quiet = await Node(gw, "agent").start()
            nodes.append(quiet)
            await quiet.register()
            call = agent.stub.SubscribeToUpdates(pb.UpdateSubscriptionRequest(subscriber_id="watcher", node_ids=[quiet.id]),
                                                 timeout=15)
            assert (await asyncio.wait_for(call.read(), WAIT_S)).update_type == pb.NodeUpdate.ADDED
            state, online = presence(quiet.id)
            assert online == "online", (state, online)
            upd = await asyncio.wait_for(call.read(), 6)  # 1.5 s timeout, checked every 0.5 s
            assert upd.update_type == pb.NodeUpdate.UPDATED, upd
            # Offline is MAP presence: the agent is orphaned (agent.presence.changed), still listed.
            assert presence(quiet.id) == ("orphaned", "offline"), presence(quiet.id)
            got = await agent.stub.GetNodes(pb.GetNodesRequest(domain="lab"), timeout=WAIT_S)
            assert quiet.id in peer_ids(got.peers)
            ans, _ = router.rpc("map/replay", {"filter": {"eventTypes": ["agent.presence.changed"]}, "limit": 100})
            offline = [e for e in ans["result"]["events"]
                       if e["event"]["data"].get("agentId") == quiet.id and e["event"]["data"].get("status") == "offline"]
            assert offline, ans
            # A plain message to it meanwhile fails (recipient_offline); one sent with
            # `delivery: "guaranteed"` is kept, and delivered when it is back.
            mapagent.post(quiet.id, {"parts": [{"kind": "text", "text": "lost"}]})
            mapagent.post(quiet.id, {"parts": [{"kind": "text", "text": "while you were out"}]}, kept=True)
            await asyncio.sleep(0.5)
            assert not any(m.session_status == AM.START_QUEST for m in quiet.servicer.seen)
            ans, _ = router.rpc("map/replay", {"filter": {"eventTypes": ["message_failed"]}, "limit": 100})
            failed = [e["event"]["data"] for e in ans["result"]["events"]
                      if e["event"]["data"].get("recipient") == quiet.id]
            assert [f["reason"] for f in failed] == ["recipient_offline"], ans
            r = await quiet.heartbeat()
            assert r.success, r
            upd = await asyncio.wait_for(call.read(), WAIT_S)
            assert upd.update_type == pb.NodeUpdate.UPDATED
            assert presence(quiet.id) == (state, "online"), presence(quiet.id)  # as before
            a = await mapagent.answer()
            assert a["from"] == quiet.id and a["payload"]["parts"][0]["text"] == f"{quiet.id} heard: while you were out", a
            call.cancel()
        await run(results, "heartbeat loss: offline (MAP presence, events, kept messages), then a heartbeat: online", heartbeat_loss)

        async def hostile():
            # Over max_message_bytes: tonic's codec answers OUT_OF_RANGE ("decoded message
            # length too large"); on a stream the client may see the reset first (INTERNAL).
            big = agent.info()
            big.description = "x" * 70000
            await expect_code(agent.stub.RegisterAgent(big, timeout=WAIT_S), grpc.StatusCode.OUT_OF_RANGE,
                              "an oversize registration")
            try:
                await agent.session(mapagent.id, [[pb.ContentItem(text="x" * 70000)], []])
                raise AssertionError("an oversize session message went through")
            except grpc.aio.AioRpcError as e:
                assert e.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INTERNAL), e
            ch, call = raw_call(gw, "RegisterAgent", b"\xff\xff\xff\xff")
            e = await expect_code(call, grpc.StatusCode.INTERNAL, "malformed protobuf")
            await ch.close()
            ch, call = raw_call(gw, "RouteToolCalling", b"\x2a\x03\xff\xff\xff")
            await expect_code(call, grpc.StatusCode.INVALID_ARGUMENT, "malformed arguments")
            await ch.close()
            r = await agent.stub.DeregisterNode(pb.DeregisterNodeRequest(node_id="nobody"), timeout=WAIT_S)
            assert not r.success
            r = await agent.stub.Heartbeat(pb.HeartbeatRequest(sender_id="nobody"), timeout=WAIT_S)
            assert not r.success and r.message == "Node nobody not registered", r
            await expect_code(agent.call_tool("nobody", "add", {}), grpc.StatusCode.NOT_FOUND, "tool call to nobody")
            await expect_code(agent.session("nobody", [[pb.ContentItem(text="x")], []]), grpc.StatusCode.NOT_FOUND,
                              "session with nobody")
            stranger = Node(gw, "agent")
            await stranger.start()
            nodes.append(stranger)
            await expect_code(stranger.session(agent.id, [[], []]), grpc.StatusCode.FAILED_PRECONDITION,
                              "a session from an unregistered sender")
            # (A tool call from an unregistered sender is allowed, as upstream: it is the caller's.)
            r = await stranger.call_tool(tool.id, "add", {"a": "1", "b": "1"})
            assert [c.text for c in r.content] == ["2"], r

            async def silent():
                q = asyncio.Queue()

                async def requests():
                    await q.get()
                    yield AM()
                call = agent.stub.RouteAgentCalling(requests(), timeout=WAIT_S)
                try:
                    return [a async for a in call]
                finally:
                    q.put_nowait(None)
            await expect_code(silent(), grpc.StatusCode.DEADLINE_EXCEEDED, "a session that never sends START_QUEST")

            async def hold_first():
                async def requests():
                    yield AM(sender_id=agent.id, receiver_id=other.id, session_id="s", session_status=AM.HOLD_QUEST)
                return [a async for a in agent.stub.RouteAgentCalling(requests(), timeout=WAIT_S)]
            await expect_code(hold_first(), grpc.StatusCode.INVALID_ARGUMENT, "HOLD_QUEST first")
            info = agent.info("10.9.8.7:50051")
            info.agent_id = "outsider"
            e = await expect_code(agent.stub.RegisterAgent(info, timeout=WAIT_S), grpc.StatusCode.PERMISSION_DENIED,
                                  "a dial-back address outside the allow-list")
            assert "allow-list" in e.details()
            # A flood: 60 streams that never speak, on one connection and on several.
            # (Each channel its own connection: grpc shares one between equal channels otherwise.)
            flood_channels = [grpc.aio.insecure_channel(gw, options=[("grpc.use_local_subchannel_pool", 1)])
                              for _ in range(6)]

            async def never(ch):
                q = asyncio.Queue()

                async def requests():
                    await q.get()
                    yield AM()
                stub = pbg.GatewayServiceStub(ch)
                try:
                    return [a async for a in stub.RouteAgentCalling(requests(), timeout=8)]
                except grpc.aio.AioRpcError as e:
                    return e.code()
                finally:
                    q.put_nowait(None)
            codes = await asyncio.wait_for(asyncio.gather(*[never(flood_channels[i % 6]) for i in range(60)]), 20)
            assert all(isinstance(c, grpc.StatusCode) for c in codes), codes
            assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes  # max_sessions = 24
            for ch in flood_channels:
                await ch.close()
            # ... and the router still serves MAP and AIP.
            ans, _ = router.rpc("map/agents/list", {})
            assert any(a["id"] == agent.id for a in ans["result"]["agents"]), ans
            r = await agent.call_tool(tool.id, "add", {"a": "2", "b": "2"})
            assert [c.text for c in r.content] == ["4"]
        await run(results, "hostile input gets gRPC status codes; the router keeps serving", hostile)

        async def metrics():
            with urllib.request.urlopen(router.http() + "/metrics", timeout=WAIT_S) as r:
                text = r.read().decode()
            values = dict(re.findall(r"^(map_aip_\w+) (\d+)$", text, re.M))
            assert int(values["map_aip_nodes"]) >= 3, values
            assert int(values["map_aip_tool_calls_total"]) >= 5, values
            assert int(values["map_aip_sessions_total"]) >= 3, values
            assert int(values["map_aip_refused_total"]) >= 5, values
        await run(results, "/metrics counts AIP nodes, sessions, tool calls and refusals", metrics)

        async def deregister():
            r = await other.stub.DeregisterNode(pb.DeregisterNodeRequest(node_id=other.id), timeout=WAIT_S)
            assert r.success
            ans, _ = router.rpc("map/agents/get", {"agentId": other.id})
            assert "error" in ans, ans
        await run(results, "DeregisterNode: the MAP agent is gone", deregister)

        async def restart():
            if NATS is None:
                data = router.data
                router.stop()
                again = await Router(CONFIG, data_dir=data).started()
            else:
                # The live node dies: the standby takes over, and the AIP port the nodes use is
                # now the new live node's gateway (the standby's own gateway let it go).
                await router.take_over()
                again = router
            try:
                stub = pbg.GatewayServiceStub(grpc.aio.insecure_channel(again.aip))
                r = await stub.Heartbeat(pb.HeartbeatRequest(sender_id=agent.id), timeout=WAIT_S)
                assert not r.success and r.message == f"Node {agent.id} not registered", r
                agent.stub = stub
                assert (await agent.register()).success
                r = await stub.Heartbeat(pb.HeartbeatRequest(sender_id=agent.id), timeout=WAIT_S)
                assert r.success
                if NATS is not None:
                    # ... and it serves calls: the tool registers again and answers there.
                    tool.stub = pbg.GatewayServiceStub(grpc.aio.insecure_channel(again.aip))
                    assert (await tool.register()).success
                    agent.stub = stub
                    r = await agent.call_tool(tool.id, "add", {"a": "3", "b": "4"})
                    assert [c.text for c in r.content] == ["7"], r
            finally:
                again.stop()
        await run(results, "a router restart (--spread: the live node killed, the standby takes over): "
                  "registrations are asked for again (Heartbeat says not registered)", restart)
    finally:
        if mapagent:
            mapagent.stop()
        for n in nodes:
            try:
                await n.stop()
            except Exception:  # noqa: BLE001
                pass
        router.stop()
        shutil.rmtree(router.dir, ignore_errors=True)


AUTH_CONFIG = """
[auth]
system_principals = ["ops"]
[auth.api_keys]
file = "{dir}/api-keys"
[permissions.principals.viewer.lifecycle]
canRegister = false
[permissions.principals.viewer.messaging]
canSend = false
[aip]
tool_timeout_ms = 3000
"""


async def identity(results):
    router = await Router(AUTH_CONFIG).started()
    nodes = []
    try:
        gw = router.aip
        alice = await Node(gw, "agent", key=KEYS["alice"]).start()
        atool = await Node(gw, "tool", key=KEYS["alice"]).start()
        bob = await Node(gw, "agent", key=KEYS["bob"]).start()
        viewer = await Node(gw, "agent", key=KEYS["viewer"]).start()
        ops = await Node(gw, "agent", key=KEYS["ops"]).start()
        anon = await Node(gw, "agent").start()
        nodes += [alice, atool, bob, viewer, ops, anon]

        async def principals():
            await expect_code(anon.register(), grpc.StatusCode.UNAUTHENTICATED, "no credential")
            wrong = Node(gw, "agent", key="not-a-key")
            await wrong.start()
            nodes.append(wrong)
            await expect_code(wrong.register(), grpc.StatusCode.UNAUTHENTICATED, "a wrong credential")
            assert (await alice.register()).success
            assert (await atool.register()).success
            assert (await bob.register()).success
            await expect_code(viewer.register(), grpc.StatusCode.PERMISSION_DENIED, "no canRegister grant")
            # Alice's node is a MAP agent of principal alice (its own, never a shared one).
            ans, _ = router.rpc("map/agents/get", {"agentId": alice.id}, key=KEYS["ops"])
            assert ans.get("result", {}).get("agent", {}).get("role") == "agent", ans
            # Bob may not hijack alice's nodes: no heartbeat, no session or call as alice, no
            # update, no deregistration, no second registration of her id.
            as_bob = lambda coro_fn: coro_fn  # noqa: E731
            bob_stub, bob_md = bob.stub, bob.metadata
            await expect_code(bob_stub.Heartbeat(pb.HeartbeatRequest(sender_id=alice.id), timeout=WAIT_S, metadata=bob_md),
                              grpc.StatusCode.PERMISSION_DENIED, "bob heartbeats alice's node")
            await expect_code(bob_stub.RouteToolCalling(pb.ToolRequest(sender_id=alice.id, receiver_id=atool.id, tool_name="add",
                                                                        arguments={"a": "1", "b": "1"}),
                                                        timeout=WAIT_S, metadata=bob_md),
                              grpc.StatusCode.PERMISSION_DENIED, "bob calls a tool as alice")

            async def bob_session_as_alice():
                async def requests():
                    yield AM(sender_id=alice.id, receiver_id=bob.id, session_id="hijack", session_status=AM.START_QUEST)
                return [a async for a in bob_stub.RouteAgentCalling(requests(), timeout=WAIT_S, metadata=bob_md)]
            await expect_code(bob_session_as_alice(), grpc.StatusCode.PERMISSION_DENIED, "bob opens a session as alice")
            await expect_code(bob_stub.UpdateNodeInfo(pb.UpdateNodeInfoRequest(sender_id=alice.id, peer=pb.Peer(agent_info=alice.info())),
                                                      timeout=WAIT_S, metadata=bob_md),
                              grpc.StatusCode.PERMISSION_DENIED, "bob updates alice's node")
            await expect_code(bob_stub.DeregisterNode(pb.DeregisterNodeRequest(node_id=alice.id), timeout=WAIT_S, metadata=bob_md),
                              grpc.StatusCode.PERMISSION_DENIED, "bob deregisters alice's node")
            twin = Node(gw, "agent", node_id=alice.id, key=KEYS["bob"])
            await twin.start()
            nodes.append(twin)
            await expect_code(twin.register(), grpc.StatusCode.ALREADY_EXISTS, "bob registers alice's id")
            assert (await alice.heartbeat()).success
            # Nothing reached alice's servers from bob's attempts.
            assert alice.servicer.seen == [] and atool.servicer.seen == []
            # Bob's legitimate call of alice's tool arrives with bob's id as the sender.
            r = await bob.call_tool(atool.id, "add", {"a": "1", "b": "2"})
            assert [c.text for c in r.content] == ["3"]
            assert atool.servicer.seen[-1].sender_id == bob.id
            # A session bob opens reaches alice's agent from bob, and only alice's agent.
            _, answers = await bob.session(alice.id, [[pb.ContentItem(text="hi")], []])
            assert [a.session_status for a in answers] == [AM.HOLD_RESPONSE, AM.STOP_RESPONSE]
            assert all(m.sender_id == bob.id for m in alice.servicer.seen), alice.servicer.seen
            assert bob.servicer.seen == []
            # The system principal may deregister any node; alice her own.
            assert (await ops.register()).success
            r = await ops.stub.DeregisterNode(pb.DeregisterNodeRequest(node_id=bob.id), timeout=WAIT_S, metadata=ops.metadata)
            assert r.success
            r = await alice.stub.DeregisterNode(pb.DeregisterNodeRequest(node_id=alice.id), timeout=WAIT_S, metadata=alice.metadata)
            assert r.success
        await run(results, "auth: system, alice, bob, a principal without grants; no hijack, no misdelivery", principals)
    finally:
        for n in nodes:
            try:
                await n.stop()
            except Exception:  # noqa: BLE001
                pass
        router.stop()
        shutil.rmtree(router.dir, ignore_errors=True)


def make_certificates(d):
    """A CA and a certificate for 127.0.0.1 signed by it (docs/security.md's recipe)."""
    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)
    with open(os.path.join(d, "ca.ext"), "w") as f:
        f.write("basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
                "subjectKeyIdentifier = hash\n")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
                "extendedKeyUsage = serverAuth\nsubjectAltName = DNS:localhost, IP:127.0.0.1\n"
                "authorityKeyIdentifier = keyid\n")
    ssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca-key.pem")
    ssl("req", "-new", "-key", "ca-key.pem", "-subj", "/CN=aip test CA", "-out", "ca.csr")
    ssl("x509", "-req", "-in", "ca.csr", "-signkey", "ca-key.pem", "-sha256", "-days", "2", "-extfile", "ca.ext",
        "-out", "ca.pem")
    ssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "server-key.pem")
    ssl("req", "-new", "-key", "server-key.pem", "-subj", "/CN=localhost", "-out", "server.csr")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-sha256",
        "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    return os.path.join(d, "ca.pem"), os.path.join(d, "server.pem"), os.path.join(d, "server-key.pem")


async def tls_and_eviction(results):
    """TLS on the AIP listener from the router's certificate; upstream's eviction rule."""
    certs = tempfile.mkdtemp(prefix="map-router-aip-certs-")
    ca, cert, key = make_certificates(certs)
    router = await Router("[aip]\nheartbeat_timeout_ms = 1000\n", extra=("--tls-cert", cert, "--tls-key", key)).started()
    node = None
    try:
        async def over_tls():
            assert router.url.startswith("wss://"), router.url
            with open(ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            channel = grpc.aio.secure_channel(router.aip, creds)
            stub = pbg.GatewayServiceStub(channel)
            nonlocal node
            node = await Node(router.aip, "agent").start()
            node.stub = stub
            assert (await node.register()).success
            got = await stub.GetNodes(pb.GetNodesRequest(domain="lab"), timeout=WAIT_S)
            assert peer_ids(got.peers) == [node.id]
            # Plain text to the TLS listener gets nowhere.
            plain = pbg.GatewayServiceStub(grpc.aio.insecure_channel(router.aip))
            await expect_code(plain.GetNodes(pb.GetNodesRequest(domain="lab"), timeout=3), grpc.StatusCode.UNAVAILABLE,
                              "plain text to the TLS listener")
        await run(results, "TLS on the AIP listener from the router's [tls] certificate", over_tls)

        async def eviction():
            # No heartbeats: upstream's rule removes the node (its MAP agent unregistered).
            await asyncio.sleep(2.5)
            got = await node.stub.GetNodes(pb.GetNodesRequest(domain="lab"), timeout=WAIT_S)
            assert list(got.peers) == [], got
            r = await node.heartbeat()
            assert not r.success and r.message == f"Node {node.id} not registered", r
            assert (await node.register()).success  # and it may register again
        await run(results, "heartbeat loss under the default rule: evicted, then registered again", eviction)
    finally:
        if node:
            await node.stop()
        router.stop()
        shutil.rmtree(router.dir, ignore_errors=True)
        shutil.rmtree(certs, ignore_errors=True)


async def run(results, name, fn):
    try:
        await asyncio.wait_for(fn(), 60)
        print(f"ok - {name}", flush=True)
        results.append(True)
    except Exception as e:  # noqa: BLE001
        print(f"FAIL - {name}: {e!r}", flush=True)
        traceback.print_exc()
        results.append(False)


async def main():
    global NATS
    if ARGS.spread:
        NATS = Nats()
    try:
        return await suites()
    finally:
        if NATS is not None:
            NATS.stop()


async def suites():
    results = []
    await scenarios(results)
    await identity(results)
    await tls_and_eviction(results)
    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed" + (" (spread over a live node and a standby)" if ARGS.spread else ""))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
