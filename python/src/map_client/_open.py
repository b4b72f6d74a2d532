"""Turns a URL into a transport opener: `ws://`, `wss://` (`http(s)://` too), or `stdio:`."""

from __future__ import annotations

import ssl as _ssl
from typing import Awaitable, Callable

from .errors import MapConnectionError
from .transport import Transport, WebSocketTransport, stdio


def is_stdio(url: str) -> bool:
    return url == "stdio" or url.startswith("stdio:")


def opener(
    url: str, *, ssl: _ssl.SSLContext | None, ca_file: str | None, open_timeout: float
) -> Callable[[], Awaitable[Transport]]:
    if is_stdio(url):
        opened = False

        async def open_stdio() -> Transport:
            nonlocal opened
            if opened:  # stdin's end means the router is gone: there is nothing to reopen
                raise MapConnectionError("stdin is closed")
            opened = True
            return await stdio()

        return open_stdio
    if url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    elif url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"unsupported URL {url!r}: use ws://, wss:// or stdio:")
    context = ssl
    if context is None and ca_file is not None:
        context = _ssl.create_default_context(cafile=ca_file)
    target = url

    async def open_ws() -> Transport:
        return await WebSocketTransport.open(target, ssl=context, open_timeout=open_timeout)

    return open_ws
