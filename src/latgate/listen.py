"""Binding listening sockets up front, so a taken port is one clear line, not a traceback."""

from __future__ import annotations

import socket


class ListenError(OSError):
    """The address could not be bound; the message says which and what to do."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound and listening on ``host:port`` (IPv4 or IPv6 literal, or a name).

    Raises:
        ListenError: the address is taken or not local, with the address in the message.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = " (is another latgate or simulator running? pick another port)" if exc.errno == 98 else ""
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock
