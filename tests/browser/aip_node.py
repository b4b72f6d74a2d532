"""One AIP node for the browser suite's AIP scenario (tests/browser/views/aip.mjs): a real gRPC
server on loopback (upstream's AgentService or ToolService, behaving as tests/aip_py/acceptance.py's
nodes do), registered with the router's AIP gateway, sending heartbeats until it is killed.

    python aip_node.py --stubs DIR --gateway HOST:PORT --key KEY --kind agent|tool --id ID
                       --name NAME --domain DOMAIN [--skills id:capability,...]
                       [--arguments name:type,...] [--heartbeat SECONDS]

The stubs are generated from src/gateway/aip/proto/schema.proto by grpcio-tools (the scenario
does it with tests/aip_py/.venv, which scripts/setup.sh installs). Prints `ready <id>` once
registered; then reads commands from stdin, one JSON object a line, and answers each with one
line:
  {"session": RECEIVER, "quests": [TEXT, ...]}  an agent session through RouteAgentCalling, one
      quest at a time (START_QUEST, HOLD_QUEST..., STOP_QUEST), each answer awaited before the
      next quest is written: `answers <JSON list of the answers' texts>`;
  {"tool": TOOL_ID, "name": NAME, "arguments": {...}}  RouteToolCalling:
      `result <JSON {isError, text}>`.
A failure is `error <message>`. Every call has a deadline; the process exits when stdin closes.
"""

import argparse
import asyncio
import json
import sys
import uuid

parser = argparse.ArgumentParser()
parser.add_argument("--stubs", required=True)
parser.add_argument("--gateway", required=True)
parser.add_argument("--key", default="")
parser.add_argument("--kind", choices=["agent", "tool"], required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--name", required=True)
parser.add_argument("--domain", default="lab")
parser.add_argument("--skills", default="")
parser.add_argument("--arguments", default="")
parser.add_argument("--heartbeat", type=float, default=0.5)
ARGS = parser.parse_args()
sys.path.insert(0, ARGS.stubs)

import grpc  # noqa: E402
import schema_pb2 as pb  # noqa: E402
import schema_pb2_grpc as pbg  # noqa: E402

AM = pb.AgentMessage
WAIT_S = 10.0
METADATA = (("authorization", f"Bearer {ARGS.key}"),) if ARGS.key else None


def texts(content):
    return " ".join(c.text for c in content if c.WhichOneof("data") == "text")


def pairs(spec):
    return [tuple(p.split(":", 1)) for p in spec.split(",") if p]


class Agent(pbg.AgentServiceServicer):
    """upstream's AgentServer.CallAgent: answers every quest with `<name> heard: <text>`."""

    async def CallAgent(self, request_iterator, context):
        async for req in request_iterator:
            stop = req.session_status == AM.STOP_QUEST
            yield AM(sender_id=ARGS.id, receiver_id=req.sender_id, session_id=req.session_id,
                     session_status=AM.STOP_RESPONSE if stop else AM.HOLD_RESPONSE,
                     message_id=f"msg_{uuid.uuid4().hex[:8]}",
                     content=[pb.ContentItem(text=f"{ARGS.name} heard: {texts(req.content)}")])
            if stop:
                return


class Tool(pbg.ToolServiceServicer):
    """upstream's ToolServer with a function tool: `add`, anything else raises."""

    async def CallTool(self, request, context):
        args = dict(request.arguments)
        try:
            if request.tool_name != "add":
                raise ValueError(f"no tool {request.tool_name}")
            result = str(int(args["a"]) + int(args["b"]))
        except Exception as e:  # noqa: BLE001 - upstream's rule
            return pb.ToolResponse(sender_id=ARGS.id, receiver_id=request.sender_id,
                                   session_id=request.session_id, is_error=True,
                                   error_message=f"Error executing tool: {e}")
        return pb.ToolResponse(sender_id=ARGS.id, receiver_id=request.sender_id,
                               session_id=request.session_id, error_message="No Error",
                               content=[pb.ContentItem(text=result)])


async def session(stub, receiver, quests):
    sid = f"agent_session_{uuid.uuid4()}"
    call = stub.RouteAgentCalling(timeout=WAIT_S, metadata=METADATA)
    answers = []
    for i, text in enumerate(quests):
        status = AM.START_QUEST if i == 0 else (AM.STOP_QUEST if i == len(quests) - 1 else AM.HOLD_QUEST)
        await call.write(AM(sender_id=ARGS.id, receiver_id=receiver, session_id=sid, session_status=status,
                            message_id=f"msg_{uuid.uuid4().hex[:8]}", content=[pb.ContentItem(text=text)]))
        answer = await call.read()
        if answer == grpc.aio.EOF:
            raise RuntimeError("the session ended before its answer")
        answers.append(texts(answer.content))
    await call.done_writing()
    return answers


async def commands(stub):
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        try:
            cmd = json.loads(line)
            if "session" in cmd:
                out = f"answers {json.dumps(await session(stub, cmd['session'], cmd['quests']))}"
            else:
                r = await stub.RouteToolCalling(
                    pb.ToolRequest(sender_id=ARGS.id, receiver_id=cmd["tool"], session_id=f"tool_session_{uuid.uuid4()}",
                                   tool_name=cmd["name"], arguments={k: str(v) for k, v in cmd["arguments"].items()}),
                    timeout=WAIT_S, metadata=METADATA)
                out = f"result {json.dumps({'isError': r.is_error, 'text': texts(r.content) or r.error_message})}"
        except Exception as e:  # noqa: BLE001 - reported to the scenario, which fails on it
            out = f"error {type(e).__name__}: {e}".replace("\n", " ")
        print(out, flush=True)


async def main():
    server = grpc.aio.server()
    if ARGS.kind == "agent":
        pbg.add_AgentServiceServicer_to_server(Agent(), server)
    else:
        pbg.add_ToolServiceServicer_to_server(Tool(), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    stub = pbg.GatewayServiceStub(grpc.aio.insecure_channel(ARGS.gateway))
    if ARGS.kind == "agent":
        info = pb.AgentInfo(agent_id=ARGS.id, address=address, name=ARGS.name, domain=ARGS.domain,
                            input_mode=[pb.TEXT], output_mode=[pb.TEXT], description=f"{ARGS.name}, an echo",
                            version="1.0.0",
                            skills=[pb.AgentInfo.AgentSkill(skill_id=s, capability=c) for s, c in pairs(ARGS.skills)])
        r = await stub.RegisterAgent(info, timeout=WAIT_S, metadata=METADATA)
    else:
        info = pb.ToolInfo(tool_id=ARGS.id, address=address, name=ARGS.name, domain=ARGS.domain,
                           input_mode=[pb.TEXT], output_mode=[pb.TEXT], description=f"{ARGS.name}, a function tool",
                           arguments=dict(pairs(ARGS.arguments)), version="1.0.0")
        r = await stub.RegisterTool(info, timeout=WAIT_S, metadata=METADATA)
    if not r.success:
        raise SystemExit(f"registration of {ARGS.id} refused")

    async def beat():
        while True:
            await asyncio.sleep(ARGS.heartbeat)
            try:
                await stub.Heartbeat(pb.HeartbeatRequest(sender_id=ARGS.id), timeout=WAIT_S, metadata=METADATA)
            except grpc.aio.AioRpcError:
                pass  # logged and ignored upstream
    beats = asyncio.create_task(beat())
    print(f"ready {ARGS.id}", flush=True)
    await commands(stub)
    beats.cancel()
    await server.stop(0)


asyncio.run(main())
