"""CI for examples/aip-python/ (issue 44): the example tool and agents, run as a user runs them,
against the built map-router binary with [auth] on.

    python tests/aip_py/example.py --bin target/debug/map-router --stubs DIR

1. the router starts with `--aip-listen` and an API key for `alice`;
2. `tool.py --id add` and `agent.py --id helper` (serving) start and register with alice's key;
3. `agent.py --id asker --call add --talk-to helper` lists its peers, calls the tool
   (`add(1, 2) = 3`) and holds a three-quest session with `helper`, then deregisters;
4. MAP (POST /map/rpc as alice) lists `add` (role tool) and `helper` (role agent), not `asker`;
5. SIGTERM: the tool and `helper` deregister and exit 0; MAP no longer lists them.

Prints `ok - name` per step and exits 0, or raises at the first failure. Every wait is bounded.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "aip-python")
KEY = "key-alice-0123456789"
WAIT_S = 20

parser = argparse.ArgumentParser()
parser.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "map-router"))
parser.add_argument("--stubs", required=True)
ARGS = parser.parse_args()


def lines_of(proc, into, done):
    for line in proc.stdout:
        into.append(line.rstrip("\n"))
    done.set()


class Proc:
    """A child whose stdout lines are collected as they come."""

    def __init__(self, argv, stdout=subprocess.PIPE, stderr=None):
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, text=True)
        self.lines = []
        self.ended = threading.Event()
        if stdout == subprocess.PIPE:
            threading.Thread(target=lines_of, args=(self.proc, self.lines, self.ended), daemon=True).start()

    def wait_line(self, pattern):
        import time
        deadline = time.time() + WAIT_S
        while time.time() < deadline:
            for line in self.lines:
                if re.match(pattern, line):
                    return line
            if self.ended.is_set():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line {pattern!r} from {self.proc.args}: {self.lines}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(WAIT_S)


def example(script, *argv):
    return Proc([sys.executable, os.path.join(EXAMPLE, script), "--gateway", GATEWAY, "--key", KEY,
                 "--stubs", ARGS.stubs, *argv])


def map_agents():
    """`map/agents/list` as alice over POST /map/rpc: id -> role."""
    def post(body, session=None):
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        if session:
            headers["MAP-Session"] = session
        req = urllib.request.Request(BASE + "/map/rpc", json.dumps(body).encode(), headers)
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return json.loads(r.read()), r.headers.get("map-session")
    _, session = post({"jsonrpc": "2.0", "id": 1, "method": "map/connect",
                       "params": {"participantType": "client", "name": "example-check",
                                  "auth": {"method": "api-key", "credential": KEY}}})
    answer, _ = post({"jsonrpc": "2.0", "id": 2, "method": "map/agents/list", "params": {}}, session)
    return {a["id"]: a.get("role") for a in answer["result"]["agents"]}


tmp = tempfile.mkdtemp(prefix="map-router-aip-example-")
procs = []
try:
    with open(os.path.join(tmp, "api-keys"), "w") as f:
        f.write(f"{KEY} alice\n")
    with open(os.path.join(tmp, "router.toml"), "w") as f:
        f.write(f'[auth]\n[auth.api_keys]\nfile = "{tmp}/api-keys"\n')
    router = subprocess.Popen(
        [ARGS.bin, "--listen", "127.0.0.1:0", "--aip-listen", "127.0.0.1:0", "--data-dir",
         os.path.join(tmp, "data"), "--config", os.path.join(tmp, "router.toml")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs.append(router)
    url = gateway = None
    while url is None or gateway is None:
        line = router.stderr.readline()
        if not line:
            raise AssertionError("the router exited before listening")
        m = re.match(r"map-router listening on (wss?://\S+)/", line)
        url = m.group(1) if m else url
        m = re.match(r"map-router AIP gateway listening on (\S+)", line)
        gateway = m.group(1) if m else gateway
    threading.Thread(target=lambda: [None for _ in router.stderr], daemon=True).start()
    GATEWAY, BASE = gateway, url.replace("ws", "http", 1)

    tool = example("tool.py", "--id", "add")
    helper = example("agent.py", "--id", "helper")
    procs += [tool.proc, helper.proc]
    tool.wait_line(r"ready add 127\.0\.0\.1:\d+$")
    helper.wait_line(r"ready helper 127\.0\.0\.1:\d+$")
    print("ok - tool.py and agent.py registered", flush=True)

    asker = example("agent.py", "--id", "asker", "--call", "add", "--talk-to", "helper")
    procs.append(asker.proc)
    assert asker.proc.wait(WAIT_S) == 0, asker.lines
    asker.ended.wait(WAIT_S)
    out = asker.lines
    assert "peers add asker helper" in out, out
    assert "tool add add(1, 2) = 3 is_error=False" in out, out
    answers = [l for l in out if l.startswith("answer ")]
    assert answers == ["answer HOLD_RESPONSE helper: helper heard: hello",
                       "answer HOLD_RESPONSE helper: helper heard: how are you?",
                       "answer STOP_RESPONSE helper: helper heard: bye"], out
    print("ok - agent.py called the tool and held a session with helper", flush=True)

    agents = map_agents()
    assert agents.get("add") == "tool" and agents.get("helper") == "agent", agents
    assert "asker" not in agents, f"asker deregistered as it exited: {agents}"
    print("ok - MAP lists the example nodes as agents", flush=True)

    assert tool.stop() == 0 and helper.stop() == 0, (tool.lines, helper.lines)
    agents = map_agents()
    assert "add" not in agents and "helper" not in agents, agents
    print("ok - the nodes deregistered on SIGTERM", flush=True)
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(WAIT_S)
    shutil.rmtree(tmp, ignore_errors=True)
print("examples/aip-python: 4 passed", flush=True)
