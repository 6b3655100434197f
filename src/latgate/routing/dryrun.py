"""``latgate route [--config PATH] [-H 'Name: value']... REQUEST.json``: a routing dry run.

Loads the config, reads a request body (a JSON file, ``-`` for stdin) and prints, as
JSON, the decision :class:`~latgate.routing.decision.Router` makes for it, contacting
nothing::

    {"provider": "sglang_tilelang", "endpoint": "sglang_tilelang-0",
     "model": "meta-llama/Meta-Llama-3-8B-Instruct", "reason": "long_context",
     "prompt_tokens": 40015, "latency_sensitive": false, ...,
     "candidates": [{"provider": ..., "endpoint": ..., "model": ..., "reason": ...}],
     "notes": []}

``endpoint`` is the id of the provider's first endpoint: a dry run has no live health
or load to choose among replicas. Exit codes: 0 decided; 1 a bad config, file, JSON
body, header, or a request the gateway would answer with 400/404 (one
``latgate: error: ...`` line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from latgate.config.errors import ConfigError
from latgate.config.loader import load_config, resolve_config_path
from latgate.config.schema import Config
from latgate.errors import GatewayError
from latgate.routing.decision import RouteDecision, Router


class _UsageError(Exception):
    """A bad argument or input file; the message is the whole error line."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``latgate route``."""
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $LATGATE_CONFIG, else ./config.toml)"
    )
    parser.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a request header, e.g. -H 'X-Latency-Sensitive: 1' (repeatable)",
    )
    parser.add_argument("request", metavar="REQUEST.json", help="the request body as JSON ('-' reads stdin)")


def main(args: argparse.Namespace) -> int:
    """Print the routing decision for ``args.request``; return the exit code."""
    try:
        headers = parse_headers(args.headers)
        config = load_config(resolve_config_path(args.config))
        body = _read_body(args.request)
        decision = Router(config).decide(body, headers)
    except (ConfigError, _UsageError) as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    except GatewayError as exc:
        print(f"latgate: error: {exc.status}: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(decision_json(decision, config), ensure_ascii=False, indent=2))
    return 0


def parse_headers(lines: list[str]) -> dict[str, str]:
    """``['Name: value', ...]`` -> ``{'name': 'value'}`` (names lowercased, as routing reads them).

    Raises:
        _UsageError: a line without ``:`` or with an empty name.
    """
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise _UsageError(f"header {line!r} is not 'Name: value'")
        headers[name.strip().lower()] = value.strip()
    return headers


def decision_json(decision: RouteDecision, config: Config) -> dict[str, Any]:
    """The printed form of ``decision``, each target with its provider's first endpoint id."""

    def endpoint(provider: str) -> str:
        return config.providers[provider].endpoints[0].id

    return {
        "provider": decision.provider,
        "endpoint": endpoint(decision.provider),
        "model": decision.model,
        "public_model": decision.public_model,
        "reason": decision.reason,
        "prompt_tokens": decision.prompt_tokens,
        "latency_sensitive": decision.latency_sensitive,
        "budget_ms": decision.budget_ms,
        "policy": decision.policy,
        "hedge": decision.hedge,
        "candidates": [
            {"provider": t.provider, "endpoint": endpoint(t.provider), "model": t.model, "reason": t.reason}
            for t in decision.candidates
        ],
        "notes": list(decision.notes),
    }


def _read_body(path: str) -> dict[str, Any]:
    name = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _UsageError(f"{name}: no such file") from None
    except UnicodeDecodeError:
        raise _UsageError(f"{name}: not UTF-8 text") from None
    except OSError as exc:
        raise _UsageError(f"{name}: cannot read it ({exc.strerror})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(
            f"{name}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(body, dict):
        raise _UsageError(f"{name}: a request body must be a JSON object, not {type(body).__name__}")
    return body
