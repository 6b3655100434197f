"""``latgate sim``: run one simulated engine under uvicorn.

Every :class:`~latgate.commands.sim.options.SimOptions` field is a flag (``--tpot-ms 2``...).
``--profile tilert`` serves TileRT's prefill/decode router instead of an OpenAI engine
(:mod:`latgate.commands.sim.tilert`), with its own timing defaults for the flags not given.
:func:`argv_for` gives the flags for a set of options, so ``latgate demo`` can start
simulators as subprocesses from :func:`~latgate.commands.sim.profiles.profile_for`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys

from latgate.commands.sim.options import PROFILES, SimOptions
from latgate.commands.sim.tilert import TILERT_DEFAULTS

_DEFAULTS = SimOptions()
_PROFILE_DEFAULTS = {"openai": _DEFAULTS, "tilert": TILERT_DEFAULTS}
_INCOMPLETE_RESPONSE = "ASGI callable returned without completing response."

# (flag, field, type, help); help may use %(default)s.
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--name", "name", str, "name shown in logs and as the /metrics model_name label (default: %(default)s)"),
    ("--prefill-tokens-per-second", "prefill_tokens_per_second", float,
     "prompt tokens prefilled per second (default: %(default)s)"),
    ("--ttft-overhead-ms", "ttft_overhead_ms", float, "fixed time added to each first token (default: %(default)s)"),
    ("--tpot-ms", "tpot_ms", float, "time per output token with one running request (default: %(default)s)"),
    ("--tpot-growth-ms", "tpot_growth_ms", float,
     "added to the time per output token per further running request (default: %(default)s)"),
    ("--max-batch-size", "max_batch_size", int, "requests running at once; others wait (default: %(default)s)"),
    ("--prefill-concurrency", "prefill_concurrency", int,
     "requests prefilling at once, the others wait for them; 0: no limit (default: %(default)s)"),
    ("--prefix-cache-tokens", "prefix_cache_tokens", int,
     "with --prefix-cache: the cache's capacity in tokens, evicted LRU (default: %(default)s)"),
    ("--prefix-cache-block-tokens", "prefix_cache_block_tokens", int,
     "with --prefix-cache: tokens per cache block (default: %(default)s)"),
    ("--default-max-tokens", "default_max_tokens", int,
     "completion tokens when a request sets no max_tokens (default: %(default)s)"),
    ("--max-output-tokens", "max_output_tokens", int, "cap on completion tokens per choice (default: %(default)s)"),
    ("--error-rate", "error_rate", float, "probability of a 500 per request (default: %(default)s)"),
    ("--rate-limit-rate", "rate_limit_rate", float, "probability of a 429 per request (default: %(default)s)"),
    ("--retry-after-seconds", "retry_after_seconds", int, "Retry-After sent with a 429 (default: %(default)s)"),
    ("--stall-rate", "stall_rate", float, "probability of a pause mid-reply (default: %(default)s)"),
    ("--stall-ms", "stall_ms", float, "length of that pause (default: %(default)s)"),
    ("--drop-rate", "drop_rate", float,
     "probability of closing the connection mid-reply, without [DONE] (default: %(default)s)"),
    ("--decode-nodes", "decode_nodes", int,
     "profile tilert: decode nodes, one request each; all busy -> 429 (default: %(default)s)"),
    ("--decode-error-rate", "decode_error_rate", float,
     "profile tilert: probability of a [decode error: ...] written into a stream (default: %(default)s)"),
    ("--decode-error-after-tokens", "decode_error_after_tokens", int,
     "profile tilert: content tokens sent before that decode error (default: %(default)s)"),
    ("--seed", "seed", int, "seed for reproducible faults (default: random)"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``latgate sim``'s flags to ``parser``."""
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="openai",
        help="openai: an OpenAI-compatible engine; tilert: TileRT's PD router (/health with decode_free, "
        "/pool_status, 429 when every decode node is busy; its defaults: 20 ms + 20 000 prompt tokens/s "
        "to first token, 2.5 ms per token) (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        default=[],
        metavar="M",
        help="a served model name (repeatable); other names get 404. Default: any name",
    )
    for flag, field, kind, help_text in _FLAGS:
        metavar = (
            "MS"
            if field.endswith("_ms")
            else "P"
            if field.endswith("_rate")
            else "NAME"
            if kind is str
            else "N"
        )
        # None: not given, so the profile's default applies (help shows the openai one)
        parser.add_argument(flag, dest=field, type=kind, default=None, metavar=metavar, help=help_text % {"default": getattr(_DEFAULTS, field)})
    parser.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULTS.prefix_cache,
        help="a block-level prefix cache: a prompt's leading blocks held from an earlier prompt cost no "
        "prefill; usage reports prompt_tokens_details.cached_tokens (default: off)",
    )


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """The :class:`SimOptions` the parsed flags describe. Raises ``ValueError`` on a bad value."""
    base = _PROFILE_DEFAULTS[args.profile]
    values = {field: getattr(args, field) for _, field, _, _ in _FLAGS if getattr(args, field) is not None}
    return dataclasses.replace(base, models=tuple(args.models), prefix_cache=args.prefix_cache, **values)


def argv_for(options: SimOptions) -> list[str]:
    """Flags reproducing ``options`` (those that differ from the defaults), without ``--port``/``--host``."""
    base = _PROFILE_DEFAULTS[options.profile]
    argv: list[str] = [] if options.profile == "openai" else ["--profile", options.profile]
    for model in options.models:
        argv += ["--model", model]
    for flag, field, _, _ in _FLAGS:
        value = getattr(options, field)
        if value != getattr(base, field):
            argv += [flag, str(value)]
    if options.prefix_cache != _DEFAULTS.prefix_cache:
        argv.append("--prefix-cache" if options.prefix_cache else "--no-prefix-cache")
    return argv


def main(args: argparse.Namespace) -> int:
    """Run the simulator until interrupted; returns the exit code (2: bad option, 1: cannot listen)."""
    try:
        options = options_from_args(args)
    except ValueError as error:
        print(f"latgate sim: error: {error}", file=sys.stderr)
        return 2
    return serve(options, host=args.host, port=args.port)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port``.

    Created with ``IPPROTO_TCP`` explicitly: asyncio sets ``TCP_NODELAY`` only on
    accepted sockets whose protocol says TCP, and without it every response whose
    headers and body are written separately waits ~40 ms for a delayed ACK.

    Raises:
        OSError: the address is unknown or in use.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def serve(options: SimOptions, *, host: str, port: int) -> int:
    """Serve a simulator built from ``options`` on ``host:port`` (blocking); returns the exit code."""
    import uvicorn

    from latgate.commands.sim.app import create_sim_app

    try:
        sock = listening_socket(host, port)
    except (OSError, OverflowError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        print(f"latgate sim: error: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return 1
    config = uvicorn.Config(
        create_sim_app(options),
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop="auto",
        http="auto",
    )
    # An injected connection drop makes uvicorn log this line for each dropped reply.
    logging.getLogger("uvicorn.error").addFilter(lambda record: record.getMessage() != _INCOMPLETE_RESPONSE)
    models = ", ".join(options.models) or "any model"
    bound_port = sock.getsockname()[1]
    print(
        f"latgate sim {options.name!r} ({models}) on http://{host}:{bound_port}", file=sys.stderr, flush=True
    )
    with sock:
        uvicorn.Server(config).run(sockets=[sock])
    return 0
