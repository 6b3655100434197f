"""``latgate route [--config PATH] [-H 'Name: value']... REQUEST.json``: a routing dry run.

Loads the config, reads a request body (a JSON file, ``-`` for stdin) and prints, as
JSON, the decision :class:`~latgate.routing.decision.Router` makes for it, contacting
nothing (``--url``, below, asks a gateway instead)::

    {"provider": "sglang_tilelang", "endpoint": "sglang_tilelang-0",
     "model": "meta-llama/Meta-Llama-3-8B-Instruct", "reason": "long_context",
     "prompt_tokens": 40015, "latency_sensitive": false, ...,
     "candidates": [{"provider": ..., "endpoint": ..., "model": ..., "reason": ...}],
     "notes": []}

``endpoint`` is the id of the provider's first endpoint: a dry run has no live health
or load to choose among replicas. ``notes`` says why rules were skipped, and names
every candidate that would be sent another model than the one asked for (an alias,
or the same model under the provider's own spelling).

``--url URL`` asks a running gateway instead (``POST URL/admin/route``, with an admin
key when its ``[auth]`` is on: ``--api-key``, default ``$LATGATE_API_KEY``): the
decision as the gateway would make it now, with its live numbers: the endpoint chosen,
an overflow (reason ``overflow:FROM``), the hedge it would send, and every endpoint
considered with its predicted time to first token, in-flight count and circuit.

Exit codes: 0 decided; 1 a bad config, file, JSON body, header, a request the gateway
would answer with 400/404, or a gateway that cannot be reached or refuses (one
``latgate: error: ...`` line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.loader import load_config, resolve_config_path
from latgate.foundation.errors import GatewayError
from latgate.routing.decision import Router
from latgate.routing.explain import decision_json

URL_TIMEOUT_SECONDS = 10.0
API_KEY_ENV = "LATGATE_API_KEY"


#: the example request body in the repository (its model is one the bundled config.toml serves)
EXAMPLE = "examples/REQUEST.json"


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
    parser.add_argument(
        "request",
        metavar="REQUEST.json",
        help=f"the request body as JSON ('-' reads stdin); {EXAMPLE} asks for a model of the bundled "
        "config.toml: with another config, set its \"model\" to one that config serves",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="explain the decision of the gateway running at URL, with its live numbers (POST URL/admin/route)",
    )
    parser.add_argument(
        "--api-key", metavar="KEY", help=f"admin key for --url when the gateway has [auth] (default: ${API_KEY_ENV})"
    )


def main(args: argparse.Namespace) -> int:
    """Print the routing decision for ``args.request``; return the exit code."""
    if args.url:
        return _ask_gateway(args)
    body: dict[str, Any] | None = None  # read before a GatewayError can be raised
    try:
        headers = parse_headers(args.headers)
        config = load_config(resolve_config_path(args.config))
        body = _read_body(args.request)
        decision = Router(config).decide(body, headers)
    except (ConfigError, _UsageError) as exc:
        for line in str(exc).splitlines():
            print(f"latgate: error: {line}", file=sys.stderr)
        return 1
    except GatewayError as exc:
        hint = ""
        if exc.status == 404 and isinstance(body, dict) and isinstance(body.get("model"), str):
            where = "the request body" if args.request == "-" else args.request
            written = " (it is written for the bundled config.toml)" if args.request.endswith(EXAMPLE) else ""
            hint = f'; set "model" in {where} to one of them{written}'
        print(f"latgate: error: {exc.status}: {exc.message}{hint}", file=sys.stderr)
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


def _ask_gateway(args: argparse.Namespace) -> int:
    """``--url``: send the body and headers to ``/admin/route`` and print the answer."""
    import httpx

    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        print(f"latgate: error: --url {args.url!r} is not an http(s) URL", file=sys.stderr)
        return 1
    try:
        headers = parse_headers(args.headers)
        body = _read_body(args.request)
    except _UsageError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if key:
        headers["authorization"] = f"Bearer {key}"
    try:
        response = httpx.post(url + "/admin/route", json=body, headers=headers, timeout=URL_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        print(f"latgate: error: cannot reach the gateway at {url} ({type(exc).__name__})", file=sys.stderr)
        return 1
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code != 200 or not isinstance(answer, dict):
        message = answer.get("error", {}).get("message") if isinstance(answer, dict) else None
        hint = f" (set --api-key or ${API_KEY_ENV})" if response.status_code in (401, 403) else ""
        print(f"latgate: error: {response.status_code}: {message or 'unexpected answer'}{hint}", file=sys.stderr)
        return 1
    print(json.dumps(answer, ensure_ascii=False, indent=2))
    return 0


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
