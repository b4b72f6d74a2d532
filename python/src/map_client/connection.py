"""`Connection`: the JSON-RPC session under `ClientConnection` and `AgentConnection`.

It owns one transport at a time and one reader task per transport. The reader resolves answers
by id, hands `map/event` to its `Subscription`, resolves `request()`s by `correlationId`, and
puts every other `map/message` straight into the queue of each `messages()` iterator (one hop
from the socket to the application), and into the queue of the handlers' dispatcher. Nothing
the application does runs inside the reader: message handlers run on that dispatcher task, one
message at a time, so a handler may await `reply()` or `request()` (in the TypeScript SDK that
deadlocks).

Bounds: every call has a deadline (`timeout`, 30 s by default, as in the SDK); each message
queue holds `max_queued_messages`; a subscription holds at most its credit window
(subscription.py). NB. When a message queue is full the reader stops reading, which is
backpressure on the router (it reports a recipient whose queue is full as
`recipient_backlogged`) but also holds back answers: a handler that awaits a call while more
than `max_queued_messages` messages wait gets a timeout. While nothing reads messages (no
handler, no `messages()`), the newest `max_queued_messages` are kept for the first reader and
the rest counted in `dropped_messages` and logged.

When the transport is lost, calls in flight fail with `MapConnectionError` (whether the router
applied them is unknown) and, with `reconnect` on, the connection opens a new transport,
resumes its session (`resumeToken`), lets the subclass restore what it registered, and
subscribes again from the last event each subscription handed out (subscription.py). Calls made
meanwhile wait for that, within their own deadline.

The catalogue of MAP methods (agents, scopes, steering, tasks, mail, ...) is `Methods`
(methods.py), which this class completes with `call()` and `send()`.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import logging
import uuid
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Generic,
    Mapping,
    TypeVar,
    Union,
    cast,
)

from .auth import Auth
from .errors import AuthError, ErrorCode, MapConnectionError, MapError, MapTimeoutError
from .methods import Methods
from .subscription import DEFAULT_WINDOW, Subscription
from .transport import Transport
from .types import (
    Address,
    ConnectResult,
    EventEnvelope,
    Message,
    MessageMeta,
    ReplayedEvent,
    ReplayResult,
    SendResult,
    SubscriptionFilter,
)

__all__ = ["Connection", "Connecting", "ReconnectPolicy", "MessageHandler", "DEFAULT_TIMEOUT"]

log = logging.getLogger("map_client")

#: Seconds a call waits for its answer (the TypeScript SDK's `defaultTimeout`).
DEFAULT_TIMEOUT = 30.0
#: Messages received and not yet taken by a handler or `messages()` (see the module doc).
DEFAULT_MAX_QUEUED_MESSAGES = 4096

MessageHandler = Callable[[Message], Union[Awaitable[None], None]]
NotificationHandler = Callable[[Any], Union[Awaitable[None], None]]
StateHandler = Callable[[str], None]

_END: Any = object()


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a lost connection is re-opened: `attempts` tries, the delay doubling from
    `initial_delay` up to `max_delay` seconds."""

    attempts: int = 10
    initial_delay: float = 0.1
    max_delay: float = 5.0


class _Pending:
    __slots__ = ("future", "on_result")

    def __init__(self, future: asyncio.Future[Any], on_result: Callable[[Any], None] | None) -> None:
        self.future = future
        self.on_result = on_result


class Connection(Methods):
    """What clients and agents share: calls, messages, subscriptions, replay, reconnection."""

    _participant_type = "client"

    def __init__(
        self,
        opener: Callable[[], Awaitable[Transport]],
        *,
        name: str | None,
        auth: Auth | None,
        timeout: float,
        reconnect: ReconnectPolicy | None,
        max_queued_messages: int,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self._opener = opener
        self.name = name
        self._auth = auth
        self.timeout = timeout
        self._reconnect_policy = reconnect
        self._capabilities = dict(capabilities) if capabilities else None
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._connected = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing = False
        self._close_error: BaseException | None = None
        self._subscriptions: list[Subscription] = []
        self._subs_by_id: dict[str, Subscription] = {}
        self._reply_waiters: dict[str, asyncio.Future[Message]] = {}
        #: Messages that arrived while nothing read messages (handed to the first reader).
        self._inbox: collections.deque[Message] = collections.deque()
        self._max_queued = max_queued_messages
        self._handlers: list[MessageHandler] = []
        self._iterators: list[asyncio.Queue[Any]] = []
        self._handler_queue: asyncio.Queue[Any] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._notification_handlers: dict[str, list[NotificationHandler]] = {}
        self._state_handlers: list[StateHandler] = []
        self._background: set[asyncio.Task[Any]] = set()
        #: Messages dropped because nothing ever read messages (no handler, no `messages()`)
        #: and the inbox was full.
        self.dropped_messages = 0
        self.connect_result: ConnectResult = {}
        self.resume_token: str | None = None
        self.state = "initial"

    # -- identity -------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self.connect_result.get("sessionId")

    @property
    def participant_id(self) -> str | None:
        return self.connect_result.get("participantId")

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the router granted this session."""
        return dict(self.connect_result.get("capabilities") or {})

    @property
    def is_connected(self) -> bool:
        return self._connected.is_set()

    # -- lifecycle ------------------------------------------------------------------------

    async def _start(self, resume_token: str | None = None) -> None:
        self.resume_token = resume_token
        self._set_state("connecting")
        transport = await self._opener()
        self._attach(transport)
        try:
            await self._handshake(resuming=False)
        except BaseException:
            await self._shutdown(None)
            raise
        self._connected.set()
        self._set_state("connected")

    def _attach(self, transport: Transport) -> None:
        self._transport = transport
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(transport))

    async def _handshake(self, resuming: bool) -> None:
        raise NotImplementedError

    async def _connect_call(self, params: dict[str, Any]) -> ConnectResult:
        """`map/connect` with the session's credentials and resume token; raises `AuthError`
        when the router answers `authRequired`."""
        params = {"protocolVersion": 1, **params}
        if self.name is not None:
            params.setdefault("name", self.name)
        if self._auth is not None:
            params["auth"] = self._auth.to_wire()
        if self._capabilities is not None:
            params["capabilities"] = self._capabilities
        if self.resume_token:
            params["resumeToken"] = self.resume_token
        result = cast(ConnectResult, await self._raw_call("map/connect", params, self.timeout))
        if "authRequired" in result or "sessionId" not in result:
            err = result.get("error") or {}
            code = ErrorCode.AUTH_FAILED if err else ErrorCode.AUTH_REQUIRED
            message = err.get("message") if isinstance(err, dict) else None
            raise AuthError(
                code,
                message or "Authentication required",
                {"category": "auth", "authRequired": result.get("authRequired"), "error": err},
            )
        self.connect_result = result
        self.resume_token = result.get("resumeToken")
        return result

    async def close(self) -> None:
        """Ends the session (`map/disconnect`) and closes the transport. Idempotent."""
        await self.disconnect()

    async def disconnect(self, reason: str | None = None) -> str | None:
        """`map/disconnect`, then close. Returns the resume token the router handed out (a new
        connection may resume the session with it within the router's resume window)."""
        if self._closing or self._closed.is_set():
            await self._closed.wait()
            return self.resume_token
        self._closing = True
        token = self.resume_token
        if self._connected.is_set():
            try:
                params = {"reason": reason} if reason else {}
                result = await self._raw_call("map/disconnect", params, min(self.timeout, 5.0))
                if isinstance(result, dict) and isinstance(result.get("resumeToken"), str):
                    token = result["resumeToken"]
            except (MapError, MapConnectionError, MapTimeoutError):
                pass
        self.resume_token = token
        await self._shutdown(None)
        return token

    async def abort(self) -> None:
        """Closes the transport without `map/disconnect` and without reconnecting (as a crash
        would: the router keeps the session for its resume window)."""
        self._closing = True
        await self._shutdown(None)

    async def _shutdown(self, error: BaseException | None) -> None:
        self._closing = True
        self._connected.clear()
        transport, reader = self._transport, self._reader
        self._transport = None
        if transport is not None:
            await transport.close()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        if self._closed.is_set():
            return
        self._close_error = error
        self._connected.clear()
        self._fail_pending(error or MapConnectionError("connection closed"))
        for waiter in self._reply_waiters.values():
            if not waiter.done():
                waiter.set_exception(error or MapConnectionError("connection closed"))
        for sub in self._subscriptions:
            if error is not None:
                sub._fail(error)
            else:
                sub._end()
        self._subscriptions.clear()
        self._subs_by_id.clear()
        self._end_messages()
        for task in list(self._background):
            task.cancel()
        self._closed.set()
        self._set_state("closed")

    def _end_messages(self) -> None:
        for queue in self._iterators:
            self._end_queue(queue)
        if self._handler_queue is not None:
            self._end_queue(self._handler_queue)

    async def wait_closed(self) -> None:
        """Returns when the connection has closed for good (after reconnection gave up, or
        `close()`); raises the error that ended it, if any."""
        await self._closed.wait()
        if self._close_error is not None:
            raise self._close_error

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def on_state_change(self, handler: StateHandler) -> StateHandler:
        """`handler(state)` on every change: `connecting`, `connected`, `reconnecting`,
        `closed`."""
        self._state_handlers.append(handler)
        return handler

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        for handler in list(self._state_handlers):
            try:
                handler(state)
            except Exception:
                log.exception("state handler failed")

    # -- the wire -------------------------------------------------------------------------

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Any MAP method by name (the SDK's `callExtension`): the result, or a `MapError`."""
        return await self._call(method, params, timeout)

    async def _call(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        timeout: float | None,
        on_result: Callable[[Any], None] | None = None,
    ) -> Any:
        limit = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        if not self._connected.is_set():
            if self._closed.is_set() or self._closing:
                raise MapConnectionError("connection closed")
            await self._wait_connected(limit, method)
        return await self._raw_call(method, params, max(0.0, deadline - loop.time()), on_result)

    async def _wait_connected(self, limit: float, method: str) -> None:
        connected = asyncio.ensure_future(self._connected.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({connected, closed}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            connected.cancel()
            closed.cancel()
        if not self._connected.is_set():
            if self._closed.is_set():
                raise MapConnectionError("connection closed")
            raise MapTimeoutError(f"{method}: not reconnected within {limit} s")

    async def _raw_call(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        timeout: float,
        on_result: Callable[[Any], None] | None = None,
    ) -> Any:
        transport = self._transport
        if transport is None:
            raise MapConnectionError("connection closed")
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = _Pending(future, on_result)
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            frame["params"] = params
        try:
            await transport.send(json.dumps(frame, separators=(",", ":")))
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise MapTimeoutError(f"{method}: no answer within {timeout:g} s") from None
        finally:
            self._pending.pop(request_id, None)
            if not future.done():
                future.cancel()

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Sends a notification (no answer)."""
        transport = self._transport
        if transport is None:
            raise MapConnectionError("connection closed")
        frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            frame["params"] = params
        await transport.send(json.dumps(frame, separators=(",", ":")))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(cast(Any, coro))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _ack(self, subscription_id: str, up_to: int) -> None:
        async def send() -> None:
            try:
                await self.notify("map/subscribe.ack", {"subscriptionId": subscription_id, "upToSequence": up_to})
            except MapConnectionError:
                pass  # the resumed subscription starts a new window

        # NB. Not gated on `_connected`: while a reconnect restores its subscriptions, events of
        # the ones already restored flow and must be credited, or their window closes for good.
        if self._transport is not None:
            self._spawn(send())

    def _fail_pending(self, error: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(error)

    async def _read_loop(self, transport: Transport) -> None:
        error: BaseException | None = None
        try:
            while True:
                text = await transport.recv()
                if text is None:
                    break
                try:
                    frame = json.loads(text)
                except ValueError:
                    log.warning("unparsable frame from the router: %.200s", text)
                    continue
                for one in frame if isinstance(frame, list) else [frame]:
                    if isinstance(one, dict):
                        await self._handle(one)
        except MapConnectionError as e:
            error = e
        except asyncio.CancelledError:
            return
        except Exception as e:  # a bug here must not leave callers waiting forever
            log.exception("reader failed")
            error = e
        if self._transport is transport:
            await self._on_lost(error)

    async def _handle(self, frame: dict[str, Any]) -> None:
        method = frame.get("method")
        if method is None:
            entry = self._pending.pop(frame.get("id"), None)  # type: ignore[arg-type]
            if entry is None or entry.future.done():
                return
            if "error" in frame:
                entry.future.set_exception(MapError.from_wire(frame["error"]))
            else:
                result = frame.get("result")
                if entry.on_result is not None:
                    entry.on_result(result)
                entry.future.set_result(result)
            return
        params = frame.get("params")
        if "id" in frame:  # the router never asks; answer as the SDK clients do
            self._spawn(self._answer_unknown(frame["id"], str(method)))
            return
        if method == "map/event":
            if isinstance(params, dict):
                sub = self._subs_by_id.get(params.get("subscriptionId", ""))
                if sub is not None:
                    sub._push(cast(EventEnvelope, params))
        elif method in ("map/message", "map/send"):
            if isinstance(params, dict):
                message = params.get("message", params)
                if isinstance(message, dict):
                    await self._on_message(cast(Message, message))
        else:
            for handler in list(self._notification_handlers.get(str(method), [])):
                try:
                    outcome = handler(params)
                    if inspect.isawaitable(outcome):
                        self._spawn(outcome)
                except Exception:
                    log.exception("notification handler for %s failed", method)

    async def _answer_unknown(self, request_id: Any, method: str) -> None:
        transport = self._transport
        if transport is not None:
            error = {"code": -32601, "message": f"Method not found: {method}", "data": {"category": "protocol"}}
            try:
                await transport.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))
            except MapConnectionError:
                pass

    async def _on_lost(self, error: BaseException | None) -> None:
        self._connected.clear()
        self._transport = None
        self._fail_pending(MapConnectionError(f"connection lost: {error}" if error else "connection closed by the router"))
        if self._closing:
            self._finish(None)
            return
        if self._reconnect_policy is None or self._reconnect_policy.attempts <= 0:
            self._finish(MapConnectionError(f"connection lost: {error}" if error else "connection closed by the router"))
            return
        self._set_state("reconnecting")
        self._spawn(self._reconnect(self._reconnect_policy))

    async def _reconnect(self, policy: ReconnectPolicy) -> None:
        delay = policy.initial_delay
        last: BaseException | None = None
        for attempt in range(policy.attempts):
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_delay)
            if self._closing:
                return
            try:
                transport = await asyncio.wait_for(self._opener(), self.timeout)
            except (MapConnectionError, OSError, asyncio.TimeoutError) as e:
                last = e
                continue
            self._attach(transport)
            try:
                await self._handshake(resuming=True)
                await self._restore_subscriptions()
            except (MapError, MapConnectionError, MapTimeoutError) as e:
                last = e
                log.info("reconnect attempt %d failed: %s", attempt + 1, e)
                if self._transport is transport:
                    self._transport = None
                    await transport.close()
                if isinstance(e, AuthError):
                    break
                continue
            self._connected.set()
            self._set_state("connected")
            return
        self._finish(MapConnectionError(f"could not reconnect: {last}"))

    async def _restore_subscriptions(self) -> None:
        self._subs_by_id.clear()
        for sub in list(self._subscriptions):
            params = sub._subscribe_params(resuming=True)
            await self._raw_call("map/subscribe", params, self.timeout, on_result=self._attacher(sub))

    def _attacher(self, sub: Subscription) -> Callable[[Any], None]:
        # Runs in the reader, before any event of the new subscription can be handled.
        def attach(result: Any) -> None:
            if isinstance(result, dict) and isinstance(result.get("subscriptionId"), str):
                sub._attach(result["subscriptionId"])
                self._subs_by_id[sub.id] = sub

        return attach

    # -- messages -------------------------------------------------------------------------

    async def _on_message(self, message: Message) -> None:
        meta = message.get("meta") or {}
        cid = meta.get("correlationId")
        if isinstance(cid, str) and not meta.get("expectsResponse"):
            waiter = self._reply_waiters.get(cid)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
                return
        if not self._handlers and not self._iterators:
            # Nobody reads messages (yet, or at all: a dashboard that only watches events).
            # Waiting for a reader that may never come would stall this connection's answers
            # and events: keep the newest for the first reader, count and log what goes.
            if len(self._inbox) >= self._max_queued:
                self._inbox.popleft()
                self.dropped_messages += 1
                if self.dropped_messages == 1 or self.dropped_messages % 1000 == 0:
                    log.warning("%d messages dropped: nothing reads this connection's messages", self.dropped_messages)
            self._inbox.append(message)
            return
        # NB. A full queue stops this reader: backpressure, see the module doc.
        for queue in self._iterators:
            if queue.full():
                await queue.put(message)
            else:
                queue.put_nowait(message)
        if self._handlers and self._handler_queue is not None:
            if self._handler_queue.full():
                await self._handler_queue.put(message)
            else:
                self._handler_queue.put_nowait(message)

    def on_message(self, handler: MessageHandler) -> MessageHandler:
        """Calls `handler(message)` for every message (sync or async; one at a time, in order, on
        a task of their own). Usable as a decorator. Replies to this side's `request()` go to the
        request instead."""
        self._handlers.append(handler)
        if self._handler_queue is None:
            self._handler_queue = asyncio.Queue(self._max_queued)
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(self._handler_queue))
        while self._inbox and not self._handler_queue.full():
            self._handler_queue.put_nowait(self._inbox.popleft())
        if self._closed.is_set():
            self._end_queue(self._handler_queue)
        return handler

    def off_message(self, handler: MessageHandler) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)

    async def messages(self) -> AsyncIterator[Message]:
        """Every message, in order, until the connection closes (what arrived while nothing
        read messages first). Each iterator gets every message."""
        queue: asyncio.Queue[Any] = asyncio.Queue(self._max_queued)
        while self._inbox:
            queue.put_nowait(self._inbox.popleft())
        self._iterators.append(queue)
        try:
            while True:
                if queue.empty() and self._closed.is_set():
                    return
                item = await queue.get()
                if item is _END:
                    return
                yield item
        finally:
            self._iterators.remove(queue)

    @staticmethod
    def _end_queue(queue: asyncio.Queue[Any]) -> None:
        # A reader of `queue` that finds it empty after the close ends by itself; one waiting
        # on an empty queue now is woken by the marker.
        if queue.empty():
            queue.put_nowait(_END)

    async def _dispatch(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            if queue.empty() and self._closed.is_set():
                return
            message = await queue.get()
            if message is _END:
                return
            for handler in list(self._handlers):
                try:
                    outcome = handler(message)
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception:
                    log.exception("message handler failed")

    def on_notification(self, method: str, handler: NotificationHandler) -> NotificationHandler:
        """Calls `handler(params)` for notifications of `method` other than messages and events
        (`map/auth/expiring`, `trajectory/content.request`, ...). Async handlers run as tasks."""
        self._notification_handlers.setdefault(method, []).append(handler)
        return handler

    # -- sending --------------------------------------------------------------------------

    async def send(self, to: Address, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        """`map/send`: `{"messageId", "delivered": [...], "queued"?: [...]}`."""
        params: dict[str, Any] = {"to": to}
        if payload is not None:
            params["payload"] = payload
        if meta:
            params["meta"] = meta
        return cast(SendResult, await self.call("map/send", params))

    async def send_to_agent(self, agent_id: str, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"agent": agent_id}, payload, meta)

    async def send_to_scope(self, scope_id: str, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"scope": scope_id}, payload, meta)

    async def send_to_role(
        self, role: str, payload: Any = None, meta: MessageMeta | None = None, within: str | None = None
    ) -> SendResult:
        to: dict[str, Any] = {"role": role}
        if within is not None:
            to["within"] = within
        return await self.send(to, payload, meta)

    async def broadcast(self, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        return await self.send({"broadcast": True}, payload, meta)

    async def request(
        self, to: Address, payload: Any = None, *, timeout: float | None = None, meta: MessageMeta | None = None
    ) -> Message:
        """Sends with `meta.expectsResponse` and a fresh `correlationId`, and returns the first
        message back that carries that `correlationId` (what `reply()` sends)."""
        limit = self.timeout if timeout is None else timeout
        cid = f"req-{uuid.uuid4().hex}"
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._reply_waiters[cid] = waiter
        try:
            full: MessageMeta = {**(meta or {}), "expectsResponse": True, "correlationId": cid}
            await self.send(to, payload, full)
            try:
                return await asyncio.wait_for(waiter, limit)
            except asyncio.TimeoutError:
                raise MapTimeoutError(f"no reply within {limit:g} s") from None
        finally:
            self._reply_waiters.pop(cid, None)

    async def reply(self, message: Message, payload: Any = None, meta: MessageMeta | None = None) -> SendResult:
        """Answers `message`: to its sender, with its `correlationId` (else its id) and
        `isResult: True`, as the TypeScript SDK's `reply()`."""
        original = message.get("meta") or {}
        full: MessageMeta = {
            **(meta or {}),
            "correlationId": original.get("correlationId") or message["id"],
            "isResult": True,
        }
        return await self.send({"agent": message["from"]}, payload, full)

    # -- events ---------------------------------------------------------------------------

    async def subscribe(
        self,
        filter: SubscriptionFilter | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        replay_from: str | int | None = None,
        exclude_own_events: bool = False,
    ) -> Subscription:
        """An event stream (`async for event in sub`). `replay_from`: an event id (exclusive) or
        a Unix time in ms (inclusive) to start from history; `window`: events the router may
        send ahead of the application (subscription.py)."""
        options: dict[str, Any] = {}
        if exclude_own_events:
            options["excludeOwnEvents"] = True
        if replay_from is not None:
            options["replayFrom"] = replay_from
        sub = Subscription(self, filter, options, window)
        params = sub._subscribe_params(resuming=False)
        await self._call("map/subscribe", params, None, on_result=self._attacher(sub))
        self._subscriptions.append(sub)
        return sub

    def _forget(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        self._subs_by_id.pop(sub.id, None)

    async def unsubscribe(self, subscription: Subscription) -> None:
        await subscription.unsubscribe()

    async def replay(
        self,
        *,
        after_event_id: str | None = None,
        from_timestamp: int | None = None,
        to_timestamp: int | None = None,
        filter: SubscriptionFilter | None = None,
        limit: int = 100,
    ) -> ReplayResult:
        """One page of history (`map/replay`), oldest first."""
        params: dict[str, Any] = {"limit": limit}
        if after_event_id is not None:
            params["afterEventId"] = after_event_id
        if from_timestamp is not None:
            params["fromTimestamp"] = from_timestamp
        if to_timestamp is not None:
            params["toTimestamp"] = to_timestamp
        if filter is not None:
            params["filter"] = filter
        return cast(ReplayResult, await self.call("map/replay", params))

    async def replay_all(
        self,
        *,
        after_event_id: str | None = None,
        from_timestamp: int | None = None,
        to_timestamp: int | None = None,
        filter: SubscriptionFilter | None = None,
        page: int = 500,
    ) -> AsyncIterator[ReplayedEvent]:
        """Every retained event matching, page after page."""
        cursor = after_event_id
        while True:
            result = await self.replay(
                after_event_id=cursor,
                from_timestamp=from_timestamp if cursor is None else None,
                to_timestamp=to_timestamp,
                filter=filter,
                limit=page,
            )
            for item in result["events"]:
                yield item
            if not result.get("hasMore") or not result["events"]:
                return
            cursor = result["events"][-1]["eventId"]


_C = TypeVar("_C", bound=Connection)


class Connecting(Generic[_C]):
    """What `connect()` returns: await it for the connection, or use it with `async with`
    (which closes the connection at the end of the block)."""

    def __init__(self, factory: Callable[[], Awaitable[_C]]) -> None:
        self._factory = factory
        self._conn: _C | None = None

    def __await__(self) -> Generator[Any, None, _C]:
        return self._factory().__await__()

    async def __aenter__(self) -> _C:
        self._conn = await self._factory()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()


def control_of(message: Message) -> str | None:
    """`"stop"`, `"suspend"` or `"resume"` when `message` is one of the router's control
    messages (from `system`), else None."""
    if message.get("from") != "system":
        return None
    payload = message.get("payload")
    if isinstance(payload, dict) and isinstance(payload.get("control"), str):
        return str(payload["control"])
    return None


def _agent_ids(agents: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(agents, list):
        for a in agents:
            if isinstance(a, str):
                out.add(a)
            elif isinstance(a, dict) and isinstance(a.get("id"), str):
                out.add(a["id"])
    return out


__all__ += ["control_of"]
