#!/usr/bin/env python3
"""A minimal OTLP/HTTP sink for benchmarks (scripts/bench-traces.sh): answers every POST with
200 and an empty ExportTraceServiceResponse, counts requests and bytes, prints the counts when
stopped. Binds 127.0.0.1 only. Usage: otlp-sink.py PORT_FILE"""
import http.server
import signal
import sys

requests = 0
received = 0


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global requests, received
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        requests += 1
        received += n
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
with open(sys.argv[1], "w") as f:
    f.write(str(server.server_address[1]))


def stop(*_):
    print(f'{{"sink_requests": {requests}, "sink_bytes": {received}}}', file=sys.stderr)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
server.serve_forever()
