"""``latgate check [--config PATH] [--probe]``: validate the config and show what it means.

Prints, as plain aligned text (it reads the same in a terminal, a pipe or a CI log):
the listen address (what a host name resolves to here, and a warning when this machine
could not listen there: :func:`~latgate.foundation.config.listen_host.probe_listen_host`), each provider (connector, role, engine, endpoints with their URLs, models or "any",
the same-model rule of a single-model provider, extra_body keys, capacity hints), the
aliases, the ``[models]`` settings, the routing rules in the order they apply, and the
warnings. ``check`` is an operator tool, so URLs are shown; keys never are, nor the
password of a URL's ``user:password@`` part, nor any value that looks like a key
(:func:`~latgate.foundation.config.masking.mask_secrets`).

Exit codes: 0 ok, 1 config error (a ``latgate: error: ...`` line per mistake on stderr),
2 an endpoint failed its probe (``--probe``: ``GET`` the connector's health path on
every endpoint, with the provider's key when its variable is set; ``PING`` the shared
store of ``[state] redis_url`` after logging in).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from latgate.foundation.config.apikeys import header_key
from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.listen_host import probe_listen_host
from latgate.foundation.config.loader import load_config, resolve_config_path
from latgate.foundation.config.masking import mask_secrets, mask_url
from latgate.foundation.config.schema import Config, ProviderConfig
from latgate.live.connectors import get_connector
from latgate.live.store.resp import RespAuthError, RespClient, RespError
from latgate.routing.decision import Router
from latgate.routing.models import same_model
from latgate.routing.reach import Reach, fallback_suggestion, rule_reach
from latgate.routing.strategies.registry import predicts
from latgate.routing.warnings import startup_warnings
from latgate.transport.egress import Egress, egress_for
from latgate.transport.upstream import UpstreamClient, UpstreamFailure

PROBE_TIMEOUT_SECONDS = 3.0
_LABEL_WIDTH = 21


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``latgate check``."""
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $LATGATE_CONFIG, else ./config.toml)"
    )
    parser.add_argument(
        "--probe", action="store_true", help="also GET each endpoint's health path and PING the shared store (exit 2 if any fails)"
    )


def main(args: argparse.Namespace) -> int:
    """Run ``latgate check``; returns the exit code (0 ok, 1 config error, 2 probe failed)."""
    try:
        config = load_config(resolve_config_path(args.config))
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"latgate: error: {line}", file=sys.stderr)
        return 1
    out = sys.stdout
    resolved, listen_warning = probe_listen_host(config.server.host)
    warnings = [*([listen_warning] if listen_warning else []), *startup_warnings(config, can_listen=listen_warning is None)]
    lines = report_lines(config, warnings=warnings, env=os.environ, host_resolves_to=resolved)
    out.write("\n".join(lines) + "\n")
    if not args.probe:
        return 0
    return 0 if probe(config, env=os.environ, out=out) else 2


def report_lines(
    config: Config, *, warnings: list[str], env: Mapping[str, str] | None = None, host_resolves_to: str | None = None
) -> list[str]:
    """The report as lines of text (no trailing newlines). ``env``: where proxy and
    certificate variables are read (none when not given); ``host_resolves_to``: the
    address ``[server] host``, a name, resolves to on this machine (see
    :func:`~latgate.foundation.config.listen_host.probe_listen_host`)."""
    auth = f"{len(config.auth.keys)} key(s)" if config.auth else "none"
    resolves = f" (resolves to {host_resolves_to})" if host_resolves_to else ""
    lines = [
        f"config   {config.source}",
        f"server   {config.server.host}:{config.server.port}{resolves}   auth: {auth}",
        f"state    {_state_text(config)}",
        "",
    ]
    lines.append(f"providers ({len(config.providers)})")
    for provider in config.providers.values():
        lines += _provider_lines(provider, env or {})
    lines += ["", "aliases"]
    lines += [
        _row(public, ", ".join(f"{p}: {served}" for p, served in targets.items()))
        for public, targets in config.aliases.items()
    ] + _same_model_rows(config) or ["  (none)"]
    lines += ["", "models"]
    lines += [_row(public, _model_text(config, public)) for public in config.models] or ["  (none)"]
    lines += ["", "routing (first matching rule wins)"]
    lines += _routing_lines(config)
    lines += ["", "warnings"]
    lines += [f"  {warning}" for warning in warnings] or ["  (none)"]
    return [mask_secrets(line) for line in lines]  # a key pasted into any value is not printed


def _same_model_rows(config: Config) -> list[str]:
    """A row for each model name a provider listing one model is sent under its own
    spelling of the same model (``llama-3-8b-instruct`` -> ``meta-llama/Meta-Llama-3-8B-Instruct``,
    :func:`latgate.routing.models.same_model`) when a rule sends the request there."""
    rows = []
    for public in config.public_models():
        if public in config.aliases:
            continue
        targets = [
            f"{p.name}: {p.models[0]}"
            for p in config.providers.values()
            if len(p.models) == 1 and not p.serves(public) and same_model(public, p.models[0])
        ]
        if targets:
            rows.append(_row(public, ", ".join(targets) + " (its own name for the same model, when a rule sends the request there)"))
    return rows


def _fallback_rows(config: Config, router: Router, reaches: list[Reach]) -> list[str]:
    """Where a request goes when its provider fails before the first byte: its retries,
    then ``[routing] fallbacks`` in order, each link with the models it applies to (or,
    unset, no other provider, and an entry that would apply)."""
    routing, retries = config.routing, config.defaults.max_retries
    retried = f"a failed request is retried on its own provider (max_retries {retries})"
    if any(m.fallback_model for m in config.models.values()):
        retried += ", then with its [models] fallback_model where one is set"
    if routing.fallbacks:
        chains = "; ".join(f"{origin} -> {' -> '.join(nexts)}" for origin, nexts in routing.fallbacks.items())
        rows = [_row("fallbacks", f"{retried}, then: {chains}")]
        return rows + [_row("", f"{r.rule.removeprefix('fallback ')}: {r.summary()}") for r in reaches if r.rule.startswith("fallback ")]
    rows = [_row("fallbacks", f"{retried}, then fails: no other provider is tried ([routing] fallbacks unset)")]
    suggestion = fallback_suggestion(config, router)
    if suggestion is not None:
        rows.append(_row("", f"to fail over, e.g. {suggestion}"))
    return rows


def _state_text(config: Config) -> str:
    state = config.state
    if state.redis_url is None:
        return "in-process (each process counts its own rate limits)"
    on_failure = "admit without limits" if state.fail_open else "refuse with 503"
    return f"shared store {mask_url(state.redis_url)}   fail_open: {str(state.fail_open).lower()} ({on_failure} when Redis fails)"


def _row(label: str, value: str, *, indent: int = 2) -> str:
    return f"{' ' * indent}{label:<{_LABEL_WIDTH}} {value}".rstrip()


def _provider_lines(provider: ProviderConfig, env: Mapping[str, str]) -> list[str]:
    summary = f"connector {provider.connector}, role {provider.role or '-'}, engine {provider.engine or '-'}"
    lines = ["", f"  {provider.name}   ({summary})"]
    try:
        egress = egress_for(provider, env)
    except (OSError, ssl.SSLError, ValueError) as exc:  # SSL_CERT_FILE or a proxy variable is unusable
        egress = None
        lines.append(_row("egress", f"cannot be set up: {type(exc).__name__}", indent=4))
    for endpoint in provider.endpoints:
        called = mask_url(endpoint.base_url) + "/chat/completions"
        lines.append(_row("endpoint", f"{endpoint.id}  {mask_url(endpoint.api_base)}  (calls {called})", indent=4))
        share = [f"max_batch_size {endpoint.max_batch_size}"] if endpoint.max_batch_size else []
        share += [f"weight {endpoint.weight:g}"] if endpoint.weight != 1.0 else []
        if share:
            lines.append(_row("replica", ", ".join(share), indent=6))
        if egress is not None and egress.proxies:
            lines.append(_row("proxy", egress.shown_proxy(endpoint.base_url), indent=6))
    lines += _tls_lines(provider, env)
    lines.append(_row("models", ", ".join(provider.models) if provider.models else "any", indent=4))
    if provider.api_key_env:
        lines.append(_row("api key", f"${provider.api_key_env}", indent=4))
    if provider.extra_body:
        lines.append(_row("extra_body", ", ".join(provider.extra_body), indent=4))
    capacity = [f"max_batch_size {provider.max_batch_size}"] if provider.max_batch_size else []
    if provider.caches_prefixes:  # the prefix index needs a choice of endpoints (routing/selection.py)
        capacity.append("prefix cache on" if len(provider.endpoints) > 1 else "prefix cache on (one endpoint: no prefix index)")
    capacity += [f"{key} {_value(value)}" for key, value in provider.hints.items()]
    if capacity:
        lines.append(_row("capacity", ", ".join(capacity), indent=4))
    if provider.latency_sensitive or provider.timeout_sec or provider.tokenizer or provider.responses_api:
        extras = ["latency-sensitive"] if provider.latency_sensitive else []
        extras += ["serves /responses (passed through)"] if provider.responses_api else []
        extras += [f"timeout {provider.timeout_sec:g} s"] if provider.timeout_sec else []
        extras += [f"tokenizer {provider.tokenizer}"] if provider.tokenizer else []
        lines.append(_row("other", ", ".join(extras), indent=4))
    return lines


def _tls_lines(provider: ProviderConfig, env: Mapping[str, str]) -> list[str]:
    """TLS settings of a provider with an https:// endpoint; for one whose endpoints
    are all http://, only the settings its table gives, said to be unused."""
    https = any(endpoint.api_base.startswith("https://") for endpoint in provider.endpoints)
    tls = [f"ca_file {provider.ca_file}"] if provider.ca_file else []
    tls += ["SSL_CERT_FILE"] if https and not provider.ca_file and env.get("SSL_CERT_FILE") else []
    tls += [f"client_cert {provider.client_cert}"] if provider.client_cert else []
    tls += ["verify OFF (certificates not checked)"] if not provider.verify else []
    if not tls:
        return []
    return [_row("tls", ", ".join(tls) + ("" if https else " (unused: every endpoint is http://)"), indent=4)]


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _model_text(config: Config, public: str) -> str:
    model = config.models[public]
    parts = ["latency-sensitive"] if model.latency_sensitive else []
    parts += [f"fallback model {model.fallback_model}"] if model.fallback_model else []
    parts += [f"max context {model.max_context_tokens} tokens"] if model.max_context_tokens else []
    return ", ".join(parts) or "(defaults)"


def _routing_lines(config: Config) -> list[str]:
    """The rules in the order they apply, each configured one followed by the models it
    applies to and those it never applies to (:func:`latgate.routing.reach.rule_reach`)."""
    routing = config.routing
    router = Router(config, exact_tokenizers={})
    reaches = rule_reach(config, router)
    override = (
        "X-Route-To: PROVIDER honoured"
        if routing.allow_route_override
        else ("X-Route-To ignored (allow_route_override = false)")
    )
    long_context = (
        f"prompt > {routing.long_context_threshold} tokens -> {routing.long_context_provider}"
        if routing.long_context_threshold and routing.long_context_provider
        else "off"
    )
    marker = "X-Latency-Sensitive: 1"
    if routing.latency_threshold_ms:
        marker += f" or X-Latency-Budget-Ms <= {routing.latency_threshold_ms}"
    latency = (
        f"{marker} -> {routing.route_latency_sensitive_to}"
        if routing.route_latency_sensitive_to
        else ("off (no route_latency_sensitive_to)")
    )
    rules = [("override", override), ("long context", long_context), ("latency-sensitive", latency)]
    policies = [
        f'"{name}": {_policy_text(policy.model_dump(exclude_defaults=True))}'
        for name, policy in routing.policies.items()
    ]
    rules.append(
        ("policy", "; ".join(policies) if policies else "none (X-Route-Policy has nothing to select)")
    )
    rules.append(("model", "a model only some providers serve goes to those providers"))
    rules.append(("default", f"-> {routing.default_route}"))
    reached = {"long context": ["long context"], "latency-sensitive": ["latency-sensitive"], "policy": ['policy "']}
    lines = []
    for i, (name, text) in enumerate(rules, start=1):
        lines.append(_row(f"{i}. {name}", text))
        for reach in reaches:
            if any(reach.rule.startswith(prefix) for prefix in reached.get(name, ())):
                label = reach.rule.removesuffix(" long context").removesuffix(" route_to") + ": " if name == "policy" else ""
                lines.append(_row("", f"{label}{reach.summary()}"))
    lines += _fallback_rows(config, router, reaches)
    lines.append(_row("default model", routing.default_model or "none (the client's model is required)"))
    lines.append(_row("strategy", f"{routing.strategy}: {STRATEGY_TEXT[routing.strategy]}"))
    lines += _queue_rows(config)
    return lines


def _queue_rows(config: Config) -> list[str]:
    """``[routing.queue]`` with every value in force, defaults included (docs/routing.md
    "When pools are full")."""
    queue = config.routing.queue
    on = queue.enabled and config.routing.admission and predicts(config.routing.strategy)
    state = "on for pools whose capacity is known" if on else "off"
    if not on and queue.enabled and config.routing.admission:
        state += " (strategy predicted_latency only)"
    return [
        _row("queue", f"{state}: max_waiting {queue.max_waiting}, max_wait_ms {queue.max_wait_ms}, batch_max_wait_ms {queue.batch_max_wait_ms}, batch_headroom_slots {queue.batch_headroom_slots}, preempt {_value(queue.preempt)}"),
        _row("retry budget", f"retry_budget_percent {_value(queue.retry_budget_percent)}, retry_budget_min {queue.retry_budget_min}, hedge_slow_share {_value(queue.hedge_slow_share)}"),
    ]


STRATEGY_TEXT = {
    "predicted_latency": "live numbers: predicted time to first token (cache-aware), overflow, hedging",
    "latgate": "live numbers: predicted time to first token (cache-aware), overflow, hedging",
    "round_robin": "the rules above, endpoints in turn by weight",
    "least_outstanding": "the rules above, the endpoint with the fewest requests in flight",
    "rules": "the rules above, the endpoint with the fewest requests in flight",
}


def _policy_text(fields: Mapping[str, object]) -> str:
    return ", ".join(f"{key} {_value(value)}" for key, value in fields.items()) or "(no overrides)"


def probe(config: Config, *, env: Mapping[str, str], out: TextIO) -> bool:
    """``GET`` each endpoint's health URL (timeout 3 s) the way the gateway would reach it
    (proxy, TLS settings); print ok/failed lines, a failure with its cause (DNS name not
    found, connection refused, TLS: reason, timeout); True if all ok.

    The provider's key (``api_key_env`` from ``env``) is sent as ``Authorization:
    Bearer`` when set, and never printed.
    """
    out.write("\nprobe\n")
    endpoints_ok = asyncio.run(_probe_all(config, env=env, out=out))
    return asyncio.run(_probe_store(config, out=out)) and endpoints_ok


async def _probe_all(config: Config, *, env: Mapping[str, str], out: TextIO) -> bool:
    client = UpstreamClient(connect_timeout_seconds=PROBE_TIMEOUT_SECONDS, read_timeout_seconds=PROBE_TIMEOUT_SECONDS)
    all_ok = True
    try:
        for provider in config.providers.values():
            connector = get_connector(provider.connector)
            key = header_key(env.get(provider.api_key_env, "")) if provider.api_key_env else None
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                egress = egress_for(provider, env)
            except (OSError, ssl.SSLError, ValueError):
                egress = None
            for endpoint in provider.endpoints:
                url = connector.health_url(endpoint)
                ok, detail = await _probe_one(client, url, headers=headers, egress=egress)
                all_ok &= ok
                shown = mask_secrets(f"{mask_url(url)}  {mask_url(detail)}")
                out.write(f"  {'ok' if ok else 'failed':<7} {endpoint.id:<{_LABEL_WIDTH}} {shown}\n")
    finally:
        await client.aclose()
    return all_ok


async def _probe_store(config: Config, *, out: TextIO) -> bool:
    """``PING`` the shared store (after its ``AUTH``) when ``[state]`` names Redis."""
    url = config.state.redis_url
    if url is None:
        return True
    client = RespClient(url, timeout_seconds=PROBE_TIMEOUT_SECONDS)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            await client.call(b"PING")
        ok, detail = True, f"PING in {(time.perf_counter() - started) * 1000:.0f} ms"
    except RespAuthError as exc:
        ok, detail = False, f"authentication failed ({exc})"
    except (RespError, TimeoutError) as exc:
        ok, detail = False, "unreachable (timeout)" if isinstance(exc, TimeoutError) else f"unreachable ({exc})"
    finally:
        await client.aclose()
    out.write(f"  {'ok' if ok else 'failed':<7} {'shared store':<{_LABEL_WIDTH}} {mask_url(url)}  {detail}\n")
    return ok


async def _probe_one(
    client: UpstreamClient, url: str, *, headers: dict[str, str], egress: Egress | None
) -> tuple[bool, str]:
    started = time.perf_counter()
    try:
        response = await client.get(url=url, headers=headers, timeout_seconds=PROBE_TIMEOUT_SECONDS, egress=egress)
    except UpstreamFailure as failure:
        return False, str(failure)
    elapsed_ms = (time.perf_counter() - started) * 1000
    detail = f"HTTP {response.status_code} in {elapsed_ms:.0f} ms"
    if response.status_code in (401, 403):
        detail += " (check the provider's api_key_env)"
    return response.is_success, detail
