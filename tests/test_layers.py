"""The import contract (tools/layers.py) holds for src/latgate, and would catch a breach."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("layers", ROOT / "tools" / "layers.py")
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "latgate"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.parent != package and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
    return package


def test_the_source_tree_keeps_the_contract_and_the_docs_show_it() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "layers.py")], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_an_upward_import_is_named_with_both_layers(tmp_path: Path) -> None:
    package = _package(tmp_path, {"transport/h1.py": "def read(): from latgate.api import serve\n", "api/serve.py": ""})
    problems = layers.check(package)
    assert "latgate.transport.h1 (transport) imports latgate.api.serve (api): an upward import" in problems


def test_a_cycle_held_by_type_hints_alone_is_a_cycle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "routing/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from latgate.routing import b\n",
            "routing/b.py": "from . import a\n",
        },
    )
    assert "import cycle: latgate.routing.a <-> latgate.routing.b" in layers.check(package)


def test_a_pure_leaf_may_be_imported_from_below(tmp_path: Path) -> None:
    package = _package(tmp_path, {"foundation/config/x.py": "from latgate.routing.policies import view\n", "routing/policies/view.py": ""})
    assert not [p for p in layers.check(package) if "upward" in p or "cycle:" in p]


def test_a_leaf_that_imports_a_layered_module_is_no_leaf(tmp_path: Path) -> None:
    package = _package(tmp_path, {"routing/tokens.py": "import latgate.foundation.metrics\n", "foundation/metrics.py": ""})
    assert "latgate.routing.tokens is a leaf (LEAVES) but imports latgate.foundation.metrics: a leaf imports only leaves" in layers.check(package)


def test_a_layer_without_its_request_step_is_named(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "latgate"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.setattr(layers, "REQUEST_PATH", {k: v for k, v in layers.REQUEST_PATH.items() if k != "live"})
    assert "layer live: no REQUEST_PATH line (what a request does in it)" in layers.check(package)
