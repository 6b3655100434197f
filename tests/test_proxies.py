"""Proxies as the openai SDK and curl honour them: ``HTTPS_PROXY`` with a ``CONNECT``
tunnel to an https upstream (private CA), ``HTTP_PROXY`` with absolute-form requests,
Basic proxy credentials (407 without them), ``NO_PROXY``, and a provider's own
``proxy = "..."`` / ``proxy = false``; ``latgate check`` shows the proxy (password
masked) and its probes go through it. Proxy and upstreams are on loopback.
"""

from __future__ import annotations

import io

import httpx
import pytest
from h1_upstreams import CHAT, SECRET, RawUpstream, config, json_reply, keep_serving
from proxies import ConnectProxy
from stack import gateway
from tls_upstreams import private_ca

from latgate.commands.check import probe, report_lines
from latgate.foundation.config import load_config_text
from latgate.foundation.config.warnings import config_warnings


def ask(v1: str) -> httpx.Response:
    return httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)


def test_an_https_upstream_is_reached_through_a_connect_tunnel(tmp_path) -> None:
    authority = private_ca(tmp_path)
    with RawUpstream(keep_serving(json_reply()), tls=authority.server()) as up, ConnectProxy() as proxy:
        text = config(up.base_url, extra=f'ca_file = "{authority.ca_file}"\n')
        with gateway(text, env={"UP_KEY": SECRET, "HTTPS_PROXY": proxy.url}) as gw:
            assert ask(gw.v1).status_code == 200
            assert ask(gw.v1).status_code == 200
    assert proxy.seen == [(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1", None)]  # one tunnel, kept alive
    assert len(up.requests) == 2 and f"Bearer {SECRET}".encode() in up.requests[0]


def test_proxy_credentials_are_sent_as_basic_and_a_407_is_named(tmp_path) -> None:
    authority = private_ca(tmp_path)
    with RawUpstream(keep_serving(json_reply()), tls=authority.server()) as up:
        text = config(up.base_url, extra=f'ca_file = "{authority.ca_file}"\n')
        with ConnectProxy(user="alice", password="s3cret-pw") as proxy:
            with gateway(text, env={"UP_KEY": SECRET, "https_proxy": proxy.url}) as gw:
                assert ask(gw.v1).status_code == 200
            assert proxy.seen[0][1] == proxy.expected
            wrong = proxy.url.replace("s3cret-pw", "wrong-pw")
            with gateway(text, env={"UP_KEY": SECRET, "https_proxy": wrong}) as gw:
                refused = ask(gw.v1)
    assert refused.status_code == 502
    message = refused.json()["error"]["message"]
    assert "proxy refused the tunnel (HTTP 407: proxy credentials missing or wrong)" in message
    assert "wrong-pw" not in refused.text and str(up.port) not in message


def test_an_http_upstream_goes_through_http_proxy_in_absolute_form() -> None:
    with (
        RawUpstream(keep_serving(json_reply())) as up, ConnectProxy(user="u", password="p") as proxy,
        gateway(config(up.base_url), env={"UP_KEY": SECRET, "HTTP_PROXY": proxy.url}) as gw,
    ):
        assert ask(gw.v1).status_code == 200
    assert proxy.seen == [(f"POST http://127.0.0.1:{up.port}/v1/chat/completions HTTP/1.1", proxy.expected)]
    assert b"proxy-authorization" not in up.requests[0].lower()


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "127.0.0.0/8", "*", "localhost,127.0.0.1:{port}"])
def test_no_proxy_sends_matching_hosts_direct(no_proxy: str) -> None:
    with RawUpstream(keep_serving(json_reply())) as up, ConnectProxy() as proxy:
        env = {"UP_KEY": SECRET, "HTTP_PROXY": proxy.url, "NO_PROXY": no_proxy.format(port=up.port)}
        with gateway(config(up.base_url), env=env) as gw:
            assert ask(gw.v1).status_code == 200
    assert proxy.seen == [] and len(up.requests) == 1


def test_a_provider_proxy_overrides_the_environment_and_false_goes_direct() -> None:
    with RawUpstream(keep_serving(json_reply())) as up, ConnectProxy() as mine, ConnectProxy() as envs:
        env = {"UP_KEY": SECRET, "HTTP_PROXY": envs.url, "NO_PROXY": "127.0.0.1"}
        with gateway(config(up.base_url, extra=f'proxy = "{mine.url}"\n'), env=env) as gw:
            assert ask(gw.v1).status_code == 200
        with gateway(config(up.base_url, extra="proxy = false\n"), env={**env, "NO_PROXY": ""}) as gw:
            assert ask(gw.v1).status_code == 200
    assert len(mine.seen) == 1 and envs.seen == [] and len(up.requests) == 2


def test_check_shows_the_proxy_masked_and_probes_through_it() -> None:
    with (
        RawUpstream(keep_serving(json_reply(b'{"object":"list","data":[]}'))) as up,
        ConnectProxy(user="bob", password="hunter2") as proxy,
    ):
        env = {"UP_KEY": SECRET, "HTTP_PROXY": proxy.url}
        loaded = load_config_text(config(up.base_url), source="t.toml", env=env)
        report = "\n".join(report_lines(loaded, warnings=[], env=env))
        out = io.StringIO()
        assert probe(loaded, env=env, out=out)
    assert f"http://bob:***@127.0.0.1:{proxy.port}" in report
    assert "hunter2" not in report and "hunter2" not in out.getvalue()
    assert proxy.seen[0][0] == f"GET http://127.0.0.1:{up.port}/v1/models HTTP/1.1"


def test_the_gateways_own_health_probes_go_through_the_proxy() -> None:
    with (
        RawUpstream(keep_serving(json_reply(b'{"object":"list","data":[]}'))) as up, ConnectProxy() as proxy,
        gateway(config(up.base_url), env={"UP_KEY": SECRET, "HTTP_PROXY": proxy.url}) as gw,
    ):
        assert httpx.get(gw.url + "/readyz", timeout=15).status_code == 200  # probes the default route
    assert proxy.seen == [(f"GET http://127.0.0.1:{up.port}/v1/models HTTP/1.1", None)]


def test_an_unusable_proxy_variable_is_warned_about_and_requests_go_direct() -> None:
    env = {"UP_KEY": SECRET, "HTTP_PROXY": "socks5://carol:pw-123@127.0.0.1:1080"}
    with RawUpstream(keep_serving(json_reply())) as up, gateway(config(up.base_url), env=env) as gw:
        assert ask(gw.v1).status_code == 200
        warnings = config_warnings(gw.config, env)
    assert [w for w in warnings if w.startswith("HTTP_PROXY: ")] == [
        (
            "HTTP_PROXY: proxy 'socks5://carol:***@127.0.0.1:1080' is not an http://HOST:PORT URL "
            "(only http proxies are spoken); http upstreams are reached directly"
        )
    ]
    assert len(up.requests) == 1


def test_a_proxy_that_is_not_http_is_a_config_error() -> None:
    with pytest.raises(Exception, match="only http proxies"):
        load_config_text(config("https://127.0.0.1:9/v1", extra='proxy = "socks5://u:pw@h:1080"\n'), source="t", env={})
