"""An AIP tool: `add` (a + b), served over gRPC and registered with the map-router AIP gateway.
MAP agents and AIP agents call it through the router (docs/aip.md).

    python tool.py --gateway 127.0.0.1:50050 --id add [--key KEY]

Prints `ready <id> <address>` once registered; deregisters on SIGINT/SIGTERM.
"""

import asyncio

from aip_node import Node, arguments, load_stubs, until_stopped

args = arguments(__doc__).parse_args()
pb, pbg = load_stubs(args.stubs)


class Adder(pbg.ToolServiceServicer):
    async def CallTool(self, request, context):
        answer = dict(sender_id=args.id, receiver_id=request.sender_id, session_id=request.session_id)
        try:
            if request.tool_name != "add":
                raise ValueError(f"unknown tool {request.tool_name!r}")
            total = int(request.arguments["a"]) + int(request.arguments["b"])
        except (KeyError, ValueError) as e:
            return pb.ToolResponse(**answer, is_error=True, error_message=f"Error executing tool: {e}")
        return pb.ToolResponse(**answer, is_error=False, error_message="No Error",
                               content=[pb.ContentItem(text=str(total))])


async def main():
    node = Node(args, pbg, pbg.add_ToolServiceServicer_to_server, Adder())

    async def register(gateway, address, metadata):
        info = pb.ToolInfo(tool_id=args.id, address=address, name="add", domain=args.domain,
                           description="Adds two numbers.", arguments={"a": "int", "b": "int"},
                           input_mode=[pb.TEXT], output_mode=[pb.TEXT], version="1.0.0")
        await gateway.RegisterTool(info, timeout=10, metadata=metadata)

    await node.start(register)
    print(f"ready {args.id} {node.address}", flush=True)
    await until_stopped()
    await node.stop()


asyncio.run(main())
