"""``[server] host``: the address latgate listens on.

Two checks, split by what they depend on:

- :func:`check_host` (the loader, so ``check``, ``serve`` and a reload alike): the
  value's form, the same on every machine. An IP literal must be a valid IPv4 or IPv6
  address a TCP client can reach (not multicast, not the broadcast address); anything
  else must be a host name (letters, digits, ``-``, ``_`` in dot-separated labels of at
  most 63 characters, RFC 1123). A URL, a ``HOST:PORT`` or a bracketed IPv6 address
  gets a fix naming what to write instead.
- :func:`probe_listen_host` (``latgate check`` only): whether ``serve`` on this machine
  could listen there. That depends on the machine (a config may be checked in CI for
  another host), so it is a warning, not an error. ``localhost`` is not looked up; an
  IP literal is tried without any lookup (``AI_NUMERICHOST``); another name is looked up
  with the local resolver (getaddrinfo(3): ``/etc/hosts``, then whatever DNS the machine
  uses). The address is then bound on a free port and released at once (bind(2): no
  packet is sent), which tells whether it belongs to this machine.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import SplitResult, urlsplit

from latgate.foundation.config.errors import Problems
from latgate.foundation.config.keys import show

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_HOST_PORT = re.compile(r"^([^:\[\]]+):(\d+)$")
_BRACKETED = re.compile(r"^\[([^\]]*)\](?::(\d+))?$")
_EXAMPLES = (
    'e.g. host = "127.0.0.1" (this machine only), "0.0.0.0" (every interface) or "::" (every IPv6 interface)'
)
KEY = "server.host"


def check_host(host: str, problems: Problems) -> None:
    """Report ``host`` at ``server.host`` unless it is a usable IP literal or a host name
    (see the module docstring); nothing is looked up."""
    problem = _form_problem(host)
    if problem is not None:
        problems.add(KEY, *problem)


def _form_problem(host: str) -> tuple[str, str] | None:
    """``(what is wrong, fix)`` for a host of the wrong form, else None."""
    if not host.strip():
        return "empty address", f"write an address or remove the key ({_EXAMPLES})"
    if any(c.isspace() for c in host):
        inside = any(c.isspace() for c in host.strip())
        return f"{show(host)} has spaces in it", _EXAMPLES if inside else f"write host = {show(host.strip())}"
    if "://" in host:
        parts = urlsplit(host)
        fix = f"write only the address: host = {show(parts.hostname)}" if parts.hostname else _EXAMPLES
        url_port = _port_of(parts)
        return f"{show(host)} is a URL, not an address", fix + (f", port = {url_port}" if url_port else "")
    if (bracketed := _BRACKETED.match(host)) is not None:
        inner, port = bracketed.groups()
        fix = f"write it without brackets: host = {show(inner)}" + (f", port = {port}" if port else "")
        return f"{show(host)} has brackets (they belong in URLs only)", fix
    if (host_port := _HOST_PORT.match(host)) is not None:
        name, port = host_port.groups()
        return (
            f"{show(host)} includes a port",
            f"give the port its own key: host = {show(name)}, port = {port}",
        )
    if ":" in host or all(c.isdigit() or c == "." for c in host):
        return _address_problem(host)
    if len(host.rstrip(".")) > 253 or not all(_LABEL.match(label) for label in host.rstrip(".").split(".")):
        return (
            f"{show(host)} is neither an IP address nor a host name",
            f'a host name is letters, digits and "-" in dot-separated parts; {_EXAMPLES}',
        )
    return None


def _address_problem(host: str) -> tuple[str, str] | None:
    """An IP literal: invalid, or one no TCP client can connect to."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if ":" in host:
            return (
                f"{show(host)} is not an IPv6 address",
                'e.g. host = "::1" (this machine only) or "::" (every interface)',
            )
        return f"{show(host)} is not an IPv4 address (4 numbers from 0 to 255, separated by dots)", _EXAMPLES
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        kind = "multicast" if address.is_multicast else "broadcast"
        return f"{show(host)} is a {kind} address, which no TCP client can connect to", _EXAMPLES
    return None


def _port_of(parts: SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def probe_listen_host(host: str) -> tuple[str | None, str | None]:
    """Whether ``latgate serve`` on this machine could listen on ``host`` (a value
    :func:`check_host` accepted).

    Returns ``(address, warning)``: ``address`` is what a host name resolves to (None
    for ``localhost``, an IP literal, or a name that does not resolve); ``warning`` says
    why serving there would fail (the name does not resolve, or the address is not one
    of this machine's), None when it would not. Blocks for as long as the local
    resolver takes for a name; sends nothing itself.
    """
    if host.lower() == "localhost":
        return None, None
    literal = _is_ip_literal(host)
    flags = socket.AI_PASSIVE | (socket.AI_NUMERICHOST if literal else 0)
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=flags)
    except socket.gaierror as exc:
        return None, (
            f"server.host {host} does not resolve on this machine ({exc.strerror}): latgate serve here "
            "cannot listen on it (fine if this config is for another machine)"
        )
    family, kind, proto, _, sockaddr = infos[0]  # the address bind_socket would take
    address = None if literal else str(sockaddr[0])
    with socket.socket(family, kind, proto) as sock:
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            named = host if literal else f"{host} ({sockaddr[0]})"
            return address, (
                f"server.host {named} is not an address of this machine ({exc.strerror}): latgate serve "
                'here cannot listen on it (fine if this config is for another machine; "0.0.0.0" listens on every interface)'
            )
    return address, None


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
