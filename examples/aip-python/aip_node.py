"""What an AIP node needs from the gateway, in plain grpcio: the generated stubs, a channel to
the gateway with the caller's credential, its own gRPC server (the gateway dials it back),
registration, heartbeats and deregistration. tool.py and agent.py build on it.

The stubs are generated from the router's schema (src/gateway/aip/proto/schema.proto) by
grpcio-tools, into a directory named by --stubs (README.md shows the command).
"""

import argparse
import asyncio
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def arguments(description):
    """The command line every example node takes; the stubs are imported from --stubs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--gateway", default="127.0.0.1:50050", help="the router's [aip] listen address")
    p.add_argument("--listen", default="127.0.0.1:0", help="this node's own gRPC server (dialled back)")
    p.add_argument("--id", required=True, help="the node's id (its MAP agent id)")
    p.add_argument("--domain", default="math", help="its domain: MAP scope aip:<domain>")
    p.add_argument("--key", default=os.environ.get("MAP_ROUTER_KEY"),
                   help="an API key or JWT when the router has [auth] on (or MAP_ROUTER_KEY)")
    p.add_argument("--stubs", default=os.path.join(HERE, "stubs"), help="where schema_pb2*.py are")
    p.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    return p


def load_stubs(path):
    sys.path.insert(0, path)
    import schema_pb2
    import schema_pb2_grpc
    return schema_pb2, schema_pb2_grpc


class Node:
    """One AIP node: `servicer` served on `listen`, registered at `gateway` as `info(address)`."""

    def __init__(self, args, pbg, add_servicer, servicer):
        import grpc
        self.grpc = grpc
        self.args = args
        self.id = args.id
        self.metadata = (("authorization", f"Bearer {args.key}"),) if args.key else None
        self.server = grpc.aio.server()
        add_servicer(servicer, self.server)
        host = args.listen.rsplit(":", 1)[0]
        port = self.server.add_insecure_port(args.listen)
        self.address = f"{host}:{port}"
        self.channel = grpc.aio.insecure_channel(args.gateway)
        self.gateway = pbg.GatewayServiceStub(self.channel)

    async def start(self, register):
        """Serves first (the gateway dials back during the registration), then registers."""
        await self.server.start()
        await register(self.gateway, self.address, self.metadata)
        self.beats = asyncio.create_task(self._beat())

    async def _beat(self):
        pb = sys.modules["schema_pb2"]
        while True:
            await asyncio.sleep(self.args.heartbeat)
            try:
                r = await self.gateway.Heartbeat(pb.HeartbeatRequest(sender_id=self.id), timeout=10,
                                                 metadata=self.metadata)
                if not r.success:  # the router restarted: register again
                    print(f"{self.id}: {r.message}", flush=True)
            except self.grpc.aio.AioRpcError as e:
                print(f"{self.id}: heartbeat failed: {e.code().name}", flush=True)

    async def stop(self):
        """Deregisters (its MAP agent is gone), then stops serving."""
        pb = sys.modules["schema_pb2"]
        self.beats.cancel()
        try:
            await self.gateway.DeregisterNode(pb.DeregisterNodeRequest(node_id=self.id), timeout=10,
                                              metadata=self.metadata)
        finally:
            await self.channel.close()
            await self.server.stop(1)


async def until_stopped():
    """Waits for SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()


def texts(content):
    return " ".join(c.text for c in content if c.WhichOneof("data") == "text")
