"""latgate's own trailing-slash redirects (``/admin/providers/``, ``/ui/state/``) are
relative: the client's ``Host`` header never becomes a ``Location`` (a cache or proxy
that lets a forged Host through could otherwise hand another client a redirect to any
host), and the query survives. Through a real gateway on loopback and httpx."""

from __future__ import annotations

import httpx
import pytest
from stack import gateway, one_upstream_config


@pytest.fixture(scope="module")
def base() -> str:
    with gateway(one_upstream_config("http://127.0.0.1:9/v1")) as gw:
        yield gw.url


@pytest.mark.parametrize(
    ("path", "location"),
    [("/admin/providers/", "/admin/providers"), ("/ui/state/", "/ui/state"), ("/ui/state/?x=1", "/ui/state?x=1")],
)
def test_a_trailing_slash_redirect_is_relative_whatever_the_host_header(base: str, path: str, location: str) -> None:
    answer = httpx.get(base + path, headers={"host": "evil.example.com"}, timeout=10)
    assert answer.status_code == 307 and answer.headers["location"] == location
    followed = httpx.get(base + path, follow_redirects=True, timeout=10)
    assert followed.status_code == 200 and followed.url.path == location.split("?")[0]


def test_a_trailing_slash_on_an_unknown_path_is_still_404(base: str) -> None:
    answer = httpx.get(base + "/nowhere/", timeout=10)
    assert answer.status_code == 404 and "location" not in answer.headers
    assert httpx.get(base + "//evil.example.com/", timeout=10).status_code == 404
