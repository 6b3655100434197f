"""The egress settings a config may give, read and checked without any I/O but a TLS
context's files: proxy URLs (:class:`Proxy`, the environment's proxy variables) and the
TLS context for ``ca_file`` / ``client_cert`` / ``client_key`` / ``verify``
(:func:`tls_context`). The config loader checks them at load; the upstream client's
:mod:`latgate.transport.egress` builds each provider's way out from them (its docstring
gives the rules: which variable applies to which scheme, ``NO_PROXY``, CONNECT)."""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["Proxy", "env_proxy_problems", "env_proxy_urls", "env_value", "mask_proxy", "tls_context"]


@dataclass(frozen=True, slots=True)
class Proxy:
    """An ``http://`` proxy: where to connect, and its Basic credentials (the header
    value, or ``None``)."""

    host: str
    port: int
    authorization: str | None
    shown: str  # the URL with the password masked, for ``latgate check``

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """Raises:
        ValueError: not an ``http://HOST[:PORT]`` URL (the message names no password)."""
        parts = urlsplit(url.strip() if "://" in url else "http://" + url.strip())
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"proxy {mask_proxy(url)!r} is not an http://HOST:PORT URL (only http proxies are spoken)")
        auth = None
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")
        return cls(host=parts.hostname, port=parts.port or 80, authorization=auth, shown=mask_proxy(url))


def mask_proxy(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{hostpart}"


def env_value(env: Mapping[str, str], name: str) -> str:
    """The variable ``name`` in ``env``, lower case first (as curl and httpx read proxies); ``""`` when unset."""
    return env.get(name.lower()) or env.get(name.upper()) or ""


#: SSL contexts by their settings and files' modification times: a reload with the same
#: files keeps the context (and so the warm connections keyed by it).
_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}


def tls_context(
    *, ca_file: str | None, client_cert: str | None, client_key: str | None, verify: bool, env: Mapping[str, str]
) -> tuple[ssl.SSLContext | None, tuple[Any, ...] | None]:
    """The TLS context for these settings and its cache key; ``(None, None)`` when the
    client's default one serves (no setting, no ``SSL_CERT_FILE``/``SSL_CERT_DIR``).

    Raises:
        OSError, ssl.SSLError: a file that cannot be read or is not PEM.
    """
    cafile = ca_file or env.get("SSL_CERT_FILE") or None
    capath = None if ca_file else env.get("SSL_CERT_DIR") or None
    if cafile is None and capath is None and client_cert is None and verify:
        return None, None
    files = [f for f in (cafile, client_cert, client_key) if f]
    key = (cafile, capath, client_cert, client_key, verify, *(os.stat(f).st_mtime_ns for f in files))
    context = _CONTEXTS.get(key)
    if context is None:
        if not verify or (cafile is None and capath is None):
            context = default_tls_context(verify=verify)
        else:
            context = ssl.create_default_context(cafile=cafile, capath=capath)
        if client_cert:
            context.load_cert_chain(client_cert, client_key)
        _CONTEXTS[key] = context
    return context, key


def default_tls_context(*, verify: bool = True) -> ssl.SSLContext:
    """A new TLS context for upstreams whose provider names no CA: certifi's bundle of
    Mozilla's roots (the same on every host, whatever its system store holds; what the
    openai SDK trusts by default), host names checked. ``verify=False``: nothing is
    checked (a provider's ``verify = false``)."""
    if not verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    import certifi  # loading the bundle takes tens of ms: callers make one context early

    return ssl.create_default_context(cafile=certifi.where())


def env_proxy_urls(env: Mapping[str, str]) -> dict[str, str]:
    """The environment's proxy URL for each scheme that has one (``{"https": ...}``)."""
    every = env_value(env, "all_proxy")
    return {scheme: url for scheme in ("http", "https") if (url := env_value(env, f"{scheme}_proxy") or every)}


def env_proxy_problems(env: Mapping[str, str]) -> list[str]:
    """One line per proxy variable latgate cannot use (not ``http://``), password
    masked: requests that would use it go direct (a start-up warning)."""
    problems = []
    for scheme, url in env_proxy_urls(env).items():
        try:
            Proxy.parse(url)
        except ValueError as exc:
            problems.append(f"{scheme.upper()}_PROXY: {exc}; {scheme} upstreams are reached directly")
    return problems
