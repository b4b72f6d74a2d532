#!/usr/bin/env python3
"""The MAMP and IM gateways driven by Python programs that make the seeds' own calls.

Seed 000 (MAMP 1.0) and seed 002 (agent IM) show their clients in Python with httpx-style
POSTs and the `websockets` package; this runner makes exactly those calls, with the seeds'
fields, against the built `map-router` on 127.0.0.1, and checks what the MAP side saw through
a plain MAP WebSocket client (JSON-RPC, the way any SDK speaks it).

    python tests/gateways/run.py --bin target/debug/map-router [--spread]

With --spread every router is a cluster on one nats-server (started by the runner): a live
node and a standby, each with the scenario's config plus `[cluster]`; the seeds' clients call
the standby's gateways (which relay to the live node) and the MAP agents connect to the live
node, so every message crosses nodes (docs/cluster.md, "Gateways on every node").

Needs the packages `httpx` and `websockets` (tests/gateways/setup.sh makes a virtual
environment with them; scripts/test.sh uses it). Every wait is bounded; a failure exits 1.
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
import threading
import time
import urllib.parse
import uuid
from datetime import datetime, timezone

import httpx
import websockets

STEP = 10.0  # seconds: the bound on every single wait
API_KEY = "gw-python-key-0123456789"
OTHER_KEY = "gw-python-other-0123456789"
REMOTE_TOKEN = "remote-token-0123456789"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def bounded(aw, what="wait"):
    try:
        return await asyncio.wait_for(aw, STEP)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out: {what}")


# ------------------------------------------------------------------------------------------
# The router under test


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nats:
    """`nats-server -js` on a free loopback port with a temporary store (--spread)."""

    def __init__(self, work):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", os.path.join(work, "nats")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket
        deadline = time.time() + STEP
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                check(time.time() < deadline, "nats-server did not listen")
                time.sleep(0.05)
        self.url = f"nats://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait(STEP)


NATS = None  # the runner's nats-server with --spread


class Node:
    """One map-router process."""

    def __init__(self, binary, config, data_dir, env, listen="127.0.0.1:0"):
        self.binary, self.config, self.data_dir, self.env = binary, config, data_dir, env
        self.listen = listen
        self.proc = None
        self.base = None
        self.lines = []

    def start(self):
        env = dict(os.environ, **self.env)
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", self.listen, "--config", self.config,
             "--data-dir", self.data_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        found = threading.Event()

        def drain():
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                m = re.match(r"^map-router listening on ws://(\S+)/$", line)
                if m and not found.is_set():
                    self.base = m.group(1)
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(STEP):
            self.stop()
            raise AssertionError("router did not start:\n" + "\n".join(self.lines))
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STEP)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STEP)


class Router:
    """The router under test: one node, or with --spread a live node and a standby on
    NATS (the stream named after the data directory, so that a restart finds its log). `http`
    and `ws` are where the seeds' clients go (the standby), `map_ws` where MAP agents connect
    (the live node), `map_base` the live node's address (the host in its gateways' URIs)."""

    def __init__(self, binary, config, data_dir, env=None):
        self.binary, self.config, self.data_dir, self.env = binary, config, data_dir, env or {}
        self.nodes = []
        self.base = None
        self.map_base = None

    def start(self):
        if NATS is None:
            node = Node(self.binary, self.config, self.data_dir, self.env).start()
            self.nodes = [node]
            self.base = self.map_base = node.base
            return self
        stream = "gw_" + re.sub(r"[^A-Za-z0-9]", "_", os.path.basename(self.data_dir))
        with open(self.config) as f:
            base_config = f.read()

        def config(name, extra):
            path = f"{self.config}.{name}.toml"
            with open(path, "w") as f:
                f.write(base_config + f'\n[cluster]\nurl = "{NATS.url}"\nstream = "{stream}"\n'
                        f'subject_prefix = "{stream}"\nnode = "{name}"\n{extra}')
            return path

        live = Node(self.binary, config("live", ""), self.data_dir + "-live", self.env).start()
        self.nodes = [live]
        standby = Node(self.binary, config("standby", "standby = true\n"),
                       self.data_dir + "-standby", self.env, listen=f"127.0.0.1:{free_port()}")
        # A standby prints no "listening" line until it takes over: it is ready once its
        # /health says it serves.
        self._start_standby(standby)
        self.nodes.append(standby)
        self.base, self.map_base = standby.base, live.base
        return self

    def _start_standby(self, node):
        env = dict(os.environ, **node.env)
        node.proc = subprocess.Popen(
            [node.binary, "serve", "--listen", node.listen, "--config", node.config,
             "--data-dir", node.data_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        node.base = node.listen
        deadline = time.time() + 2 * STEP
        while True:
            try:
                r = httpx.get(f"http://{node.base}/health", timeout=1)
                if "\nserving:" in r.text:
                    return
            except httpx.HTTPError:
                pass
            check(node.proc.poll() is None, "the standby exited")
            check(time.time() < deadline, "the standby never served")
            time.sleep(0.1)

    @property
    def http(self):
        return f"http://{self.base}"

    @property
    def ws(self):
        return f"ws://{self.base}"

    @property
    def map_ws(self):
        return f"ws://{self.map_base}"

    def stop(self):
        for node in reversed(self.nodes):
            node.stop()


class MapAgent:
    """A MAP agent over a raw WebSocket: JSON-RPC calls, and its map/message notifications."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.pending = {}
        self.messages = asyncio.Queue()
        self.events = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url, name, api_key=None, kind="agent"):
        ws = await bounded(websockets.connect(url + "/"), "MAP websocket")
        me = cls(ws)
        params = {"protocolVersion": 1, "participantType": kind, "name": name}
        if api_key:
            params["auth"] = {"method": "api-key", "credential": api_key}
        await me.call("map/connect", params)
        return me

    async def _read(self):
        async for raw in self.ws:
            msg = json.loads(raw)
            if "id" in msg and msg["id"] in self.pending:
                self.pending.pop(msg["id"]).set_result(msg)
            elif msg.get("method") == "map/message":
                p = msg["params"]
                await self.messages.put(p.get("message", p))
            elif msg.get("method") == "map/event":
                await self.events.put(msg["params"]["event"])

    async def call(self, method, params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                       "params": params}))
        answer = await bounded(fut, method)
        check("error" not in answer, f"{method} failed: {answer}")
        return answer["result"]

    async def message(self):
        return await bounded(self.messages.get(), "a map/message")

    async def close(self):
        await self.ws.close()
        self.reader.cancel()


def now_iso():
    return datetime.now(timezone.utc).isoformat()


# ------------------------------------------------------------------------------------------
# A remote MAMP agent (seed 000's receive_mamp_message), on 127.0.0.1


class MampReceiver:
    def __init__(self):
        self.received = asyncio.Queue()
        self.conversations = {}
        self.server = None
        self.port = None

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        try:
            head = await bounded(reader.readuntil(b"\r\n\r\n"), "request head")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:] if line)}
            body = await bounded(reader.readexactly(int(headers.get("content-length", "0"))),
                                 "request body")
            msg = json.loads(body)
            conv_id = msg.get("conversation_id")
            if not conv_id:  # seed: new conversation, the receiver makes the id
                conv_id = f"conv-{uuid.uuid4()}"
                self.conversations[conv_id] = []
            status = 200
            if conv_id not in self.conversations:
                answer = {"error": "conversation_not_found",
                          "message": f"Conversation {conv_id} not found", "status_code": 404}
                status = 404
            else:
                self.conversations[conv_id].append(msg)
                answer = {"conversation_id": conv_id, "message_id": msg["message_id"],
                          "status": "received"}
            await self.received.put((lines[0], headers, msg))
            data = json.dumps(answer).encode()
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        finally:
            writer.close()

    def stop(self):
        self.server.close()


# ------------------------------------------------------------------------------------------
# Scenarios


async def mamp_scenarios(binary, work):
    receiver = await MampReceiver().start()
    config = os.path.join(work, "mamp.toml")
    with open(config, "w") as f:
        # Authentication on (API keys from the environment) and nothing else: the gateways
        # need no trusted transport. The seed's sender URI is in the tester's namespace.
        f.write('[gateways.mamp]\nnamespaces = { "mamp-tester" = "agent://your-domain.com/" }\n'
                '[[gateways.mamp.remote]]\nuri = "agent://other.example/code-analyst"\n'
                f'endpoint = "http://127.0.0.1:{receiver.port}"\ntoken = "{REMOTE_TOKEN}"\n')
    router = Router(binary, config, os.path.join(work, "mamp-data"),
                    env={"MAP_ROUTER_API_KEYS": f"{API_KEY} mamp-tester,{OTHER_KEY} other"}).start()
    try:
        agent = await MapAgent.connect(router.map_ws, "code-analyst-local", api_key=API_KEY)
        reg = await agent.call("map/agents/register", {"name": "code-analyst-local"})
        agent_id = reg["agent"]["id"]
        host = router.base.split(":")[0]
        async with httpx.AsyncClient(base_url=router.http, timeout=STEP) as http:
            # The card, in the seed's shape.
            card = (await http.get("/mamp/v1/card")).json()
            check(card["protocol"] == "mamp/1.0", f"card protocol: {card}")
            check(card["agent_id"].startswith("agent://"), f"card agent_id: {card}")
            check(card["access"]["require_auth"] is True, f"card access: {card}")
            check("image" in card["capabilities"]["content_types"], f"card types: {card}")
            print("ok mamp card has protocol mamp/1.0 and require_auth")

            # The seed's send_to_agent, as its remote caller writes it.
            def mamp_msg(content, conversation_id=None):
                m = {"protocol": "mamp/1.0", "message_id": str(uuid.uuid4()),
                     "from": "agent://your-domain.com/agent-123",
                     "to": f"agent://{host}/code-analyst-local",
                     "content": content, "metadata": {"timestamp": now_iso()}}
                if conversation_id:
                    m["conversation_id"] = conversation_id
                return m

            auth = {"Authorization": f"Bearer {API_KEY}"}
            r = await http.post("/mamp/v1/messages", json=mamp_msg("帮我分析这段代码的性能"))
            check(r.status_code == 401, f"no bearer: {r.status_code} {r.text}")
            r = await http.post("/mamp/v1/messages", json=mamp_msg("x"),
                                headers={"Authorization": "Bearer wrong-key-0123456789"})
            check(r.status_code == 401, f"bad bearer: {r.status_code}")
            print("ok mamp without a (valid) bearer is 401 when auth is on")

            # Another principal may not post as the tester's agent (nor as anyone outside its
            # own namespace): 403, and nothing reaches the MAP agent (checked below: exactly
            # the tester's three messages arrive).
            r = await http.post("/mamp/v1/messages", json=mamp_msg("spoof"),
                                headers={"Authorization": f"Bearer {OTHER_KEY}"})
            check(r.status_code == 403 and r.json()["error"] == "forbidden",
                  f"spoofed sender: {r.status_code} {r.text}")
            print("ok mamp a sender outside the caller's namespace is 403")

            first = mamp_msg("帮我分析这段代码的性能")
            r = await http.post("/mamp/v1/messages", json=first, headers=auth)
            check(r.status_code == 200, f"new conversation: {r.status_code} {r.text}")
            result = r.json()
            check(result["status"] == "received" and result["message_id"] == first["message_id"],
                  f"answer: {result}")
            conv = result["conversation_id"]
            check(conv, "a conversation id")
            second = mamp_msg("那如果用异步方案呢?", conv)
            r = await http.post("/mamp/v1/messages", json=second, headers=auth)
            check(r.status_code == 200 and r.json()["conversation_id"] == conv,
                  f"continuation: {r.status_code} {r.text}")
            image = {"content": [
                {"type": "text", "text": "分析这张图片"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgoAAAANSUhEUg=="}},
                {"type": "code", "language": "python", "code": "def hello(): pass"},
                {"type": "file", "name": "report.pdf", "mime_type": "application/pdf",
                 "source": {"type": "url", "url": "https://example.com/report.pdf"}}]}
            third = mamp_msg(image["content"], conv)
            r = await http.post("/mamp/v1/messages", json=third, headers=auth)
            check(r.status_code == 200, f"multimodal: {r.status_code} {r.text}")
            print("ok mamp send_to_agent: new conversation, continuation, multimodal content")

            bogus = await http.post("/mamp/v1/messages", json=mamp_msg("?", "conv-does-not-exist"),
                                    headers=auth)
            body = bogus.json()
            check(bogus.status_code == 404 and body == {
                "error": "conversation_not_found",
                "message": "Conversation conv-does-not-exist not found",
                "status_code": 404}, f"bogus conversation: {bogus.status_code} {body}")
            print("ok mamp unknown conversation_id is 404 in the seed's shape")

            got = [await agent.message() for _ in range(3)]
            check(all(m["from"] == "agent://your-domain.com/agent-123" for m in got),
                  f"senders: {[m['from'] for m in got]}")
            convs = {m["meta"]["mail"]["conversationId"] for m in got}
            check(convs == {conv}, f"one conversation: {convs} vs {conv}")
            check(all(m["meta"]["protocol"] == "mamp" for m in got), "meta.protocol")
            check(got[0]["payload"] == "帮我分析这段代码的性能", f"payload: {got[0]}")
            check(got[2]["payload"] == image["content"], f"blocks: {got[2]}")
            turns = await agent.call("mail/turns/list", {"conversationId": conv})
            check(len(turns["turns"]) >= 3, f"recorded turns: {turns}")
            print("ok mamp the MAP agent received all three in one conversation, as turns")

            # Outbound: the MAP agent messages the remote MAMP agent by its agent:// URI.
            remote = "agent://other.example/code-analyst"
            created = await agent.call("mail/create", {"initialParticipants": [{"id": remote}],
                                                       "subject": "outbound"})
            local_conv = created["conversation"]["id"]
            for text in ["帮我分析这段代码的性能", "那如果用异步方案呢?"]:
                await agent.call("map/send", {"to": {"agent": remote}, "payload": text,
                                              "meta": {"mail": {"conversationId": local_conv}}})
            line1, headers1, out1 = await bounded(receiver.received.get(), "outbound 1")
            line2, headers2, out2 = await bounded(receiver.received.get(), "outbound 2")
            check(line1.startswith("POST /mamp/v1/messages "), f"request line: {line1}")
            check(headers1.get("authorization") == f"Bearer {REMOTE_TOKEN}", f"token: {headers1}")
            check(out1["protocol"] == "mamp/1.0" and out1["to"] == remote, f"envelope: {out1}")
            check(out1["from"] == f"agent://{router.map_base}/{agent_id}" or
                  out1["from"].endswith("/" + agent_id), f"from: {out1}")
            check("conversation_id" not in out1, f"first outbound starts a conversation: {out1}")
            check(out1["content"] == "帮我分析这段代码的性能" and "timestamp" in out1["metadata"],
                  f"content/metadata: {out1}")
            theirs = next(iter(receiver.conversations))
            check(out2["conversation_id"] == theirs, f"conversation kept: {out2} vs {theirs}")
            print("ok mamp outbound reaches the remote receiver and keeps its conversation id")
        await agent.close()
    finally:
        router.stop()
        receiver.stop()


async def im_scenarios(binary, work, auth):
    """The seed's IM flows; with `auth`, the same flows with API keys (and no trusted
    transport): every call carries the tester's credential, the IM WebSocket as `?token=`."""
    name = "im-auth" if auth else "im"
    tag = "im+auth" if auth else "im"
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write("[gateways.im]\nheartbeat_timeout_ms = 1500\n")
    data = os.path.join(work, f"{name}-data")
    env = {"MAP_ROUTER_API_KEYS": f"{API_KEY} im-tester,{OTHER_KEY} other"} if auth else {}
    headers = {"Authorization": f"Bearer {API_KEY}"} if auth else {}
    token = f"?token={API_KEY}" if auth else ""
    key = API_KEY if auth else None
    router = Router(binary, config, data, env).start()
    uri = "agent://internal/my-agent"
    quoted = urllib.parse.quote(uri, safe="")
    try:
        analyst = await MapAgent.connect(router.map_ws, "analyst", api_key=key)
        analyst_id = (await analyst.call("map/agents/register", {"name": "analyst"}))["agent"]["id"]
        # The seed's PC agent: connect, register, heartbeat (faster than 30 s for the test).
        if auth:
            # Without a credential the upgrade is refused (401) before any frame.
            try:
                await bounded(websockets.connect(f"{router.ws}/gateway/connect"), "IM connect")
                check(False, "an IM connection without a credential was accepted")
            except websockets.InvalidStatus as e:
                check(e.response.status_code == 401, f"upgrade without credential: {e}")
            print(f"ok {tag} an IM connection without a credential is refused with 401")
        ws = await bounded(websockets.connect(f"{router.ws}/gateway/connect{token}"),
                           "IM connect")
        await ws.send(json.dumps({"type": "register", "agent_uri": uri,
                                  "capabilities": ["file_read", "bash"]}))
        registered = json.loads(await bounded(ws.recv(), "registered"))
        check(registered["type"] == "registered", f"register: {registered}")
        frames = asyncio.Queue()
        beating = True

        async def heartbeat_loop():
            while beating:
                await ws.send(json.dumps({"type": "heartbeat"}))
                await asyncio.sleep(0.3)

        async def read_loop():
            try:
                async for raw in ws:
                    f = json.loads(raw)
                    if f.get("type") != "heartbeat_ack":
                        await frames.put(f)
            except websockets.ConnectionClosed:
                pass

        hb = asyncio.create_task(heartbeat_loop())
        rd = asyncio.create_task(read_loop())
        async with httpx.AsyncClient(base_url=router.http, timeout=STEP, headers=headers) as http:
            for path in [f"/gateway/status/{quoted}", f"/gateway/status/{uri}"]:
                st = (await http.get(path)).json()
                check(st["agent_uri"] == uri and st["status"] == "online", f"{path}: {st}")
            online = (await http.get("/gateway/agents")).json()
            check([a["agent_uri"] for a in online["agents"]] == [uri], f"online: {online}")
            print(f"ok {tag} register loop makes /gateway/status online (encoded and catch-all)")

            r = await http.post("/gateway/send", json={"to": uri, "content": "帮我分析代码"})
            check(r.status_code == 200, f"send: {r.status_code} {r.text}")
            conv = r.json()["conversation_id"]
            pushed = await bounded(frames.get(), "pushed message")
            check(pushed["type"] == "message" and pushed["content"] == "帮我分析代码" and
                  pushed["conversation_id"] == conv and pushed["from"], f"pushed: {pushed}")
            print(f"ok {tag} POST /gateway/send arrives on the socket as a message frame")
            if auth:
                # Another principal cannot send as the tester's IM agent.
                r = await http.post("/gateway/send",
                                    json={"to": analyst_id, "content": "spoof", "from": uri},
                                    headers={"Authorization": f"Bearer {OTHER_KEY}"})
                check(r.status_code == 403 and r.json()["error"] == "forbidden",
                      f"spoofed IM sender: {r.status_code} {r.text}")
                print(f"ok {tag} another principal sending as the IM agent is 403")

            # The IM agent asks the MAP agent (seed: POST /gateway/send, here naming the
            # sender), and the MAP agent's reply in that conversation reaches the socket.
            r = await http.post("/gateway/send", json={"to": analyst_id, "content": "重点分析 core 模块",
                                                       "from": uri})
            check(r.status_code == 200, f"IM to MAP: {r.status_code} {r.text}")
            ask_conv = r.json()["conversation_id"]
            ask = await analyst.message()
            check(ask["from"] == uri and ask["payload"] == "重点分析 core 模块" and
                  ask["meta"]["mail"]["conversationId"] == ask_conv and
                  ask["meta"]["protocol"] == "im", f"MAP side: {ask}")
            await analyst.call("map/send", {"to": {"agent": ask["from"]}, "payload": "分析完成",
                                            "meta": {"mail": {"conversationId": ask_conv}}})
            reply = await bounded(frames.get(), "MAP reply")
            check(reply["type"] == "message" and reply["content"] == "分析完成" and
                  reply["conversation_id"] == ask_conv, f"reply: {reply}")
            check(ask["payload"] != "spoof", "the spoofed message arrived")
            print(f"ok {tag} an IM agent's message reaches a MAP agent, whose reply arrives as a frame")

            beating = False
            await bounded(hb, "heartbeat loop ends")
            deadline = time.monotonic() + STEP
            while True:
                st = (await http.get(f"/gateway/status/{quoted}")).json()
                if st["status"] == "offline":
                    break
                check(time.monotonic() < deadline, f"still online: {st}")
                await asyncio.sleep(0.1)
            check(st["last_seen"], f"last_seen: {st}")
            check((await http.get("/gateway/agents")).json()["agents"] == [], "none online")
            print(f"ok {tag} after heartbeats stop the status is offline with last_seen")

            async def total():
                c = await http.get(f"/api/contacts/{quoted}")
                return c.status_code, (c.json().get("stats", {}) if c.status_code == 200 else {})

            deadline = time.monotonic() + STEP
            while (await total())[1].get("total_messages") != 3:
                check(time.monotonic() < deadline, f"contact: {await total()}")
                await asyncio.sleep(0.1)
            collab = (await http.get(f"/api/traces/{ask_conv}/collaborators")).json()
            uris = [c["agent_uri"] for c in collab["collaborators"]]
            check(uri in uris and len(uris) == 2, f"collaborators: {collab}")
            print(f"ok {tag} the contact counts its three messages; the conversation lists collaborators")
            if auth:
                # Another principal takes no part in the conversation: it is not shown.
                other = {"Authorization": f"Bearer {OTHER_KEY}"}
                r = await http.get(f"/api/traces/{ask_conv}/collaborators", headers=other)
                check(r.status_code == 404, f"collaborators to another principal: {r.status_code}")
                r = await http.get(f"/api/contacts/{quoted}/conversations", headers=other)
                check(r.status_code == 200 and r.json()["conversations"] == [],
                      f"conversations to another principal: {r.text}")
                print(f"ok {tag} another principal reads none of the tester's conversations")
        rd.cancel()
        await analyst.close()
        router.stop()

        router = Router(binary, config, data, env).start()
        async with httpx.AsyncClient(base_url=router.http, timeout=STEP, headers=headers) as http:
            c = await http.get(f"/api/contacts/{quoted}")
            check(c.status_code == 200 and c.json()["stats"]["total_messages"] == 3,
                  f"after restart: {c.status_code} {c.text}")
            st = (await http.get(f"/gateway/status/{quoted}")).json()
            check(st["status"] == "offline" and st["last_seen"], f"status after restart: {st}")
            print(f"ok {tag} contacts and last_seen survive a router restart")
    finally:
        router.stop()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/map-router")
    ap.add_argument("--spread", action="store_true",
                    help="a live node and a standby on one nats-server (see the module docs)")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    work = tempfile.mkdtemp(prefix="gateways-")
    global NATS
    if args.spread:
        NATS = Nats(work)
    try:
        await mamp_scenarios(binary, work)
        await im_scenarios(binary, work, auth=False)
        await im_scenarios(binary, work, auth=True)
    finally:
        if NATS is not None:
            NATS.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("gateways: all scenarios passed" + (" (spread over a live node and a standby)" if args.spread else ""))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
