"""How latgate reaches one provider's endpoints: through which HTTP proxy, and with
which TLS settings (:class:`Egress`, one per provider, built at start and reload).

Proxies, as the openai SDK (httpx) and curl read them: ``https_proxy`` /
``HTTPS_PROXY`` for https upstreams, ``http_proxy`` / ``HTTP_PROXY`` for http ones,
``all_proxy`` / ``ALL_PROXY`` for either (lower case first), and ``no_proxy`` /
``NO_PROXY``: comma-separated host names (a name matches itself and its subdomains; a
leading ``.`` or ``*.`` is ignored), IP addresses or CIDR ranges, each optionally with
``:port``, or ``*`` for every host. A provider's ``proxy = "http://..."`` replaces the
environment's (``NO_PROXY`` does not apply to it); ``proxy = false`` goes direct. Only
``http://`` proxies are spoken: https upstreams go through an HTTP ``CONNECT`` tunnel
(RFC 9110 section 9.3.6), http ones as absolute-form requests (RFC 9112 section
3.2.2); ``user:password@`` in the proxy URL is sent as ``Proxy-Authorization: Basic``.

TLS: ``ca_file`` (a PEM bundle trusted *instead of* the default roots, as curl's
``--cacert`` and httpx's ``verify=PATH``), else ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
from the environment, else the default roots (certifi); ``client_cert`` (+
``client_key`` when the key is in its own file) for mutual TLS; ``verify = false``
turns checking off (a start-up warning names the provider).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from latgate.foundation.config.egress import (
    Proxy,
    default_tls_context,
    env_proxy_problems,
    env_proxy_urls,
    env_value,
    mask_proxy,
    tls_context,
)

__all__ = [
    "Egress",
    "Proxy",
    "bypasses_proxy",
    "default_tls_context",
    "egress_for",
    "env_proxy_problems",
    "mask_proxy",
    "tls_context",
]


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """True when ``NO_PROXY``'s value ``no_proxy`` sends ``host:port`` direct (see the
    module docstring for the forms; a pure function)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.startswith("[") and "]" in entry:  # [::1]:8080
            inner, _, tail = entry[1:].partition("]")
            entry, entry_port = inner, int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
        elif entry.count(":") == 1:
            name, _, number = entry.partition(":")
            if number.isdigit():
                entry, entry_port = name, int(number)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.removeprefix("*").removeprefix(".").rstrip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


@dataclass(eq=False)
class Egress:
    """One provider's way out: the proxy for each scheme (``None``: direct) and the TLS
    context (``None``: the client's default). ``targets`` caches parsed upstream URLs
    (the HTTP/1.1 pool's business)."""

    proxies: dict[str, Proxy | None]
    no_proxy: str
    ssl_context: ssl.SSLContext | None
    tls_key: tuple[Any, ...] | None
    targets: dict[str, Any] = field(default_factory=dict)

    def proxy_for(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy a request to ``scheme://host:port`` goes through, if any."""
        proxy = self.proxies.get(scheme)
        if proxy is None or (self.no_proxy and bypasses_proxy(host, port, self.no_proxy)):
            return None
        return proxy

    def shown_proxy(self, url: str) -> str:
        """What ``latgate check`` prints: the proxy URL (password masked) or ``direct``."""
        parts = urlsplit(url)
        proxy = self.proxy_for(parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        return proxy.shown if proxy is not None else "direct"


def egress_for(provider: Any, env: Mapping[str, str]) -> Egress | None:
    """The :class:`Egress` for a :class:`~latgate.foundation.config.schema.ProviderConfig`, or
    ``None`` when it goes direct with the default TLS context (the fast path).

    Raises:
        ValueError: the provider's ``proxy`` is not ``http://`` (an unusable proxy
            variable is skipped: :func:`env_proxy_problems`); OSError/ssl.SSLError: as
            :func:`tls_context`.
    """
    setting = provider.proxy
    if setting is False:
        proxies: dict[str, Proxy | None] = {}
        no_proxy = ""
    elif isinstance(setting, str):
        one = Proxy.parse(setting)
        proxies, no_proxy = {"http": one, "https": one}, ""
    else:
        proxies = {}
        for scheme, url in env_proxy_urls(env).items():
            try:
                proxies[scheme] = Proxy.parse(url)
            except ValueError:  # not an http:// proxy: direct, and env_proxy_problems warns
                continue
        no_proxy = env_value(env, "no_proxy")
    context, key = tls_context(
        ca_file=provider.ca_file,
        client_cert=provider.client_cert,
        client_key=provider.client_key,
        verify=provider.verify,
        env=env,
    )
    if not proxies and context is None:
        return None
    return Egress(proxies=proxies, no_proxy=no_proxy, ssl_context=context, tls_key=key)
