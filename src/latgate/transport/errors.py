"""The one exception for a failed upstream exchange (:class:`UpstreamFailure`), and the
one translation of foreign exceptions into it (:func:`as_upstream_failure`)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
from collections.abc import Iterator

#: connect(2) errors that are latgate's own shortage, not the upstream's failure:
#: no descriptor (per process, system-wide), no buffer space, no local port.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.EADDRNOTAVAIL})
LOCAL_SHORTAGE = "latgate has no free file descriptor or buffer for a new connection"


class UpstreamFailure(Exception):
    """Talking to an upstream failed without an HTTP status to show for it.

    Its message names the cause (:func:`failure_cause`), never the upstream URL, host
    or any header value.

    Attributes:
        kind: ``connect`` (refused, reset, DNS, TLS before any response), ``timeout``
            (connect, read or first-token deadline), ``read`` (the connection broke or
            the response was malformed after it started), ``request`` (latgate could
            not send it: e.g. a key holding a newline); latgate's own limits:
            ``overloaded`` (the provider's connection pool stayed full), ``local`` (no
            descriptor or buffer for a connection), ``too_large`` (an event or body past
            ``max_event_bytes`` / ``max_response_bytes``). The
            ``latgate_upstream_errors_total`` label.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def fresh(self) -> UpstreamFailure:
        """A new failure like this one, to raise where this one is kept (an upstream
        connection's ``error``): raising the kept one would give it a traceback of the
        raising frames, which hold the connection, and so tie them, and the request
        body they reference, into a cycle only the cyclic collector frees."""
        return UpstreamFailure(self.kind, str(self))


#: OpenSSL verification codes (``X509_V_ERR_*``) and the reason latgate names.
_VERIFY_REASONS = {
    9: "certificate not yet valid",
    10: "certificate expired",
    18: "unknown CA (self-signed certificate)",
    19: "unknown CA (self-signed certificate in the chain)",
    20: "unknown CA (issuer not trusted)",
    21: "unknown CA (issuer not trusted)",
    23: "certificate revoked",
    62: "hostname mismatch",
    64: "hostname mismatch (the certificate does not name this IP address)",
}


#: TLS alerts an upstream sends about latgate's client certificate (OpenSSL reasons; RFC
#: 8446 section 6.2): in TLS 1.3 the server checks it after the client's handshake is
#: done, so they arrive on the first read, not from the handshake.
_CLIENT_CERT_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "client certificate required",
    "TLSV1_ALERT_UNKNOWN_CA": "client certificate rejected (unknown CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "client certificate rejected (bad certificate)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "client certificate rejected",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "client certificate rejected (expired)",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "client certificate rejected (revoked)",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "client certificate rejected (unsupported)",
    "TLSV1_ALERT_ACCESS_DENIED": "client certificate rejected (access denied)",
}


def client_certificate_alert(exc: BaseException | None) -> str | None:
    """``TLS: client certificate required`` / ``TLS: client certificate rejected
    (REASON)`` when ``exc`` is the upstream's TLS alert about latgate's client
    certificate, else ``None``."""
    if not isinstance(exc, ssl.SSLError):
        return None
    named = _CLIENT_CERT_ALERTS.get(str(getattr(exc, "reason", "") or ""))
    return None if named is None else f"TLS: {named}"


def failure_cause(exc: BaseException) -> str:
    """What kind of failure a socket or TLS exception was, in a few words naming neither
    host nor URL: ``DNS name not found``, ``connection refused``, ``connection reset``,
    ``TLS: certificate expired`` / ``TLS: unknown CA (...)`` / ``TLS: hostname
    mismatch`` / ``TLS: client certificate required`` / ``TLS: client certificate
    rejected (...)`` / ``TLS: REASON`` (OpenSSL's reason code), else the OS error's text."""
    if isinstance(exc, socket.gaierror):
        return "DNS name not found"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        return "TLS: " + _VERIFY_REASONS.get(code, f"certificate not accepted (OpenSSL code {code})")
    if isinstance(exc, ssl.SSLError):
        alert = client_certificate_alert(exc)
        if alert is not None:
            return alert
        reason = getattr(exc, "reason", None) or type(exc).__name__
        return "TLS: " + str(reason).lower().replace("_", " ")
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return "connection reset"
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return type(exc).__name__


def connect_failure(exc: BaseException) -> UpstreamFailure:
    """The :class:`UpstreamFailure` for an exception raised while connecting (TCP, proxy
    tunnel, TLS handshake): ``timeout`` for a ``TimeoutError``, else ``connect``."""
    if isinstance(exc, UpstreamFailure):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamFailure("timeout", "upstream timed out: connect")
    return UpstreamFailure("connect", f"could not connect to upstream: {failure_cause(exc)}")


@contextlib.contextmanager
def upstream_errors() -> Iterator[None]:
    """Translate foreign exceptions raised while reading an upstream into
    :class:`UpstreamFailure` (:func:`as_upstream_failure`)."""
    try:
        yield
    except (OSError, ValueError) as exc:  # TimeoutError is an OSError
        raise as_upstream_failure(exc) from None


def as_upstream_failure(exc: OSError | ValueError) -> UpstreamFailure:
    """The :class:`UpstreamFailure` for a foreign exception of an upstream exchange: a
    timeout is ``timeout``; latgate's own shortage of descriptors or buffers ``local``
    (never the upstream's failure); a refused connection, a DNS or TLS failure
    ``connect``; another socket error ``read``; a ``ValueError`` (a client library
    refusing the request itself, e.g. a key with a newline) ``request``."""
    if isinstance(exc, TimeoutError):
        return UpstreamFailure("timeout", "upstream timed out")
    if isinstance(exc, ValueError):
        return UpstreamFailure("request", "the request could not be sent (check the provider's key and URL)")
    root = _root_cause(exc)
    if root is not None and root.errno in LOCAL_ERRNOS:
        return UpstreamFailure("local", LOCAL_SHORTAGE)
    alert = client_certificate_alert(root)
    if alert is not None:  # TLS 1.3: refused after the handshake, on the first read
        return UpstreamFailure("connect", f"could not connect to upstream: {alert}")
    if isinstance(root, ConnectionRefusedError | socket.gaierror | ssl.SSLCertVerificationError):
        return UpstreamFailure("connect", f"could not connect to upstream: {failure_cause(root)}")
    return UpstreamFailure("read", f"upstream connection failed ({failure_cause(root or exc)})")


def _root_cause(exc: BaseException) -> OSError | None:
    """The socket or TLS error under an exception chain, if any: the first with an
    errno (or a TLS error) when a plain one wraps it (anyio's "all connection attempts
    failed")."""
    seen = 0
    found: OSError | None = None
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, OSError) and not isinstance(current, TimeoutError):
            if current.errno is not None or isinstance(current, ssl.SSLError):
                return current
            found = found or current
        current = current.__cause__ or current.__context__
        seen += 1
    return found
