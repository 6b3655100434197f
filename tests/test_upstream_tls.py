"""TLS to hosted upstreams: a private CA made at test time, trusted through a
provider's ``ca_file`` or ``SSL_CERT_FILE``; a client certificate (mutual TLS);
``verify = false`` with its start-up warning; and a failed handshake's error naming
the reason (unknown CA, expired, hostname mismatch). Upstreams on loopback.
"""

from __future__ import annotations

import httpx
import pytest
from h1_upstreams import CHAT, SECRET, RawUpstream, config, json_reply, keep_serving
from stack import gateway
from tls_upstreams import private_ca

from latgate.config import load_config_text
from latgate.config.warnings import config_warnings


def ask(v1: str) -> httpx.Response:
    return httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)


def test_a_private_ca_is_trusted_through_ca_file(tmp_path) -> None:
    authority = private_ca(tmp_path)
    with (
        RawUpstream(keep_serving(json_reply()), tls=authority.server()) as up,
        gateway(config(up.base_url, extra=f'ca_file = "{authority.ca_file}"\n'), env={"UP_KEY": SECRET}) as gw,
    ):
        assert ask(gw.v1).status_code == 200
    assert up.requests


def test_a_private_ca_is_trusted_through_ssl_cert_file(tmp_path) -> None:
    authority = private_ca(tmp_path)
    with RawUpstream(keep_serving(json_reply()), tls=authority.server()) as up:
        env = {"UP_KEY": SECRET, "SSL_CERT_FILE": str(authority.ca_file)}
        with gateway(config(up.base_url), env=env) as gw:
            assert ask(gw.v1).status_code == 200


def test_a_client_certificate_is_presented_for_mutual_tls(tmp_path) -> None:
    authority = private_ca(tmp_path)
    (tmp_path / "clients").mkdir()
    clients = private_ca(tmp_path / "clients")
    chain, key = clients.client_files()
    server = authority.server(client_ca=clients.ca)
    with RawUpstream(keep_serving(json_reply()), tls=server) as up:
        plain = config(up.base_url, extra=f'ca_file = "{authority.ca_file}"\n')
        with gateway(plain + f'client_cert = "{chain}"\nclient_key = "{key}"\n', env={"UP_KEY": SECRET}) as gw:
            assert ask(gw.v1).status_code == 200
        with gateway(plain, env={"UP_KEY": SECRET}) as gw:
            refused = ask(gw.v1)
    # TLS 1.3: the server checks the client certificate after the client's handshake ends,
    # so without one the upstream closes the connection before reading the request
    assert refused.status_code == 502 and "upstream closed the connection" in refused.json()["error"]["message"]
    assert len(up.requests) == 1


@pytest.mark.parametrize(
    ("names", "expired", "trusted", "reason"),
    [
        ((), False, False, "TLS: unknown CA"),
        ((), True, True, "TLS: certificate expired"),
        (("other.example.test",), False, True, "TLS: hostname mismatch"),
    ],
    ids=["unknown-ca", "expired", "hostname-mismatch"],
)
def test_a_failed_handshake_names_its_reason(tmp_path, names, expired, trusted, reason) -> None:
    authority = private_ca(tmp_path)
    with RawUpstream(keep_serving(json_reply()), tls=authority.server(*names, expired=expired)) as up:
        extra = f'ca_file = "{authority.ca_file}"\n' if trusted else ""
        with gateway(config(up.base_url, extra=extra), env={"UP_KEY": SECRET}) as gw:
            response = ask(gw.v1)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert f"could not connect to upstream: {reason}" in message
    assert str(up.port) not in message and "other.example.test" not in message


def test_verify_false_connects_and_is_warned_about_by_name(tmp_path) -> None:
    authority = private_ca(tmp_path)
    with RawUpstream(keep_serving(json_reply()), tls=authority.server()) as up:
        text = config(up.base_url, extra="verify = false\n")
        with gateway(text, env={"UP_KEY": SECRET}) as gw:
            assert ask(gw.v1).status_code == 200
            warnings = config_warnings(gw.config, {"UP_KEY": SECRET})
    assert any(w.startswith('provider "up": verify = false') for w in warnings)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('ca_file = "/nonexistent/ca.pem"\n', "ca_file"),
        ('client_key = "/nonexistent/k.pem"\n', "client_key"),
        ('verify = "no"\n', "verify"),
    ],
)
def test_unusable_tls_settings_are_config_errors(extra: str, key: str) -> None:
    with pytest.raises(Exception, match=key):
        load_config_text(config("https://127.0.0.1:9/v1", extra=extra), source="t.toml", env={})


def test_tls_files_are_found_relative_to_the_config_file(tmp_path) -> None:
    authority = private_ca(tmp_path)
    config_file = tmp_path / "config.toml"
    config_file.write_text(config("https://127.0.0.1:9/v1", extra='ca_file = "private-ca.pem"\n'))
    loaded = load_config_text(config_file.read_text(), source=str(config_file), env={})
    assert loaded.providers["up"].ca_file == str(authority.ca_file)
