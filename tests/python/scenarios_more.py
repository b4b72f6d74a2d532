"""Resume and restart, two principals, TLS, stdio agents spawned by the router, the wheel,
mypy --strict, and the types checked against upstream's JSON Schema."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import typing
from pathlib import Path
from typing import Any

from harness import QUIET, ROOT, STEP, Ctx, bounded, check, eq, expect_code, scenario, until
from scenarios_core import Inbox, agent, client, inbox, next_event, quiet, take

import map_client.types as wire_types
from map_client import (
    AgentConnection,
    Auth,
    AuthError,
    ClientConnection,
    MapConnectionError,
    Message,
    ReconnectPolicy,
)
from map_client.transport import WebSocketTransport

FIXTURES = ROOT / "tests" / "fixtures" / "auth"
ALICE_KEY = "ak-interop-alice-0123456789"
BOB_KEY = "ak-interop-bob-0123456789"
ISSUER = "https://issuer.python-suite"
AUDIENCE = "map-router-python-suite"
AUTH_CONFIG = f"""[auth]
realm = "python-suite"
[auth.api_keys]
file = {json.dumps(str(FIXTURES / "api-keys.txt"))}
[auth.jwt]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
secret_file = {json.dumps(str(FIXTURES / "hs256.secret"))}
leeway_secs = 0
"""
PY_SRC = str(ROOT / "python" / "src")
VENV_PY = sys.executable


def jwt(sub: str, ttl: int = 600) -> str:
    """An HS256 JWT for `sub`, signed with the suite's fixture secret."""
    secret = (FIXTURES / "hs256.secret").read_text().strip().encode()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + ttl}).encode())
    sig = hmac.new(secret, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(sig)}"


def drop(conn: Any) -> None:
    """Cuts a connection's TCP socket without a close frame (a crash, a network cut)."""
    transport = conn._transport
    check(isinstance(transport, WebSocketTransport), "a WebSocket connection")
    transport.abort()


FAST = ReconnectPolicy(attempts=40, initial_delay=0.05, max_delay=0.25)


# ------------------------------------------------------------------------------------------
# resume


@scenario("resume: a dropped client resumes its session; its subscription loses and repeats nothing")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    dash = await client(ctx, "dash", reconnect=FAST)
    states: list[str] = []
    dash.on_state_change(states.append)
    sub = await dash.subscribe({"eventTypes": ["agent_state_changed"]}, window=4)
    a = await agent(ctx, "worker")
    for i in range(10):
        await a.update_state("busy" if i % 2 == 0 else "idle")
    first = await take(sub, 3, "three before the drop")
    session = dash.session_id
    drop(dash)
    for i in range(10, 16):
        await a.update_state("busy" if i % 2 == 0 else "idle")
    rest = await take(sub, 13, "the rest after the resume")
    ids = [e["id"] for e in first + rest]
    eq(len(set(ids)), 16, "no event twice")
    log = [e["eventId"] async for e in dash.replay_all(filter={"eventTypes": ["agent_state_changed"]})]
    eq(ids, log, "exactly the log, in order")
    eq(dash.session_id, session, "same session")
    eq(dash.reconnected, True, "resumed")
    check("reconnecting" in states and states[-1] == "connected", f"state changes {states}")


@scenario("resume: a dropped agent comes back with its id and gets what was queued for it")
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    w = await agent(ctx, "worker", reconnect=FAST)
    aid = w.agent_id
    obs = await client(ctx)
    sub = await obs.subscribe({"eventTypes": ["agent_orphaned", "agent_state_changed"]})
    drop(w)
    await next_event(sub, lambda e: e["type"] == "agent_orphaned", "orphaned")
    await until(lambda: w.is_connected, "reconnected")
    e = await next_event(sub, lambda e: e["type"] == "agent_state_changed", "reclaimed")
    eq((e["data"]["agentId"], e["data"]["previousState"]), (aid, "orphaned"), "the orphan reclaimed")
    eq(w.agent_id, aid, "same agent id")
    r = await obs.send(aid, {"after": "resume"})
    eq(r["delivered"], [aid], "delivered to the resumed agent")
    await inbox(w).wait(lambda m: m["id"] == r["messageId"], "message after resume")


@scenario("restart: a dashboard and an agent outlive a router restart (kill -9); no event lost or repeated", timeout=45)
async def _(ctx: Ctx) -> None:
    r1 = await ctx.start_router()
    dash = await client(ctx, "dash", reconnect=FAST)
    sub = await dash.subscribe({"eventTypes": ["agent_state_changed"]}, window=4)
    w = await agent(ctx, "survivor", reconnect=FAST)
    aid = w.agent_id
    team = await w.create_scope("team")
    await w.join_scope(team["id"])
    for i in range(8):
        await w.update_state("busy" if i % 2 == 0 else "idle")
    before = await take(sub, 2, "two before the restart")
    await r1.kill(signal.SIGKILL)
    r2 = await ctx.start_router(workdir=r1.workdir, listen=f"127.0.0.1:{r1.port}")
    eq(r2.url, r1.url, "same address")
    await until(lambda: w.is_connected and dash.is_connected, "both reconnected", timeout=10)
    eq(w.agent_id, aid, "the agent registered its id again")
    after = await w.update_state("busy")
    eq(after["id"], aid, "it works")
    rest = await take(sub, 7, "the six left and the new one")
    ids = [e["id"] for e in before + rest]
    eq(len(set(ids)), len(ids), "no event twice")
    log = [e["eventId"] async for e in dash.replay_all(filter={"eventTypes": ["agent_state_changed"]})]
    eq(ids, log, "exactly the log, in order, across both runs")
    states = [e["data"]["newState"] for e in before + rest]
    eq(states, ["busy", "idle"] * 4 + ["busy"], "every change, once, in order")
    c = await client(ctx, "after")
    reply_to: list[Message] = []
    w.on_message(reply_to.append)
    r = await c.send(aid, {"hello": "again"})
    eq(r["delivered"], [aid], "messages reach the agent on the new router")


# ------------------------------------------------------------------------------------------
# authentication


@scenario("auth: API key and JWT; missing or wrong credentials are AuthError; two principals do not see each other")
async def _(ctx: Ctx) -> None:
    await ctx.start_router(AUTH_CONFIG)
    err = await expect_code(ClientConnection.connect(ctx.url, reconnect=False), 1000, "no credentials")
    check(isinstance(err, AuthError), "AuthError")
    eq(err.data["authRequired"]["methods"], ["bearer", "api-key"], "authRequired says how")
    await expect_code(ClientConnection.connect(ctx.url, auth=Auth.api_key("ak-wrong-0123456789abcdef"), reconnect=False),
                      1001, "a wrong key")
    alice = await client(ctx, "alice-dash", auth=Auth.api_key(ALICE_KEY))
    eq(alice.connect_result.get("principal", {}).get("id"), "alice", "alice's principal")
    alice_sees = await alice.subscribe()
    alice_events: list[Any] = []

    async def collect() -> None:
        async for e in alice_sees:
            alice_events.append(e)

    collector = asyncio.get_running_loop().create_task(collect())
    ctx.defer(lambda: asyncio.sleep(0, collector.cancel()))
    alice_inbox = Inbox(alice)
    # Bob, with a JWT: a dashboard, and a private agent talking to its private child.
    bob_dash = await client(ctx, "bob-dash", auth={"method": "bearer", "token": jwt("bob")})
    eq(bob_dash.connect_result.get("principal", {}).get("id"), "bob", "bob's principal")
    bob_joins = await bob_dash.subscribe({"eventTypes": ["participant_connected"]})
    bob = await agent(ctx, "bob-secret", auth=Auth.bearer(jwt("bob")), visibility="parent-only")
    await next_event(bob_joins, lambda e: e["data"]["participantId"] == bob.participant_id,
                     "bob's dashboard sees bob's own participant")
    bob_sees = await bob.subscribe({"eventTypes": ["message_delivered"]})
    kid = (await bob.spawn(name="bob-kid", visibility="parent-only"))["agent"]
    r = await bob.send(kid["id"], {"secret": 42})
    eq(r["delivered"], [kid["id"]], "bob's agents talk")
    await inbox(bob).wait(lambda m: m["id"] == r["messageId"], "the child's message reaches its owner's connection")
    await next_event(bob_sees, lambda e: e["data"]["messageId"] == r["messageId"], "bob sees his own message's events")
    # Alice: an agent of her own, so she has events to see.
    mine = await agent(ctx, "alice-agent", auth=Auth.api_key(ALICE_KEY))
    await mine.busy()
    await until(lambda: any(e["type"] == "agent_state_changed" and e["data"]["agentId"] == mine.agent_id
                            for e in alice_events), "alice sees her own agent")
    await asyncio.sleep(QUIET)
    # ... and nothing of Bob's: no event naming his agents or his participants.
    bob_ids = {bob.agent_id, kid["id"], bob_dash.participant_id, bob.participant_id}
    leaked = [e for e in alice_events if any(i and i in json.dumps(e) for i in bob_ids)]
    eq(leaked, [], "events of bob's that alice saw")
    check(len(alice_events) >= 3, f"alice saw her own events: {[e['type'] for e in alice_events]}")
    listed = {a["id"] for a in (await alice.list_agents())["agents"]}
    check(not listed & bob_ids, f"alice lists none of bob's agents: {listed}")
    await expect_code(alice.get_agent(bob.agent_id), 2001, "bob's private agent does not exist for alice")
    replayed = [e async for e in alice.replay_all()]
    check(not any(i and i in json.dumps(replayed) for i in bob_ids), "nor in alice's replay")
    eq(alice_inbox.messages, [], "alice received no message")
    # Alice cannot take Bob's agent id.
    await expect_code(AgentConnection.connect(ctx.url, name="thief", agent_id=bob.agent_id,
                                              auth=Auth.api_key(ALICE_KEY), reconnect=False), 1003, "bob's id")
    sessions = await alice.list_sessions()
    check(all(s["id"] != bob_dash.session_id for s in sessions["sessions"]), "alice lists only her sessions")


# ------------------------------------------------------------------------------------------
# TLS

TLS_RECIPE = """set -e
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca-key.pem 2>/dev/null
openssl req -new -key ca-key.pem -subj "/CN=python suite CA" -out ca.csr
printf '%s\\n' 'basicConstraints = critical, CA:TRUE' 'keyUsage = critical, keyCertSign, cRLSign' \
  'subjectKeyIdentifier = hash' > ca.ext
openssl x509 -req -in ca.csr -signkey ca-key.pem -sha256 -days 2 -extfile ca.ext -out ca.pem 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server-key.pem 2>/dev/null
openssl req -new -key server-key.pem -subj "/CN=localhost" -out server.csr
printf '%s\\n' 'basicConstraints = critical, CA:FALSE' 'keyUsage = critical, digitalSignature' \
  'extendedKeyUsage = serverAuth' 'subjectAltName = DNS:localhost, IP:127.0.0.1' \
  'authorityKeyIdentifier = keyid' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -sha256 \
  -days 2 -extfile server.ext -out server.pem 2>/dev/null
"""


@scenario("tls: wss:// with the router's CA (ca_file), JWT auth over TLS; an untrusted certificate is refused")
async def _(ctx: Ctx) -> None:
    certs = tempfile.mkdtemp(dir=ctx.dir)
    done = subprocess.run(["sh", "-c", TLS_RECIPE], cwd=certs, capture_output=True, timeout=30)
    check(done.returncode == 0, f"openssl: {done.stderr.decode()[-300:]}")
    await ctx.start_router(AUTH_CONFIG, ["--tls-cert", f"{certs}/server.pem", "--tls-key", f"{certs}/server-key.pem"])
    check(ctx.url.startswith("wss://"), f"the router serves wss: {ctx.url}")
    ca = f"{certs}/ca.pem"
    a = await agent(ctx, "tls-agent", ca_file=ca, auth=Auth.bearer(jwt("tls-user")))

    @a.on_message
    async def answer(m: Message) -> None:
        await a.reply(m, {"over": "tls"})

    c = await client(ctx, "tls-client", ca_file=ca, auth=Auth.api_key(ALICE_KEY))
    r = await c.request(a.agent_id, {}, timeout=STEP)
    eq(r.get("payload"), {"over": "tls"}, "request/reply over wss")
    await expect_code_connection(ClientConnection.connect(ctx.url, auth=Auth.api_key(ALICE_KEY), reconnect=False),
                                 "a certificate the client does not trust")
    https = ctx.url.replace("wss://", "https://")
    c2 = await client(ctx, "https-url", ca_file=ca, auth=Auth.api_key(ALICE_KEY))
    check(c2.is_connected and https, "the https:// spelling works too")


async def expect_code_connection(aw: Any, what: str) -> None:
    try:
        conn = await bounded(aw, what)
    except MapConnectionError as e:
        check("certificate" in str(e).lower() or "ssl" in str(e).lower(), f"{what}: says why ({e})")
        return
    await conn.abort()
    raise AssertionError(f"{what}: connected")


# ------------------------------------------------------------------------------------------
# stdio: Python agents spawned by the router

STDIO_AGENT = ROOT / "examples" / "python" / "echo_agent.py"


@scenario("stdio: the router spawns a Python agent (stdio:), messages flow both ways, stop ends it", timeout=40)
async def _(ctx: Ctx) -> None:
    await ctx.start_router()
    boss = await agent(ctx, "boss", role="lead")
    obs = await client(ctx)
    sub = await obs.subscribe({"eventTypes": ["agent_state_changed"]})
    spawned = await boss.spawn(
        name="py-child", role="echo",
        command={"program": VENV_PY, "args": [str(STDIO_AGENT), "stdio:"], "env": {"PYTHONPATH": PY_SRC}},
        timeout=20)
    child = spawned["agent"]
    check(spawned.get("process", {}).get("pid"), "a process")
    eq(child["parent"], boss.agent_id, "parent")
    c = await client(ctx, "asker")
    r = await c.request(child["id"], {"q": "ping?"}, timeout=STEP)
    eq(r.get("payload"), {"echo": {"q": "ping?"}, "by": "py-child"}, "the child answers")
    # The child asks back through the router: its stray print went to stderr, not the protocol.
    got = await boss.request(child["id"], {"q": "again"}, timeout=STEP)
    eq(got["from"], child["id"], "from the child")
    await obs.stop_agent(child["id"], reason="done")
    e = await next_event(sub, lambda e: e["data"]["agentId"] == child["id"] and e["data"]["newState"] == "stopped",
                         "stopped", )
    check(e["data"].get("exitCode") in (0, None), f"a clean exit: {e['data']}")


# ------------------------------------------------------------------------------------------
# the package itself


@scenario("wheel: builds (py3-none-any), installs into a fresh venv alone, imports, runs a spawned stdio agent", timeout=120)
async def _(ctx: Ctx) -> None:
    dist = Path(tempfile.mkdtemp(dir=ctx.dir))
    built = await run([VENV_PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                       "-w", str(dist), str(ROOT / "python")], "pip wheel", 90)
    wheels = list(dist.glob("*.whl"))
    eq(len(wheels), 1, f"one wheel: {built[-300:]}")
    wheel = wheels[0]
    check(wheel.name.endswith("-py3-none-any.whl"), f"pure Python: {wheel.name}")
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    check("map_client/py.typed" in names, "py.typed is in the wheel")
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    eq([r.split(";")[0].strip() for r in requires], ["Requires-Dist: websockets>=13"], "depends on websockets only")
    venv = Path(ctx.dir) / "fresh"
    await run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "venv", 60)
    # pip of the suite's venv installs into the fresh one: nothing from an index, no dependency.
    await run([VENV_PY, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index",
               "--quiet", str(wheel)], "pip install", 60)
    out = await run([str(venv / "bin" / "python"), "-I", "-c",
                     "import map_client, sys; print(map_client.__version__, map_client.__file__);"
                     "print(sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names))"],
                    "import", 30)
    check(str(venv) in out, f"imported from the fresh venv: {out}")
    check("websockets" not in out, "importing needs no websockets")
    # A stdio agent needs nothing else: the router spawns it with the fresh venv's python.
    await ctx.start_router()
    boss = await agent(ctx, "boss")
    spawned = await boss.spawn(name="from-wheel", command={"program": str(venv / "bin" / "python"),
                                                           "args": ["-I", str(STDIO_AGENT), "stdio:"]}, timeout=20)
    c = await client(ctx)
    r = await c.request(spawned["agent"]["id"], "hi", timeout=STEP)
    eq(r.get("payload"), {"echo": "hi", "by": "from-wheel"}, "the wheel's agent answers")


@scenario("types: mypy --strict passes on python/ and examples/python/", timeout=180)
async def _(ctx: Ctx) -> None:
    cache = ROOT / "tests" / "python" / ".venv" / "mypy-cache"
    mypy = Path(sys.executable).parent / "mypy"
    out = await run([str(mypy), "--strict", "--cache-dir", str(cache), "--python-version", "3.10",
                     str(ROOT / "python" / "src"), str(ROOT / "examples" / "python")], "mypy", 170)
    check("Success" in out, out[-500:])


@scenario("types: the TypedDicts match upstream's JSON Schema (a schema change fails here)")
async def _(ctx: Ctx) -> None:
    schema = json.loads((ROOT / "tests" / "interop" / "schema" / "core" / "schema.json").read_text())
    defs = schema["$defs"]
    # Keys we type that the schema lacks, each with its reason (docs/compatibility.md).
    extra: dict[str, set[str]] = {
        # The SDK's Agent type: ownerId (null while orphaned), children (get with include),
        # permissionOverrides (permissions.md).
        "Agent": {"ownerId", "children", "permissionOverrides"},
        "Scope": set(),
        # The SDK's Message type has a timestamp; the schema's does not.
        "Message": {"timestamp"},
        # `protocol` rides ACP over MAP (acp-tunnel; the SDK sets it).
        "MessageMeta": {"protocol"},
        "Event": set(),
        # SDK filter fields the schema lacks, and the router's extension families.
        "SubscriptionFilter": {"fromAgents", "fromRoles", "correlationIds", "metadataMatch", "trajectory", "tasks"},
    }
    for name, ours_extra in extra.items():
        td = getattr(wire_types, name)
        ours = set(td.__required_keys__) | set(td.__optional_keys__)
        theirs = set(defs[name].get("properties", {}))
        eq(sorted(theirs - ours), [], f"{name}: schema fields the client does not type")
        eq(sorted(ours - theirs - ours_extra), [], f"{name}: typed fields the schema lacks (unexplained)")
        required = set(defs[name].get("required", []))
        eq(sorted(required - ours), [], f"{name}: required fields missing")
    errdata = set(defs["MAPErrorData"]["properties"])
    eq(sorted(errdata - {"_meta", "category", "details", "retryable", "retryAfterMs"}), [], "MAPErrorData fields read")
    cats = set(defs["ErrorCategory"]["enum"]) if "ErrorCategory" in defs else set()
    from map_client.errors import _BY_CATEGORY

    eq(sorted(cats - set(_BY_CATEGORY)), [], "every error category has its MapError subclass")
    check(typing.get_type_hints(wire_types.Message), "types resolve")


async def run(argv: list[str], what: str, timeout: float) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        raise AssertionError(f"{what} took over {timeout} s") from None
    text = out.decode(errors="replace")
    check(proc.returncode == 0, f"{what} exited {proc.returncode}: {text[-800:]}")
    return text

