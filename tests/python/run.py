#!/usr/bin/env python3
"""The Python MAP client (python/, import `map_client`) against the built map-router binary.

    python tests/python/run.py --bin target/debug/map-router [--filter SUBSTRING] [--list]

The scenarios a Python user meets, mirroring tests/interop/run.mjs (where the TypeScript SDK
drives the router): connect, agents, scopes, every address form, request and reply,
subscriptions with filters, replay, resume across a lost connection and a router restart,
errors and their codes, two principals that must not see each other, TLS, a Python agent
spawned by the router over stdio, the examples, and Python agents talking to TypeScript SDK
agents. Every scenario has its own router on 127.0.0.1 port 0 in its own temp directory; every
wait is bounded. Prints `ok - name` / `FAIL - name: reason`, then `N passed, M failed`; exits 0
only when nothing failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import traceback

from harness import ROOT, SCENARIOS, Ctx, Scenario

import scenarios_core  # noqa: E402,F401  (each registers its scenarios)
import scenarios_more  # noqa: E402,F401
import scenarios_examples  # noqa: E402,F401
import scenarios_ext  # noqa: E402,F401
import scenarios_mixed  # noqa: E402,F401


async def run_one(binary: str, name: str, fn: Scenario, timeout: float, verbose: bool) -> str | None:
    ctx = Ctx(binary)
    try:
        await asyncio.wait_for(fn(ctx), timeout)
        return None
    except asyncio.TimeoutError:
        return f"scenario timed out after {timeout} s"
    except Exception as e:  # report and go on with the next scenario
        if verbose:
            traceback.print_exc()
        return f"{type(e).__name__}: {e}"
    finally:
        if verbose:
            for r in ctx.routers:
                for line in r.log[-30:]:
                    print(f"    [router] {line}", file=sys.stderr)
        await ctx.close()


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/debug/map-router"))
    ap.add_argument("--filter")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    selected = [s for s in SCENARIOS if not args.filter or args.filter in s[0]]
    if args.list:
        for name, _, _ in selected:
            print(name)
        return 0
    binary = str((ROOT / args.bin).resolve()) if not args.bin.startswith("/") else args.bin
    passed = failed = 0
    started = time.monotonic()
    for name, fn, timeout in selected:
        t0 = time.monotonic()
        error = await run_one(binary, name, fn, timeout, args.verbose)
        took = time.monotonic() - t0
        if error is None:
            passed += 1
            print(f"ok - {name} ({took:.2f} s)", flush=True)
        else:
            failed += 1
            print(f"FAIL - {name}: {error}", flush=True)
    print(f"python suite: {time.monotonic() - started:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
