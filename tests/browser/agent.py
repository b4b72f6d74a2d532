#!/usr/bin/env python3
"""A supervised stdio agent for the dashboard's browser tests (Python standard library only).

    agent.py STATE IN OUT COST [CHILD_ID CHILD_ROLE CHILD_STATE CHILD_IN CHILD_OUT CHILD_COST]...

It connects and registers over stdin/stdout like examples/stdio-agent/agent.py, sets its state
to STATE and reports usage under the documented convention (`metadata.usage {inputTokens,
outputTokens, costUsd}`, docs/dashboard.md), records two trajectory checkpoints, spawns each CHILD as a supervised process running this
same script (the lead first creates a scope `team` for itself and its children), writes a line to stderr for every message it gets, and exits 0 on the router's
stop control message or when stdin closes.
"""
import json
import os
import sys

next_id = 0


def send(method, params):
    global next_id
    next_id += 1
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}) + "\n")
    sys.stdout.flush()


def log(text):
    print(f"{name}: {text}", file=sys.stderr, flush=True)


state, tokens_in, tokens_out, cost = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
children = sys.argv[5:]
agent_id = os.environ["MAP_AGENT_ID"]
name = os.environ.get("MAP_AGENT_NAME", agent_id)
usage = {"inputTokens": tokens_in, "outputTokens": tokens_out, "costUsd": cost}

# The session's own name is not the agent's: `participant_connected` goes out before the agent
# registers, to everyone, so it must not name an agent the exposure rules hide (docs/security.md).
send("map/connect", {"protocolVersion": 1, "name": "agent.py"})
send("map/agents/register", {"name": name})
send("map/agents/update", {"agentId": agent_id, "state": state, "metadata": {"usage": usage, "suite": "browser"}})
for i, label in enumerate(["started", "planned"], start=1):
    send("trajectory/checkpoint", {"checkpoint": {
        "id": f"{agent_id}-cp-{i}", "agentId": agent_id, "label": label,
        "metadata": {"usage": {"inputTokens": tokens_in // 2, "outputTokens": tokens_out // 2, "costUsd": cost / 2}},
    }})
if children:  # a lead: its team is a scope it and its children are members of
    send("map/scopes/create", {"scopeId": "team", "name": "team", "sendPolicy": "any"})
    send("map/scopes/join", {"scopeId": "team", "agentId": agent_id})
for i in range(0, len(children), 6):
    child_id, role, child_state, c_in, c_out, c_cost = children[i:i + 6]
    send("map/agents/spawn", {
        "agentId": child_id, "name": child_id, "role": role, "scopes": ["team"],
        "command": {"program": sys.executable, "args": [os.path.abspath(__file__), child_state, c_in, c_out, c_cost]},
    })
log(f"ready (pid {os.getpid()}, state {state})")

for line in sys.stdin:
    if not line.strip():
        continue
    frame = json.loads(line)
    if "error" in frame:
        log(f"request {frame.get('id')} failed: {frame['error'].get('code')} {frame['error'].get('message')}")
        continue
    if frame.get("method") != "map/message":
        continue
    message = frame["params"]["message"]
    payload = message.get("payload")
    if message.get("from") == "system" and isinstance(payload, dict) and payload.get("control") == "stop":
        log("stop requested; exiting")
        sys.exit(0)
    log(f"got {json.dumps(payload)[:200]}")
log("stdin closed; exiting")
