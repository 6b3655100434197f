"""Binding listening sockets up front, so a taken port is one clear line, not a traceback."""

from __future__ import annotations

import resource
import socket


class ListenError(OSError):
    """The address could not be bound; the message says which and what to do."""


def bind_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound (and listening, unless ``listen`` is false) on ``host:port``
    (IPv4 or IPv6 literal, or a name).

    ``reuse_port``: ``SO_REUSEPORT`` (socket(7)): each worker of ``--workers N`` listens
    on a socket of its own on the same port and the kernel spreads new connections
    evenly over them (by a hash of the connection), instead of waking whichever worker
    is first in ``accept`` on one shared socket.

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
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
        if listen:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = " (is another latgate or simulator running? pick another port)" if exc.errno == 98 else ""
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock


def reserve_port(host: str, port: int) -> socket.socket:
    """Hold ``host:port`` for workers that each listen with ``SO_REUSEPORT``: checked
    free first by a plain bind (so a port another process uses, even another latgate's
    workers, is refused as taken), then held by a bound socket with ``SO_REUSEPORT``
    that never listens (so it gets no connections). ``port`` 0 picks a free port (read
    it from the returned socket).

    Raises:
        ListenError: as :func:`bind_socket`.
    """
    probe = bind_socket(host, port, listen=False)
    chosen = probe.getsockname()[1]
    probe.close()
    return bind_socket(host, chosen, reuse_port=True, listen=False)


#: Descriptors kept back from client connections for everything else the process opens
#: (log files, health probes, the Redis client, the interpreter's own).
RESERVED_DESCRIPTORS = 256


def raise_descriptor_limit() -> tuple[int, int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (getrlimit(2): the soft limit
    is what ``accept`` and ``connect`` meet; an unprivileged process may raise it up to
    the hard one). Returns ``(soft before, soft now, hard)``; an unlimited hard limit
    is capped at 1,048,576 (the kernel's default ``nr_open``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft, hard
        return soft, target, hard
    return soft, soft, hard


def default_max_connections(soft_limit: int) -> int:
    """The client connection cap for a descriptor limit: each proxied request holds two
    descriptors (the client's and the upstream's), after :data:`RESERVED_DESCRIPTORS`."""
    return max(16, (soft_limit - RESERVED_DESCRIPTORS) // 2)
