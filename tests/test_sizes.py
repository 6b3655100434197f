"""The size check (tools/sizes.py) holds for src/latgate, and would catch a long module
or function (on a fake package)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sizes", ROOT / "tools" / "sizes.py")
sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sizes)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "latgate"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def _function(lines: int, beside: str = "") -> str:
    return f"def f():{beside}\n" + "    x = 1\n" * (lines - 1)


def test_the_source_tree_is_within_its_sizes() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sizes.py")], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_long_function_needs_a_reason_beside_its_def(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sizes, "KNOWN_MODULES", {})
    monkeypatch.setattr(sizes, "KNOWN_FUNCTIONS", set())
    package = _package(tmp_path, {"a.py": _function(61), "b.py": _function(61, "  # long: one state machine"), "c.py": _function(60)})
    problems, _ = sizes.check(package)
    assert problems == ["latgate.a:f is 61 lines (over 60): split it, or write '# long: <reason>' beside its def"]


def test_a_long_module_is_named_and_a_listed_one_that_shrank_must_go(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sizes, "KNOWN_MODULES", {"latgate.small": "was long"})
    monkeypatch.setattr(sizes, "KNOWN_FUNCTIONS", set())
    package = _package(tmp_path, {"big.py": "x = 1\n" * 401, "small.py": "x = 1\n"})
    problems, _ = sizes.check(package)
    assert problems == [
        "latgate.big is 401 lines (over 400): split it by a real seam",
        "known long module latgate.small is not over 400 lines: delete it from KNOWN_MODULES",
    ]


def test_a_reason_may_stand_in_the_comment_block_above_the_def_and_its_decorators(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sizes, "KNOWN_MODULES", {})
    monkeypatch.setattr(sizes, "KNOWN_FUNCTIONS", set())
    reason = "# long: one state machine,\n# its states are the locals\n"
    package = _package(
        tmp_path,
        {
            "a.py": reason + _function(61),
            "b.py": "import functools\n\n\n" + reason + "@functools.cache\n" + _function(61),
            "c.py": reason + "\nx = 1\n" + _function(61),  # the reason is another statement's
            "d.py": "# a comment first\n# long: then the reason\n" + _function(61),
        },
    )
    problems, _ = sizes.check(package)
    assert problems == ["latgate.c:f is 61 lines (over 60): split it, or write '# long: <reason>' beside its def"]
