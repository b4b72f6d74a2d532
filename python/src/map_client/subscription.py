"""`Subscription`: one event stream, as an async iterator with credit-based flow control.

The router sends at most `window` events that this side has not acknowledged
(`options.ackWindow`, then `map/subscribe.ack`); the subscription acknowledges events as the
application *takes* them, a quarter window at a time. So the local queue never holds more
than `window` events, and a slow reader slows the router's sending for this stream only
(the router keeps the rest in its log and resumes from its cursor) instead of making this
process's memory grow or losing events.

Across a reconnect the connection subscribes again with the same filter and
`replayFrom = <last event id taken>` (or the time of the first subscribe when none was taken
yet): the router sends what was missed, then live events, in one sequence. Events whose id is not
after the last one already queued are dropped, so nothing is seen twice.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from .errors import MapConnectionError, MapError
from .types import Event, EventEnvelope, SubscriptionFilter

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Subscription", "DEFAULT_WINDOW"]

#: Events the router may send ahead of the application (the router's own default window).
DEFAULT_WINDOW = 1024

_CLOSED = object()


class Subscription:
    """An event stream. Iterate it (`async for event in sub`), and close it with `unsubscribe()`
    or `async with`. `sub.id` is the router's subscription id, which changes after a reconnect."""

    def __init__(
        self,
        conn: Connection,
        filter: SubscriptionFilter | None,
        options: dict[str, Any],
        window: int,
    ) -> None:
        self._conn = conn
        self.filter = filter
        self._options = options
        self.window = window
        self.id = ""
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queued = 0
        self._last_queued_id: str | None = None
        #: Id of the last event handed to the application: where a resumed stream starts.
        self.last_event_id: str | None = None
        self._started_at_ms = int(time.time() * 1000)
        self._server_seq = 0  # last sequence number received on the current router subscription
        self._taken_seq = 0  # ... and taken by the application (acked up to here)
        self._acked_seq = 0
        self._closed = False
        self._error: BaseException | None = None
        #: Events received out of the router's window: a protocol violation, reported, never hidden.
        self.overflowed = 0

    # -- called by the connection ---------------------------------------------------------

    def _subscribe_params(self, resuming: bool) -> dict[str, Any]:
        params: dict[str, Any] = {"filter": dict(self.filter or {})}
        params["options"] = {**self._options, "ackWindow": self.window}
        if resuming:
            # Continue exactly after what the application has seen (it may not have taken
            # everything queued: those are dropped below and come again from the router).
            params["replayFrom"] = self.last_event_id or self._started_at_ms
            self._drain_queue()
        elif "replayFrom" in self._options:
            params["replayFrom"] = self._options["replayFrom"]
        params["options"].pop("replayFrom", None)
        return params

    def _attach(self, subscription_id: str) -> None:
        self.id = subscription_id
        self._server_seq = self._taken_seq = self._acked_seq = 0
        self._last_queued_id = self.last_event_id

    def _drain_queue(self) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is _CLOSED:
                self._queue.put_nowait(item)
                break
            self._queued -= 1

    def _push(self, params: EventEnvelope) -> None:
        event = params.get("event")
        if not isinstance(event, dict):
            return
        seq = params.get("sequenceNumber")
        if isinstance(seq, int):
            self._server_seq = seq
        event_id = params.get("eventId") or event.get("id")
        if isinstance(event_id, str) and event_id:
            # ULIDs sort by time: anything not after the last queued id was seen already.
            # A skipped event is credited by the next cumulative ack.
            if self._last_queued_id is not None and event_id <= self._last_queued_id:
                return
            self._last_queued_id = event_id
        if self._queued >= self.window + 64:
            self.overflowed += 1
            self._fail(MapError(-32603, f"the router sent more than the window of {self.window} events"))
            return
        self._queued += 1
        self._queue.put_nowait((seq, event))

    def _fail(self, error: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._error = error
            self._queue.put_nowait(_CLOSED)

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_CLOSED)

    # -- the application's side -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Events received and not yet taken."""
        return self._queued

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # every later call ends too
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        self._queued -= 1
        seq, event = item
        self._took(seq, event)
        return event  # type: ignore[no-any-return]

    async def next(self, timeout: float) -> Event:
        """The next event; `asyncio.TimeoutError` after `timeout` seconds, `StopAsyncIteration`
        when the stream has ended."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def _took(self, seq: Any, event: Event) -> None:
        event_id = event.get("id")
        if isinstance(event_id, str) and event_id:
            self.last_event_id = event_id
        if isinstance(seq, int):
            self._taken_seq = seq
        if self._taken_seq - self._acked_seq >= max(1, self.window // 4):
            self._acked_seq = self._taken_seq
            self._conn._ack(self.id, self._taken_seq)

    async def unsubscribe(self) -> None:
        """Ends the stream at the router and here. Idempotent."""
        if self._closed:
            return
        self._end()
        self._conn._forget(self)
        try:
            await self._conn.call("map/unsubscribe", {"subscriptionId": self.id})
        except (MapConnectionError, MapError):
            pass  # gone with its connection, or already

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()
