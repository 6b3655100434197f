"""The ``latgate`` command line: serve, check, route, sim, demo, bench.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int`` (the exit code); this file only wires them, importing each
lazily so ``latgate sim`` does not pay for the gateway's imports. A user mistake
prints one ``latgate: error: ...`` line and exits non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from latgate import __version__

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("latgate.process.server", "run the gateway"),
    "check": ("latgate.commands.check", "validate the config and print providers, models and routes"),
    "route": ("latgate.commands.route", "print the routing decision for a request body: a dry run from the config, or --url asks a running gateway"),
    "sim": ("latgate.commands.sim.cli", "run an OpenAI-compatible engine simulator"),
    "demo": ("latgate.commands.demo", "start one simulator per provider, then the gateway"),
    "bench": ("latgate.commands.bench.cli", "measure TTFT, e2e latency and tokens/s against a base URL"),
    "clients": ("latgate.commands.clients", "print the settings a coding client needs for this gateway"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latgate", description="latency-aware LLM routing gateway")
    parser.add_argument("--version", action="version", version=f"latgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported (keeps `latgate sim` start-up light).
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``latgate`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left (`latgate route X.json | head`): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141  # 128 + SIGPIPE, as a shell reports it
