"""The suite's infrastructure: router processes on port 0, bounded waits, assertions.

Each scenario gets its own router (its own temp directory and data dir); the router's
listening URL is read from its stderr, as tests/interop/lib.mjs does.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "src"))

#: The bound on any single wait (an event, a message, an answer).
STEP = 5.0
#: How long to keep listening when asserting that something does NOT arrive.
QUIET = 0.3

T = TypeVar("T")


def check(cond: object, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def eq(got: object, want: object, what: str) -> None:
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


async def bounded(aw: Awaitable[T], what: str, timeout: float = STEP) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out after {timeout} s: {what}") from None


async def until(fn: Callable[[], Any], what: str, timeout: float = STEP) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def expect_code(aw: Awaitable[Any], code: int, what: str) -> Any:
    from map_client import MapError

    try:
        result = await bounded(aw, what)
    except MapError as e:
        if e.code == code:
            return e
        raise AssertionError(f"{what}: expected code {code}, got {e.code} {e.message}") from None
    raise AssertionError(f"{what}: expected code {code}, got success {result!r}")


class Router:
    """One map-router process."""

    def __init__(self, binary: str, workdir: str) -> None:
        self.binary = binary
        self.workdir = workdir
        self.data_dir = os.path.join(workdir, "data")
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.port = 0
        self.log: list[str] = []
        self._drain: asyncio.Task[None] | None = None

    async def start(self, config: str | None = None, args: list[str] | None = None, listen: str = "127.0.0.1:0",
                    env: dict[str, str] | None = None) -> Router:
        argv = [self.binary, "serve", "--listen", listen, "--data-dir", self.data_dir]
        if config:
            path = os.path.join(self.workdir, "router.toml")
            with open(path, "w") as f:
                f.write(config)
            argv += ["--config", path]
        argv += args or []
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})}, start_new_session=True)
        found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        assert self.proc.stderr is not None
        stderr = self.proc.stderr

        async def drain() -> None:
            while True:
                raw = await stderr.readline()
                if not raw:
                    break
                line = raw.decode(errors="replace").rstrip()
                self.log.append(line)
                if len(self.log) > 400:
                    del self.log[:100]
                m = re.search(r"map-router listening on (wss?://127\.0\.0\.1:(\d+)/)", line)
                if m and not found.done():
                    found.set_result(m.group(1))
            if not found.done():
                found.set_exception(AssertionError("router exited before listening: " + " | ".join(self.log[-10:])))

        self._drain = asyncio.get_running_loop().create_task(drain())
        self.url = await bounded(found, "the router's listening line")
        self.port = int(self.url.rsplit(":", 1)[1].strip("/"))
        return self

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
            await bounded(self.proc.wait(), "router exit")
        if self._drain is not None:
            await bounded(self._drain, "router stderr")
            self._drain = None


class Ctx:
    """What a scenario gets: its router(s), and cleanups run at its end."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="map-py-suite-")
        self.routers: list[Router] = []
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []
        self.router: Router | None = None

    @property
    def url(self) -> str:
        assert self.router is not None
        return self.router.url

    async def start_router(self, config: str | None = None, args: list[str] | None = None,
                           workdir: str | None = None, listen: str = "127.0.0.1:0",
                           env: dict[str, str] | None = None) -> Router:
        wd = workdir or tempfile.mkdtemp(dir=self.dir)
        r = await Router(self.binary, wd).start(config, args, listen, env)
        self.routers.append(r)
        if self.router is None:
            self.router = r
        return r

    def defer(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self._cleanups.append(fn)

    async def close(self) -> None:
        for fn in reversed(self._cleanups):
            try:
                await asyncio.wait_for(fn(), STEP)
            except Exception:
                pass
        for r in self.routers:
            try:
                await r.kill()
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


Scenario = Callable[[Ctx], Awaitable[None]]
SCENARIOS: list[tuple[str, Scenario, float]] = []


def scenario(name: str, timeout: float = 30.0) -> Callable[[Scenario], Scenario]:
    """Registers a scenario (run in declaration order, each with its own router)."""

    def register(fn: Scenario) -> Scenario:
        SCENARIOS.append((name, fn, timeout))
        return fn

    return register
