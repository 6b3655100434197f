"""Certificates made at test time (trustme): a private CA, server contexts for https
upstreams on loopback (valid, expired, for another name, asking for a client
certificate) and the PEM files a provider's ``ca_file``/``client_cert`` name; an https
upstream whose handshake failures reach the client as TLS alerts."""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import trustme


@dataclass
class PrivateCA:
    ca: trustme.CA
    ca_file: Path
    folder: Path

    def server(self, *names: str, expired: bool = False, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
        """A server context with a certificate for ``names`` (default ``127.0.0.1``)."""
        kwargs = {}
        if expired:
            now = datetime.datetime.now(datetime.UTC)
            kwargs = {"not_before": now - datetime.timedelta(days=30), "not_after": now - datetime.timedelta(days=1)}
        cert = self.ca.issue_cert(*(names or ("127.0.0.1",)), **kwargs)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            client_ca.configure_trust(context)
        return context

    def client_files(self) -> tuple[Path, Path]:
        """(certificate chain, key) PEM files of a client certificate this CA issued."""
        cert = self.ca.issue_cert("latgate-client@example.test")
        chain, key = self.folder / "client.pem", self.folder / "client.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return chain, key


def private_ca(folder: Path) -> PrivateCA:
    ca = trustme.CA()
    ca_file = folder / "private-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return PrivateCA(ca=ca, ca_file=ca_file, folder=folder)


class AlertingTLSUpstream:
    """An https upstream on loopback (blocking sockets, a thread) whose failed handshake
    reaches the client as its TLS alert: it half-closes and drains what the client sent
    before closing, as nginx's lingering close does. (asyncio's server drops the alert:
    it aborts the transport, and closing with the client's request unread sends an RST
    that overtakes it.) A connection whose handshake succeeds gets ``reply``.

    Attributes:
        base_url: ``https://127.0.0.1:PORT/v1``.
        failures: the server side's handshake errors, in order.
    """

    def __init__(self, context: ssl.SSLContext, reply: bytes) -> None:
        self._context = context
        self._reply = reply
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.base_url = f"https://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            raw.settimeout(5)
            conn = self._context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            try:
                conn.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                self.failures.append(str(getattr(exc, "reason", exc)))
                self._linger(socket.socket(fileno=conn.detach()))
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(self._reply)

    @staticmethod
    def _linger(sock: socket.socket) -> None:
        with sock, contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # the alert is out: FIN after it
            while sock.recv(65536):  # read what the client sent, so closing sends no RST
                pass
