"""The one exception for a failed upstream exchange, whatever client library was used."""

from __future__ import annotations


class UpstreamFailure(Exception):
    """Talking to an upstream failed without an HTTP status to show for it.

    Its message never names the upstream URL, host or any header value.

    Attributes:
        kind: ``connect`` (refused, reset, DNS, TLS before any response), ``timeout``
            (connect, read or first-token deadline), ``read`` (the connection broke or
            the response was malformed after it started), ``request`` (latgate could
            not send it: e.g. a key holding a newline). The
            ``latgate_upstream_errors_total`` label.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
