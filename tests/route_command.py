"""``latgate route`` run in-process, as ``latgate.commands.cli`` would run it."""

from __future__ import annotations

import argparse

import pytest

from latgate.commands import route


def run_route(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse ``argv`` as ``latgate route`` does and run it; returns (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="latgate route")
    route.add_arguments(parser)
    code = route.main(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err
