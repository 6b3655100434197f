"""How an attempt at an upstream fails: each failure recorded once (passive health,
``latgate_upstream_errors_total``) and turned into the client-facing error, in the
OpenAI envelope, with whether another attempt can help.

A provider that says it is full (TileRT's 429 "all decode nodes busy", see
:meth:`~latgate.live.connectors.Connector.busy`) is not failing: the request moves on to the
next candidate at once, and nothing counts against the endpoint's health.

Retryable: connection failures, timeouts, HTTP 408/429/500/502/503/504, an HTML 200,
a 200 stream without content or whose first bytes are not an event stream, and in-band
server error events (or a JSON error object answering a stream). 401/403 mean the
provider rejects latgate's own key: not retried on that provider, but its fallbacks
are tried. Any other 4xx (and an in-band client error such as "context too long") is
the client's request: returned at once with the upstream's status. Upstream error text
is redacted (:mod:`latgate.forwarding.redact`) before a client sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin, urlsplit

import orjson

from latgate.forwarding.redact import bare_key, redact, redact_json, redact_text, upstream_label
from latgate.foundation.config.masking import mask_secrets
from latgate.foundation.errors import (
    GatewayError,
    InvalidRequest,
    Overloaded,
    UpstreamClientError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from latgate.foundation.metrics import Metrics
from latgate.live.providers import EndpointRuntime, ProviderPool, ProviderRuntime
from latgate.transport.upstream import (
    SAME_ORIGIN_REDIRECTS,
    UpstreamFailure,
    UpstreamResponse,
    same_origin_location,
    upstream_errors,
)

log = logging.getLogger("latgate.upstream")
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
PROVIDER_AUTH_STATUSES = frozenset({401, 403})
#: client errors whose upstream error object is relayed as the upstream wrote it
PASSTHROUGH_STATUSES = frozenset({400, 404, 413, 422})
MAX_ERROR_BODY_BYTES = 64 * 1024
#: an error status's body is read for at most this long (or until the first-token deadline)
ERROR_BODY_TIMEOUT_SECONDS = 5.0
#: :class:`UpstreamFailure` kinds that are latgate's own limits, not the upstream's failure
OWN_LIMITS = frozenset({"overloaded", "local", "too_large"})
NO_FIRST_TOKEN = UpstreamFailure("timeout", "no first token before the first-token deadline")


class AttemptFailed(Exception):
    """One attempt failed before anything reached the client: ``error`` (the client's,
    should no other attempt succeed), ``retryable``, ``retry_after`` (the upstream's, in
    seconds), ``busy`` (full now, TileRT's busy 429: on to the next candidate),
    ``stream_options_refused`` (the provider that refused the stream's
    ``stream_options``, set by :mod:`latgate.forwarding.attempt`: sent again without them,
    :func:`latgate.routing.policies.retry.after_failure`)."""

    def __init__(
        self, error: GatewayError, *, retryable: bool, retry_after: float | None = None, busy: bool = False
    ) -> None:
        self.error = error
        self.retryable = retryable
        self.retry_after = retry_after
        self.busy = busy
        self.stream_options_refused: str | None = None

    @property
    def client_mistake(self) -> bool:
        """The request's own fault (a 4xx other than 401/403, 408 and 429): every
        provider would refuse it alike, so no other is tried."""
        status = self.error.status
        return status < 500 and status not in RETRYABLE_STATUSES | PROVIDER_AUTH_STATUSES


class Failures:
    """Records failed attempts and builds their :class:`AttemptFailed`.

    Args:
        pool: the providers and their endpoints (passive health).
        metrics: where upstream errors are counted.
    """

    def __init__(self, *, pool: ProviderPool, metrics: Metrics) -> None:
        self.pool = pool
        self.metrics = metrics

    def failed(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, failure: UpstreamFailure, *, health: bool = True
    ) -> AttemptFailed:
        """``health=False``: a missed budget deadline, which the endpoint's TTFT fit has
        learnt from already; it does not count towards opening its circuit. A failure of
        latgate's own limits (:data:`OWN_LIMITS`) never counts against the provider and
        is not retried on it: 503 ``overloaded`` (a full pool, no descriptor) or 502
        (an event or body past its size limit)."""
        if failure.kind in OWN_LIMITS:
            self.metrics.record_upstream_error(provider=provider.name, kind=failure.kind)
            if failure.kind == "too_large":
                return AttemptFailed(UpstreamError(f"provider {provider.name!r}: {failure}", code="response_too_large"), retryable=False)
            return AttemptFailed(Overloaded(f"latgate is overloaded for provider {provider.name!r}: {failure}"), retryable=False)
        if health:
            self.pool.record_outcome(provider, endpoint, ok=False)
        self.metrics.record_upstream_error(provider=provider.name, kind=failure.kind)
        log.debug("provider %r endpoint %s failed (%s): %s", provider.name, endpoint.config.id, failure.kind, failure)
        if failure.kind == "timeout":
            error: GatewayError = UpstreamTimeout(f"provider {provider.name!r} timed out: {failure}")
        else:
            error = UpstreamUnavailable(f"provider {provider.name!r} is unavailable: {failure}")
        error.cause = str(failure)  # the access log's "cause" (no URL, no key)
        return AttemptFailed(error, retryable=True)

    async def status_failure(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        response: UpstreamResponse,
        deadline: float | None,
        *,
        url: str = "",
    ) -> AttemptFailed:
        """A non-200 answer to a request sent to ``url``. 4xx/5xx: the upstream's error
        (an OpenAI error object or a bare string ``{"error": "MESSAGE"}``), redacted,
        with its status (retried where :data:`RETRYABLE_STATUSES` says; ``busy`` when
        the connector says the provider is full). Any other status (a 204, a
        redirect): not an answer to a completion, so the provider's failure (502)."""
        status = response.status_code
        if 300 <= status < 400:  # a same-origin 307/308 elsewhere was followed already (upstream.py)
            location = response.headers.get("location")
            return self.redirect_refused(provider, endpoint, status, location, url, followed=response.followed)
        if status < 400:
            return self.bad_response(provider, endpoint, f"answered with status {status}")
        data = b""
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + ERROR_BODY_TIMEOUT_SECONDS
        with contextlib.suppress(UpstreamFailure, TimeoutError), upstream_errors():
            async with asyncio.timeout_at(deadline):
                async for chunk in response.aiter_raw():
                    data += chunk
                    if len(data) >= MAX_ERROR_BODY_BYTES:
                        break
        if provider.connector.busy(status, data):  # full, not failing: nothing against its health
            self.pool.record_full(endpoint)
            return AttemptFailed(upstream_error(provider, status, data), retryable=False, busy=True)
        retryable = status in RETRYABLE_STATUSES
        if retryable or status in PROVIDER_AUTH_STATUSES:
            self.pool.record_outcome(provider, endpoint, ok=status == 429)
            kind = "status_429" if status == 429 else f"status_{status // 100}xx"
            self.metrics.record_upstream_error(provider=provider.name, kind=kind)
        error = upstream_error(provider, status, data)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        if status == 429 or (status == 503 and retry_after is not None):  # avoided for that long
            self.pool.record_busy(endpoint, seconds=retry_after)
        if status in (429, 503) and retry_after is not None:
            error.headers["retry-after"] = retry_after_header(response.headers["retry-after"], retry_after)
        return AttemptFailed(error, retryable=retryable, retry_after=retry_after)

    def error_event(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, error: dict[str, Any], *, error_kind: str = "error_event"
    ) -> AttemptFailed:
        """An error object as the first event of a 200 stream. A client error (the
        upstream says 400, e.g. context too long) is returned as a 400 and not retried;
        anything else is the provider's failure."""
        message = redact_text(str(error.get("message") or "upstream error"), provider_secrets(provider))
        code, kind = error.get("code"), str(error.get("type") or "")
        if code in (400, "400", 422, "422") or kind in ("invalid_request_error", "BadRequestError"):
            return AttemptFailed(InvalidRequest(f"provider {provider.name!r}: {message}"), retryable=False)
        self.pool.record_outcome(provider, endpoint, ok=False)
        self.metrics.record_upstream_error(provider=provider.name, kind=error_kind)
        return AttemptFailed(UpstreamError(f"provider {provider.name!r}: {message}"), retryable=True)

    async def wrong_content_type(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, content_type: str, deadline: float | None
    ) -> AttemptFailed:
        """A 200 that is not what was asked for (an HTML login page, a proxy's notice):
        the provider's failure, retried elsewhere; its body is never shown."""
        shown = content_type.split(";")[0].strip()[:64] or "none"
        return self.bad_response(provider, endpoint, f"answered with content type {shown!r}")

    async def not_event_stream(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        what: str,
        start: bytes,
        body: AsyncIterator[bytes],
        deadline: float | None,
    ) -> AttemptFailed:
        """A stream answered, before any content, with ``what`` (``"a JSON body"``, ``"an
        HTML page"``, ``"other bytes"``: :class:`~latgate.forwarding.stream_start.StreamStart`),
        from ``start`` on: the provider's failure, retried elsewhere, its bytes never
        shown. A JSON error object (read on from ``body``, at most
        :data:`MAX_ERROR_BODY_BYTES`, until ``deadline`` or for
        :data:`ERROR_BODY_TIMEOUT_SECONDS`) is the upstream's error, as an error event
        would be (:meth:`error_event`: a client error is answered 400, not retried)."""
        if what == "a JSON body":
            data = start
            loop = asyncio.get_running_loop()
            by = loop.time() + ERROR_BODY_TIMEOUT_SECONDS
            with contextlib.suppress(UpstreamFailure, TimeoutError):
                async with asyncio.timeout_at(by if deadline is None else min(by, deadline)):
                    with upstream_errors():
                        while _json_value(data) is None and len(data) < MAX_ERROR_BODY_BYTES:
                            more = await anext(body, None)  # up to a whole JSON value, not the body's end
                            if more is None:
                                break
                            data += more
            parsed = _json_value(data)
            if isinstance(parsed, dict) and parsed.get("error") is not None and "choices" not in parsed:
                error = parsed["error"]  # an OpenAI error object, or a bare string
                return self.error_event(provider, endpoint, error if isinstance(error, dict) else {"message": str(error)})
        return self.bad_response(provider, endpoint, f"answered a stream with {what} instead of an event stream")

    def redirect_refused(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        status: int,
        location: str | None,
        url: str,
        *,
        followed: str | None = None,
    ) -> AttemptFailed:
        """A redirect not followed (:meth:`bad_response`): a loop when it names ``url``
        itself (or, after the one redirect followed, to ``followed``, either URL again);
        a second redirect after ``followed``; else one latgate does not follow. The
        access line's cause names the ``Location``'s path, never its host, port or query
        (they may be internal addresses or carry a key); so does the client's message
        unless the Location is on another origin (then only the status and that it was
        cross-origin)."""
        shown = f"HTTP {status} to {redirect_path(url, location)}" if location else f"HTTP {status} without a Location"
        target = same_origin_location(followed or url, location) if location and status in SAME_ORIGIN_REDIRECTS else None
        if target is not None and target in (url, followed):
            if followed is None:
                what = f"a redirect loop ({shown}, the URL it was sent): not followed; check that api_base names the address the engine serves"
            else:
                what = (
                    f"a redirect loop ({shown}, after a redirect to {redirect_path(url, followed)}): not followed; "
                    "check that api_base names the address the engine serves"
                )
            cause = f"redirect loop: {shown}"
        elif location and same_origin_location(url, location) is None:
            # another origin: its path (a tenant id, a presigned token) is for the log only
            what = f"a redirect to another origin (HTTP {status}), which latgate does not follow"
            cause = f"redirect refused: {shown}, another origin; set api_base to the address it names"
        elif followed is not None:
            what = (
                f"a second redirect ({shown}, after one to {redirect_path(url, followed)}): latgate follows one 307/308 "
                "to the same host only; set api_base to the address the engine serves"
            )
            cause = f"second redirect: {shown}"
        else:
            what = (
                f"a redirect ({shown}) latgate does not follow: only one 307/308 to the same host is followed; "
                "set api_base to the address it names"
            )
            cause = f"redirect refused: {shown}"
        failed = self.bad_response(provider, endpoint, f"answered with {what}")
        failed.error.cause = cause
        return failed

    def bad_response(self, provider: ProviderRuntime, endpoint: EndpointRuntime, what: str) -> AttemptFailed:
        """An answer latgate cannot relay (wrong status, type or encoding): the provider's
        failure (counted as ``bad_response``), retried elsewhere, shown as a 502
        ``provider NAME {what}``."""
        self.pool.record_outcome(provider, endpoint, ok=False)
        self.metrics.record_upstream_error(provider=provider.name, kind="bad_response")
        return AttemptFailed(UpstreamError(f"provider {provider.name!r} {what}"), retryable=True)


def _json_value(data: bytes) -> Any:
    """``data`` parsed as JSON, or ``None`` while it is not (yet) a whole JSON value."""
    try:
        return orjson.loads(data) if data.rstrip().endswith((b"}", b"]")) else None
    except orjson.JSONDecodeError:
        return None


def redirect_path(url: str, location: str) -> str:
    """The path ``location`` names, resolved against ``url`` (no scheme, host, port,
    query or fragment), masked where it looks like a key."""
    return mask_secrets(urlsplit(urljoin(url, location.strip())).path or "/")


def aborted_answer(answer: dict[str, Any]) -> bool:
    """A non-streamed answer some choice of which ended in ``finish_reason: "abort"``:
    vLLM answers an in-flight request so (a 200 with a truncated body) when it shuts
    down; nothing reached the client, so it is the provider's failure, retried."""
    choices = answer.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices)


RETRY_AFTER_CAP_SECONDS = 3600.0
"""The longest upstream ``Retry-After`` latgate believes (and passes on)."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """An upstream's ``Retry-After`` in seconds (RFC 9110 §10.2.3: delay-seconds, or an
    HTTP date, read as whole seconds from ``now``, Unix time, by default the wall
    clock's), within 0 .. :data:`RETRY_AFTER_CAP_SECONDS`; None when absent, not a
    finite number nor a date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 5.6.7: HTTP dates are GMT
            when = when.replace(tzinfo=datetime.UTC)
        seconds = math.ceil(when.timestamp() - (time.time() if now is None else now))
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_CAP_SECONDS)


def retry_after_header(value: str, seconds: float) -> str:
    """The ``Retry-After`` passed on for an upstream's ``value`` read as ``seconds``
    (:func:`parse_retry_after`): as sent when it is a number within bounds, else the
    seconds (a date becomes seconds, so every client reads one form)."""
    try:
        if float(value) == seconds:
            return value.strip()
    except ValueError:
        pass
    return format(seconds, "g")


def provider_secrets(provider: ProviderRuntime) -> tuple[bytes, ...]:
    """The provider's key as it could appear in an echo (the bare key, not only the header)."""
    return bare_key(provider.auth_headers.get("authorization", ""))


def _credentials_hint(provider: ProviderRuntime) -> str:
    """What the operator should check when ``provider`` refuses latgate's key (for the log)."""
    env = provider.config.api_key_env
    if not env:
        return "it has no api_key_env: configure one"
    if provider.auth_headers.get("authorization"):
        return f"the key in {env} is set but was rejected"
    return f"{env} is not set in the gateway's environment"


def upstream_error(provider: ProviderRuntime, status: int, data: bytes) -> GatewayError:
    """The client-facing error for an upstream's non-200 answer, in the OpenAI envelope."""
    message = None
    err_type = "api_error" if status >= 500 else "invalid_request_error"
    code: str | None = None
    param = None
    secrets = provider_secrets(provider)
    try:  # redacted as written (any escape form of the key), then every decoded string again
        parsed = redact_json(orjson.loads(redact(data, secrets)), secrets) if data else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        if status in PASSTHROUGH_STATUSES and isinstance(err, dict) and isinstance(err.get("message"), str):
            return UpstreamClientError(err, status=status)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail")
            err_type = upstream_label(err.get("type")) or err_type  # the access log's and /ui's error kind:
            code = upstream_label(err.get("code"))  # bounded, no control characters
            param = err.get("param") if isinstance(err.get("param"), str) else None
        elif isinstance(err, str):
            message = err
    if status in PROVIDER_AUTH_STATUSES:
        # The client's own key is fine: answering 401/403 would make an SDK report it as
        # invalid. A gateway error naming only the provider; the operator's hint is logged.
        message = f"provider {provider.name!r} rejected latgate's credentials (HTTP {status})"
        log.warning("%s: %s", message, _credentials_hint(provider))
        error = UpstreamError(message, status=502, code="provider_auth_failed")
        error.type = "api_error"
        return error
    elif not message:
        message = f"provider {provider.name!r} returned HTTP {status}"
    else:
        message = f"provider {provider.name!r}: {redact_text(str(message), secrets)}"
    if status == 429:
        err_type = "rate_limit_error"
    error = UpstreamError(message, status=status, code=code, param=param)
    error.type = err_type
    return error
