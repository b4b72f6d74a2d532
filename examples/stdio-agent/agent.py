#!/usr/bin/env python3
"""A complete MAP agent over stdio, with nothing but the Python standard library.

Run it under the router:  map-router spawn --name echo -- python3 agent.py
or bridge it to a router: map-router agent --name echo -- python3 agent.py

It speaks MAP as NDJSON (one JSON-RPC message per line) on stdin/stdout: it connects,
registers, answers every message with a reply that carries the request's correlation id,
exits 0 on the router's stop control message, and exits when stdin closes. Logs go to stderr:
stdout carries only MAP.
"""
import json
import os
import sys

next_id = 0


def send(method, params=None, notify=False):
    """Writes one JSON-RPC request (or notification) as one line on stdout."""
    global next_id
    frame = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        frame["params"] = params
    if not notify:
        next_id += 1
        frame["id"] = next_id
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


def log(text):
    print(f"agent.py: {text}", file=sys.stderr, flush=True)


name = os.environ.get("MAP_AGENT_NAME", "py-echo")
# No participantType: over a supervised pipe (or `map-router agent`) it defaults to "agent".
send("map/connect", {"protocolVersion": 1, "name": name})
send("map/agents/register", {"name": name, "role": "echo"})

for line in sys.stdin:  # EOF: the router is going away
    if not line.strip():
        continue
    frame = json.loads(line)
    if "error" in frame:  # an answer to one of our requests that failed
        log(f"request {frame.get('id')} failed: {frame['error']}")
        if frame.get("id") in (1, 2):  # could not connect or register: nothing to do here
            sys.exit(1)
        continue
    if frame.get("method") != "map/message":
        continue  # answers to our requests, and events if we subscribed
    message = frame["params"]["message"]
    payload = message.get("payload")
    meta = message.get("meta") or {}
    if message["from"] == "system":  # the router: control messages and injected content
        if isinstance(payload, dict) and payload.get("control") == "stop":
            log("stop requested; exiting")
            sys.exit(0)
        log(f"from the router: {json.dumps(payload)}")  # suspend, resume, steering
        continue
    if meta.get("isResult"):
        continue  # a reply to something we asked; this agent asks nothing
    send("map/send", {
        "to": {"agent": message["from"]},
        "payload": {"echo": payload, "by": name},
        "meta": {"correlationId": meta.get("correlationId", message["id"]), "isResult": True},
    })
log("stdin closed; exiting")
