"""Transports: text frames in and out, nothing about JSON-RPC.

- `WebSocketTransport`: `ws://` and `wss://`, one JSON-RPC message per text frame (what the
  router and the TypeScript SDK write).
- `StreamTransport`: NDJSON (one message per line) over an asyncio stream pair; `stdio()` opens
  it on this process's stdin/stdout, which is how a program started by `map/agents/spawn`
  (or `map-router agent -- ...`) speaks MAP.

`recv()` returns `None` at a clean end (close frame, EOF) and raises `MapConnectionError` when the
connection broke.
"""

from __future__ import annotations

import asyncio
import os
import ssl as _ssl
import sys
from typing import TYPE_CHECKING, Any, Protocol

from .errors import MapConnectionError

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection as _WsConnection

# NB. `websockets` is imported where a WebSocket is opened, not here: a program spawned by the
# router over stdio needs nothing but the standard library and this package.

__all__ = ["Transport", "WebSocketTransport", "StreamTransport", "stdio", "MAX_FRAME_BYTES"]

#: Largest frame read, in bytes. The router's own default limit is 1 MiB per frame, and 4x that
#: is its hard cap; a larger frame from it would be a bug, so reading stops there.
MAX_FRAME_BYTES = 16 * 1024 * 1024


class Transport(Protocol):
    """What a connection needs from a transport."""

    async def send(self, text: str) -> None: ...

    async def recv(self) -> str | None: ...

    async def close(self) -> None: ...


class WebSocketTransport:
    """One WebSocket connection (websockets' asyncio client)."""

    def __init__(self, ws: _WsConnection) -> None:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        self._ws = ws
        self._closed_error = ConnectionClosed
        self._closed_ok = ConnectionClosedOK

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        ssl: _ssl.SSLContext | None = None,
        open_timeout: float = 10.0,
        max_size: int = MAX_FRAME_BYTES,
    ) -> WebSocketTransport:
        """Opens `url`; with `wss://` and no `ssl`, the system's trust store is used."""
        from websockets.asyncio.client import connect as _ws_connect
        from websockets.exceptions import InvalidHandshake, InvalidURI

        extra: dict[str, Any] = {"ssl": ssl} if ssl is not None and url.startswith("wss:") else {}
        try:
            ws = await _ws_connect(
                url,
                **extra,
                open_timeout=open_timeout,
                max_size=max_size,
                compression=None,
                # The router pings; our own pings would only add traffic. A dead peer is seen
                # by the router's pings and by our request deadlines.
                ping_interval=None,
            )
        except (OSError, InvalidHandshake, InvalidURI, asyncio.TimeoutError) as e:
            raise MapConnectionError(f"cannot open {url}: {e}") from e
        return cls(ws)

    async def send(self, text: str) -> None:
        try:
            await self._ws.send(text)
        except self._closed_error as e:
            raise MapConnectionError(f"connection closed: {e}") from e

    async def recv(self) -> str | None:
        try:
            frame = await self._ws.recv()
        except self._closed_ok:
            return None
        except self._closed_error as e:
            raise MapConnectionError(f"connection lost: {e}") from e
        return frame if isinstance(frame, str) else frame.decode("utf-8", "replace")

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._ws.close(), 2.0)
        except (asyncio.TimeoutError, OSError, self._closed_error):
            self._ws.transport.abort()

    def abort(self) -> None:
        """Drops the TCP connection without a close frame (what a crash or a network cut does)."""
        self._ws.transport.abort()


class StreamTransport:
    """NDJSON over an asyncio reader/writer pair: one JSON-RPC message per line."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._write_lock = asyncio.Lock()

    async def send(self, text: str) -> None:
        async with self._write_lock:
            try:
                self._writer.write(text.encode() + b"\n")
                await self._writer.drain()
            except (OSError, RuntimeError) as e:
                raise MapConnectionError(f"pipe closed: {e}") from e

    async def recv(self) -> str | None:
        while True:
            try:
                line = await self._reader.readline()
            except (asyncio.LimitOverrunError, ValueError) as e:
                raise MapConnectionError(f"line longer than {MAX_FRAME_BYTES} bytes") from e
            except OSError as e:
                raise MapConnectionError(f"pipe broken: {e}") from e
            if not line:
                return None
            text = line.decode("utf-8", "replace").strip()
            if text:
                return text

    async def close(self) -> None:
        try:
            self._writer.close()
        except (OSError, RuntimeError):
            pass


async def stdio(*, keep_stdout: bool = False) -> StreamTransport:
    """NDJSON over this process's stdin and stdout.

    Only MAP frames may go to stdout. Unless `keep_stdout` is set, the real stdout is kept for the
    protocol and file descriptor 1 is pointed at stderr, so a stray `print()` lands in the
    router's log (as an `agent.stderr` line) instead of breaking the session.
    """
    loop = asyncio.get_running_loop()
    out_fd = os.dup(1)
    if not keep_stdout:
        sys.stdout.flush()
        os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = os.fdopen(out_fd, "wb", buffering=0)
    w_transport, w_protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    writer = asyncio.StreamWriter(w_transport, w_protocol, reader, loop)
    return StreamTransport(reader, writer)
