"""TLS to hosted upstreams: a private CA made at test time, trusted through a
provider's ``ca_file`` or ``SSL_CERT_FILE``; a client certificate (mutual TLS);
``verify = false`` with its start-up warning; and a failed handshake's error naming
the reason (unknown CA, expired, hostname mismatch; a client certificate the upstream
requires or rejects, from its alert). Upstreams on loopback.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import openai
import pytest
from h1_upstreams import (
    CHAT,
    SECRET,
    RawUpstream,
    access_lines,
    assert_clean_logs,
    config,
    json_reply,
    keep_serving,
)
from stack import gateway
from tls_upstreams import AlertingTLSUpstream, private_ca

from latgate.foundation.config import load_config_text
from latgate.foundation.config.warnings import config_warnings


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
    # TLS 1.3: the server checks the client certificate after the client's handshake ends;
    # asyncio's server sends no alert, so all latgate sees is the connection closed
    assert refused.status_code == 502 and "upstream closed the connection" in refused.json()["error"]["message"]
    assert len(up.requests) == 1


@pytest.mark.parametrize(
    ("presented", "reason"),
    [("none", "TLS: client certificate required"), ("another-ca", "TLS: client certificate rejected (unknown CA)")],
)
def test_a_refused_client_certificate_is_named_from_the_upstream_s_alert(tmp_path, presented, reason, caplog) -> None:
    """A TLS 1.3 server requiring a client certificate refuses a missing or untrusted one
    with an alert after the client's handshake ended (RFC 8446 section 4.4.2.4): latgate
    names it, where it read "upstream closed the connection"."""
    authority = private_ca(tmp_path)
    (tmp_path / "clients").mkdir()
    trusted = private_ca(tmp_path / "clients")
    (tmp_path / "strangers").mkdir()
    chain, key = private_ca(tmp_path / "strangers").client_files()
    extra = f'ca_file = "{authority.ca_file}"\n'
    if presented == "another-ca":
        extra += f'client_cert = "{chain}"\nclient_key = "{key}"\n'
    caplog.set_level(logging.INFO, logger="latgate.access")
    with AlertingTLSUpstream(authority.server(client_ca=trusted.ca), json_reply()) as up:
        with gateway(config(up.base_url, extra=extra), env={"UP_KEY": SECRET}) as gw:
            client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=15)
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="m", messages=CHAT["messages"])
        assert up.failures  # the server did refuse the handshake
    assert caught.value.status_code == 502
    message = caught.value.body["message"]
    assert message == f"provider 'up' is unavailable: could not connect to upstream: {reason}"
    (line,) = access_lines(caplog)
    assert line["cause"] == f"could not connect to upstream: {reason}"
    assert_clean_logs(caplog)


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


def test_check_probe_names_a_required_client_certificate(tmp_path) -> None:
    authority = private_ca(tmp_path)
    (tmp_path / "clients").mkdir()
    trusted = private_ca(tmp_path / "clients")
    with AlertingTLSUpstream(authority.server(client_ca=trusted.ca), json_reply()) as up:
        path = tmp_path / "config.toml"
        path.write_text(config(up.base_url, extra=f'ca_file = "{authority.ca_file}"\n'))
        result = subprocess.run(
            [sys.executable, "-m", "latgate", "check", "--config", str(path), "--probe"],
            check=False, capture_output=True, text=True, env={**os.environ, "UP_KEY": SECRET}, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "TLS: client certificate required" in result.stdout, result.stdout
    assert SECRET not in result.stdout + result.stderr and "Traceback" not in result.stderr
