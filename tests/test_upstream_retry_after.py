"""An upstream's ``Retry-After`` on a 429 or a 503, as delay-seconds or as an HTTP
date, reaches the client (a date converted to whole seconds, so every client reads one
form) and marks the endpoint busy for that long (``queue_ms`` in ``/admin/providers``),
so latgate's own routing backs off it too. Through a real gateway and a raw upstream on
loopback; the reading itself is a pure function tested on plain data."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest
from h1_upstreams import CHAT, json_reply, keep_serving, stack_on

from latgate.forwarding.failures import parse_retry_after, retry_after_header

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("12", 12.0),
        (email.utils.formatdate(NOW + 30, usegmt=True), 30.0),
        (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),  # already past: now
        ("Sunday, 06-Nov-94 08:49:37 GMT", 0.0),  # RFC 850, obsolete but readable
        ("Wed, 21 Oct 2099 07:28:00 GMT", 3600.0),  # bounded
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(value: str, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_a_date_is_read_in_whole_seconds_rounded_up() -> None:
    assert parse_retry_after(email.utils.formatdate(NOW + 30, usegmt=True), now=NOW + 0.5) == 30.0


def test_a_date_is_passed_on_as_seconds_and_a_number_as_sent() -> None:
    assert retry_after_header("Wed, 21 Oct 2099 07:28:00 GMT", 3600.0) == "3600"
    assert retry_after_header("2.5", 2.5) == "2.5"
    assert retry_after_header("-5", 0.0) == "0"


def _queue_ms(v1: str) -> float:
    providers = httpx.get(v1.removesuffix("/v1") + "/admin/providers", timeout=10).json()["providers"]
    (endpoint,) = providers["up"]["endpoints"]
    return endpoint["queue_ms"]


@pytest.mark.parametrize("status", [b"429 Too Many Requests", b"503 Service Unavailable"])
@pytest.mark.parametrize("form", ["seconds", "date"])
def test_an_upstream_retry_after_reaches_the_client_and_backs_the_endpoint_off(status: bytes, form: str) -> None:
    value = b"8" if form == "seconds" else email.utils.formatdate(time.time() + 8, usegmt=True).encode()
    reply = json_reply(b'{"error":{"message":"later"}}', status=status, extra=b"retry-after: %s\r\n" % value)
    with stack_on(keep_serving(reply), retries=0) as (_, v1, _app):
        answer = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        queue_ms = _queue_ms(v1)
    assert answer.status_code == int(status[:3]), answer.text
    sent = answer.headers["retry-after"]
    assert sent.isdigit() and 1 <= int(sent) <= 9, sent
    assert queue_ms > 1000, queue_ms  # busy for (what is left of) its Retry-After
