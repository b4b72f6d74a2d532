"""`phoenix serve`, with its OTLP/gRPC listener bound to PHOENIX_HOST like its HTTP one.

Arize Phoenix (pinned in requirements.txt) binds the HTTP server (UI, REST API, OTLP/HTTP) to
PHOENIX_HOST but always binds the OTLP/gRPC server to "[::]", every interface, with no setting
to change it. The tests keep everything on 127.0.0.1, so this wrapper rewrites that one address
before grpc binds it, then runs Phoenix's own entry point (the `phoenix` console script) with
the arguments it was given:

    .venv/bin/python serve.py serve
"""

import os
import re
import sys

import grpc.aio._server as _grpc_server

_HOST = os.environ.get("PHOENIX_HOST", "127.0.0.1")


def _loopback(address):
    if address.startswith("[::]:"):
        return f"{_HOST}:{address[len('[::]:'):]}"
    return address


_insecure = _grpc_server.Server.add_insecure_port
_secure = _grpc_server.Server.add_secure_port
_grpc_server.Server.add_insecure_port = lambda self, address: _insecure(self, _loopback(address))
_grpc_server.Server.add_secure_port = lambda self, address, credentials: _secure(
    self, _loopback(address), credentials
)

from phoenix.server.main import main  # noqa: E402  (after the patch above)

if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\.pyw|\.exe)?$", "", sys.argv[0])
    sys.exit(main())
