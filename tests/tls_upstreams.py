"""Certificates made at test time (trustme): a private CA, server contexts for https
upstreams on loopback (valid, expired, for another name, asking for a client
certificate) and the PEM files a provider's ``ca_file``/``client_cert`` name."""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

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
