"""Warnings about a valid config: things that load but will likely hurt at run time."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from latgate.foundation.config.apikeys import key_problem
from latgate.foundation.config.egress import env_proxy_problems
from latgate.foundation.config.masking import mask_secrets
from latgate.foundation.config.schema import Config

_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
_MIN_SANE_TIMEOUT_SECONDS = 1.0
#: what a sub-second value of each timeout key does (docs/configuration.md, [defaults])
_SHORT_TIMEOUT_EFFECTS = {
    "timeout_sec": (
        "an upstream silent that long between two reads (a long prompt's prefill), or a non-streamed "
        "answer not whole by then, is cut off as the provider's timeout (retried before the first byte, "
        "else the request fails)"
    ),
    "first_token_timeout_sec": "slow first tokens will time out and be retried, inflating tail latency",
}


def config_warnings(config: Config, env: Mapping[str, str] | None = None, *, can_listen: bool = True) -> list[str]:
    """One line per problem that does not stop the gateway from starting.

    - a provider's ``api_key_env`` is not set in ``env`` (requests then go without a
      key, and the upstream answers 401; said mildly when all its endpoints are on
      loopback, as the demo's keyless simulators are), is empty, or holds what an HTTP
      header cannot carry (see :mod:`latgate.foundation.config.apikeys`);
    - ``[auth]`` is absent while ``server.host`` is not a loopback address (unless
      ``can_listen`` is False: ``latgate check`` found this machine cannot listen on it,
      :func:`~latgate.foundation.config.listen_host.probe_listen_host`, and says that instead);
    - a proxy variable (``HTTPS_PROXY``...) that is not an ``http://`` URL;
    - a provider with ``verify = false`` (TLS certificates not checked);
    - a timeout under 1 s (``timeout_sec``: ordinary upstream pauses are cut off as the
      provider's timeouts; ``first_token_timeout_sec``: slow first tokens are retried).

    The warnings that need the router (rules that never apply, a latency threshold
    routed nowhere) are :func:`latgate.routing.warnings.routing_warnings`;
    :func:`latgate.routing.warnings.startup_warnings` gives both, as ``serve`` and
    ``check`` print them.

    ``env`` defaults to :data:`os.environ`: pass the environment the gateway will run
    with. Key values are never included, nor any value that looks like a key
    (:func:`~latgate.foundation.config.masking.mask_secrets`).
    """
    env = os.environ if env is None else env
    warnings = _key_warnings(config, env)
    if any(p.proxy is None for p in config.providers.values()):
        warnings += env_proxy_problems(env)
    for p in config.providers.values():
        if not p.verify:
            warnings.append(
                f'provider "{p.name}": verify = false: its TLS certificates are not checked, so anyone on the '
                "path can read and change its traffic and its key (trust its CA with ca_file instead)"
            )
    if config.auth is None and can_listen and not is_loopback(config.server.host):
        warnings.append(
            f"server.host {config.server.host} is reachable from other machines and [auth] is absent: "
            "anyone who can connect may use the providers (add [[auth.keys]] or bind to 127.0.0.1)"
        )
    timeouts = {
        "defaults.timeout_sec": config.defaults.timeout_sec,
        "defaults.first_token_timeout_sec": config.defaults.first_token_timeout_sec,
        **{f"providers.{p.name}.timeout_sec": p.timeout_sec for p in config.providers.values()},
    }
    for key, seconds in timeouts.items():
        if seconds is not None and seconds < _MIN_SANE_TIMEOUT_SECONDS:
            warnings.append(f"{key} = {seconds} s is under 1 s: {_SHORT_TIMEOUT_EFFECTS[key.rsplit('.', 1)[1]]}")
    return [mask_secrets(warning) for warning in warnings]


def _on_loopback(api_base: str) -> bool:
    return is_loopback(urlsplit(api_base).hostname or "")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def per_worker_limits_warning(config: Config, *, workers: int) -> str | None:
    """The warning for ``latgate serve --workers N`` (N > 1) when keys have ``rpm`` /
    ``tpm`` limits and ``[state]`` has no ``redis_url``: each worker process counts
    them on its own, so a key gets up to N times its limit. ``None`` otherwise."""
    if workers < 2 or config.state.redis_url is not None or config.auth is None:
        return None
    limited = [key.name for key in config.auth.keys if key.rpm is not None or key.tpm is not None]
    if not limited:
        return None
    return (
        f"--workers {workers} without [state] redis_url: each worker counts rate limits on its own, "
        f"so {'keys' if len(limited) > 1 else 'key'} {', '.join(mask_secrets(name) for name in limited)} "
        f"{'get' if len(limited) > 1 else 'gets'} up to {workers}x their rpm/tpm; "
        'set [state] redis_url = "redis://HOST:6379/0" to share the counters across workers'
    )


def _key_warnings(config: Config, env: Mapping[str, str]) -> list[str]:
    """A line per provider whose ``api_key_env`` is unset, empty or not a header value."""
    warnings = []
    for p in config.providers.values():
        if not p.api_key_env:
            continue
        if p.api_key_env not in env and p.endpoints and all(_on_loopback(e.api_base) for e in p.endpoints):
            warnings.append(
                f'provider "{p.name}": api_key_env {p.api_key_env} is not set; its endpoints are on this '
                "machine, so fine for latgate demo's simulators and keyless engines (one started with an "
                "API key answers 401)"
            )
        elif p.api_key_env not in env:
            warnings.append(
                f'provider "{p.name}": api_key_env {p.api_key_env} is not set; requests to it will be sent '
                "without a key (expect 401 from the upstream)"
            )
        elif (problem := key_problem(env[p.api_key_env])) is not None:
            warnings.append(f'provider "{p.name}": api_key_env {p.api_key_env} {problem}')
    return warnings
