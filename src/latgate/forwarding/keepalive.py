"""Keep-alives while a stream waits for its first token.

latgate holds a stream's response head until the first generated content, so that a
failing upstream can still be retried or failed over (:mod:`latgate.forwarding.forward`).
A long prefill, a reasoning model thinking, or a queue makes that wait long, and a
client or load balancer that sees no byte for a minute (an AWS ALB's default idle
timeout is 60 s) closes a healthy stream. So once a stream has waited
``first_token_keepalive_sec`` (``[defaults]``, a provider, or a route policy; 0 turns
it off), :class:`EarlyStream` sends the 200 head and then an SSE comment
(``: keep-alive``; the HTML standard's event streams ignore lines starting with ``:``)
every interval until content comes, passing the upstream's own comments on as they
come (OpenRouter's ``: OPENROUTER PROCESSING``). Translated dialects send their own
keep-alive instead: Anthropic Messages its ``ping`` event (Anthropic API reference,
"Streaming Messages": pings may appear anywhere in a stream).

The retries and fallbacks go on inside that response: the attempts keep running in
their task, and the first to produce content is relayed after the keep-alives. When
every candidate fails after the head went out, the stream ends with one error event
in the client's dialect and no ``[DONE]``, and the request counts as failed with the
error's status, as it would have without keep-alives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from latgate.forwarding.exchange import CLIENT_CLOSED, Exchange
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.relay import StreamRelay, error_event, watch_disconnect
from latgate.forwarding.transform import ResponseTransform
from latgate.forwarding.wire import client_headers
from latgate.foundation.config.schema import Config
from latgate.foundation.errors import GatewayError
from latgate.routing.targets import RouteDecision

log = logging.getLogger("latgate.proxy")

#: the keep-alive of an OpenAI-style stream: an SSE comment, which every SSE parser skips
KEEPALIVE = b": keep-alive\n\n"


def keepalive_seconds(config: Config, decision: RouteDecision) -> float:
    """The stream's ``first_token_keepalive_sec``: its route policy's, else its primary
    provider's, else ``[defaults]``'s (seconds; 0 off)."""
    policy = config.routing.policies.get(decision.policy) if decision.policy else None
    if policy is not None and policy.first_token_keepalive_sec is not None:
        return policy.first_token_keepalive_sec
    provider = config.providers[decision.provider].first_token_keepalive_sec
    return config.defaults.first_token_keepalive_sec if provider is None else provider


class EarlyHead:
    """What the attempts and an :class:`EarlyStream` share: once ``committed`` (the head
    went out), comment events an attempt reads before content are handed on here
    instead of being held with the head."""

    __slots__ = ("comments", "committed", "wake")

    def __init__(self) -> None:
        self.committed = False
        self.comments: list[bytes] = []
        self.wake: asyncio.Event | None = None  # made when the head goes out (most streams never need it)

    def commit(self) -> asyncio.Event:
        """The head went out: from now on comments are handed on; returns the event set when one is."""
        self.committed = True
        self.wake = asyncio.Event()
        return self.wake

    def hold(self, events: bytes, separator: bytes) -> bytes:
        """Of ``events`` (complete events read before any content, each ending in
        ``separator``), the part to hold until content: all of it before the head
        went out, else all but the comments, which are handed on."""
        if not self.committed:
            return events
        kept = []
        for event in events.split(separator):
            if not event:
                continue
            if all(line.startswith(b":") for line in event.split(b"\n") if line.rstrip(b"\r")):
                self.comments.append(event + separator)
            else:
                kept.append(event)
        if self.comments and self.wake is not None:
            self.wake.set()
        return separator.join(kept) + separator if kept else b""


async def wait_briefly(attempts: asyncio.Future[Any], seconds: float) -> None:
    """Wait until ``attempts`` is done or ``seconds`` passed (one timer, one future:
    this runs on every stream). Cancelled: cancels ``attempts`` too."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(seconds, wake)
    attempts.add_done_callback(wake)
    try:
        await waiter
    except BaseException:
        attempts.cancel()
        raise
    finally:
        timer.cancel()
        attempts.remove_done_callback(wake)


class EarlyStream:
    """ASGI response of a stream whose first token is late: sends the 200 head and
    keep-alives while ``attempts`` (the forwarder's retries and fallbacks, resolving
    to a :class:`StreamRelay` or raising :class:`GatewayError`) runs, then relays.

    Args:
        attempts: the task running the attempts.
        early: shared with the attempts (:meth:`EarlyHead.hold`).
        exchange: the request record (handed to ``recorder`` here when no relay takes over).
        recorder: where the finished record goes.
        interval_seconds: between two keep-alives.
        transform: the client's dialect, when translated (its ``keepalive_event``
            and error event are used).
    """

    def __init__(
        self,
        *,
        attempts: asyncio.Task[Any],
        early: EarlyHead,
        exchange: Exchange,
        recorder: Recorder,
        interval_seconds: float,
        transform: ResponseTransform | None,
    ) -> None:
        self.attempts = attempts
        self.early = early
        self.exchange = exchange
        self.recorder = recorder
        self.interval_seconds = interval_seconds
        self.transform = transform

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        attempts, ex = self.attempts, self.exchange
        left = False

        def disconnected() -> None:
            nonlocal left
            left = True
            attempts.cancel()

        watcher = watch_disconnect(receive, disconnected)
        try:
            await self._keep_alive(send)
        except OSError:  # the server could not write: the client is gone
            left = True
        finally:
            watcher.cancel()
            if not attempts.done():
                attempts.cancel()
                await asyncio.wait((attempts,))  # its upstream closed, its slot released
        if attempts.cancelled():
            ex.status, ex.error_kind = CLIENT_CLOSED, "client_closed"
            self.recorder.finish(ex)
            return
        error = attempts.exception()
        if error is None:  # content came: relay it (a client gone meanwhile is noticed there)
            relay: StreamRelay = attempts.result()
            relay.head_sent = True
            await relay(scope, receive, send)
        elif left:
            ex.status, ex.error_kind = CLIENT_CLOSED, "client_closed"
            self.recorder.finish(ex)
        else:
            if not isinstance(error, GatewayError):
                log.warning("stream %s failed after its head was sent (%s)", ex.request_id, type(error).__name__)
                error = GatewayError("internal error")
            await self._fail(send, error)

    async def _keep_alive(self, send: Send) -> None:
        """The head, then keep-alives (and the upstream's comments) until the attempts are done."""
        transform, early, attempts = self.transform, self.early, self.attempts
        keepalive = KEEPALIVE if transform is None else transform.keepalive_event
        content_type = "text/event-stream" if transform is None else transform.stream_content_type
        await send({"type": "http.response.start", "status": 200, "headers": client_headers(self.exchange, content_type)})
        wake = early.commit()
        await send({"type": "http.response.body", "body": keepalive, "more_body": True})
        while not attempts.done():
            wake.clear()
            woken = asyncio.ensure_future(wake.wait())
            done, _ = await asyncio.wait((attempts, woken), timeout=self.interval_seconds, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if early.comments:
                comments = b"".join(early.comments) if transform is None else keepalive
                early.comments.clear()
                await send({"type": "http.response.body", "body": comments, "more_body": True})
            elif not done:
                await send({"type": "http.response.body", "body": keepalive, "more_body": True})

    async def _fail(self, send: Send, error: GatewayError) -> None:
        """Every candidate failed after the head went out: one error event, no ``[DONE]``."""
        ex = self.exchange
        if self.transform is not None:
            body = self.transform.finish(error=error.message)
        else:
            body = error_event(error.message, code=error.code or error.type)
        ex.fail(error)
        self.recorder.finish(ex)
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
