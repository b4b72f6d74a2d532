"""An AIP agent, served over gRPC and registered with the map-router AIP gateway. It answers
every quest of a session with `<id> heard: <text>` (STOP_QUEST with STOP_RESPONSE), so MAP
agents and other AIP agents can talk to it through the router (docs/aip.md).

    python agent.py --gateway 127.0.0.1:50050 --id helper [--key KEY]
    python agent.py --gateway 127.0.0.1:50050 --id asker --call add --talk-to helper

With --call TOOL it lists its peers (GetNodes) and calls the tool (`add`, a=1, b=2); with
--talk-to AGENT it opens a session with that agent (START_QUEST, HOLD_QUEST, STOP_QUEST) and
prints each answer. Then it deregisters and exits, unless --serve keeps it running.
Prints `ready <id> <address>` once registered, and one line per result.
"""

import asyncio
import uuid

from aip_node import Node, arguments, load_stubs, texts, until_stopped

parser = arguments(__doc__)
parser.add_argument("--call", help="a tool to call with a=1, b=2 (RouteToolCalling)")
parser.add_argument("--talk-to", help="an agent to open a session with (RouteAgentCalling)")
parser.add_argument("--serve", action="store_true", help="keep serving after --call/--talk-to")
args = parser.parse_args()
pb, pbg = load_stubs(args.stubs)
AM = pb.AgentMessage


class Echo(pbg.AgentServiceServicer):
    """One CallAgent stream per session: an answer per quest, STOP_RESPONSE ends it."""

    async def CallAgent(self, request_iterator, context):
        async for quest in request_iterator:
            stop = quest.session_status == AM.STOP_QUEST
            yield AM(sender_id=args.id, receiver_id=quest.sender_id, session_id=quest.session_id,
                     session_status=AM.STOP_RESPONSE if stop else AM.HOLD_RESPONSE,
                     message_id=f"msg_{uuid.uuid4().hex[:8]}", reply_to_message_id=quest.message_id,
                     content=[pb.ContentItem(text=f"{args.id} heard: {texts(quest.content)}")])
            if stop:
                return


async def talk(node, receiver):
    """A session with `receiver`: its quests, then every answer up to STOP_RESPONSE."""
    session = f"session_{uuid.uuid4().hex[:12]}"
    said = [(AM.START_QUEST, "hello"), (AM.HOLD_QUEST, "how are you?"), (AM.STOP_QUEST, "bye")]

    async def quests():
        for status, text in said:
            yield AM(sender_id=args.id, receiver_id=receiver, session_id=session, session_status=status,
                     message_id=f"msg_{uuid.uuid4().hex[:8]}", content=[pb.ContentItem(text=text)])

    call = node.gateway.RouteAgentCalling(quests(), timeout=30, metadata=node.metadata)
    async for answer in call:
        print(f"answer {AM.SessionStatus.Name(answer.session_status)} {answer.sender_id}: "
              f"{texts(answer.content)}", flush=True)


async def main():
    node = Node(args, pbg, pbg.add_AgentServiceServicer_to_server, Echo())

    async def register(gateway, address, metadata):
        info = pb.AgentInfo(agent_id=args.id, address=address, name=args.id, domain=args.domain,
                            description="answers what it hears", version="1.0.0",
                            input_mode=[pb.TEXT], output_mode=[pb.TEXT],
                            skills=[pb.AgentInfo.AgentSkill(skill_id="echo", capability="repeats a quest")])
        r = await gateway.RegisterAgent(info, timeout=10, metadata=metadata)
        assert r.success

    await node.start(register)
    print(f"ready {args.id} {node.address}", flush=True)
    try:
        if args.call:
            peers = await node.gateway.GetNodes(pb.GetNodesRequest(agent_id=args.id, domain=args.domain),
                                                timeout=10, metadata=node.metadata)
            ids = sorted(p.agent_info.agent_id or p.tool_info.tool_id for p in peers.peers)
            print(f"peers {' '.join(ids)}", flush=True)
            r = await node.gateway.RouteToolCalling(
                pb.ToolRequest(sender_id=args.id, receiver_id=args.call, session_id=f"tool_{uuid.uuid4().hex[:8]}",
                               tool_name="add", arguments={"a": "1", "b": "2"}),
                timeout=30, metadata=node.metadata)
            print(f"tool {args.call} add(1, 2) = {texts(r.content)} is_error={r.is_error}", flush=True)
        if args.talk_to:
            await talk(node, args.talk_to)
        if args.serve or not (args.call or args.talk_to):
            await until_stopped()
    finally:
        await node.stop()


asyncio.run(main())
