"""tools/relayout.py moves a package into layer directories and every reference with it,
and a second run changes nothing (run on a small fake latgate in a scratch git tree)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "src/latgate/__init__.py": '__version__ = "0"\n',
    "src/latgate/errors.py": "class GatewayError(Exception):\n    pass\n",
    "src/latgate/app.py": "from latgate.proxy.forward import forward\n\n\ndef create_app():\n    return forward\n",
    "src/latgate/proxy/__init__.py": '"""Proxying."""\n',
    "src/latgate/proxy/h1.py": "class H1Pool:\n    def open(self):\n        return 1\n",
    "src/latgate/proxy/forward.py": (
        "import logging\n\nfrom . import h1\nfrom .h1 import H1Pool\nfrom ..errors import GatewayError\n\n"
        'log = logging.getLogger("latgate.proxy")\n\n\ndef forward():\n    return h1, H1Pool, GatewayError\n'
    ),
    "tests/test_fake.py": (
        "import latgate.app\nfrom latgate.app import create_app\nfrom latgate.proxy import forward, h1\n\n\n"
        "def test_patch(monkeypatch):\n"
        '    monkeypatch.setattr("latgate.proxy.h1.H1Pool.open", lambda self: 2)\n'
        "    assert latgate.app.create_app is create_app and forward.forward() and h1.H1Pool().open() == 2\n"
    ),
    "docs/ARCHITECTURE.md": "The pool: `proxy/h1.py`; the app: `app.py`, `src/latgate/proxy/forward.py`; GET /proxy/x.\n",
    "pyproject.toml": '[project.scripts]\nfake = "latgate.app:create_app"\n',
}


def _tree(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(tmp_path, "init", "-q")
    _commit(tmp_path)
    return tmp_path


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _commit(root: Path) -> None:
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree")


def _relayout(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "relayout.py"), "--root", str(root)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def test_modules_move_to_their_layer_directories_and_every_reference_follows(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _relayout(root)
    package = root / "src" / "latgate"
    assert (package / "transport" / "h1.py").exists() and (package / "forwarding" / "forward.py").exists()
    assert (package / "app" / "asgi.py").exists() and (package / "foundation" / "errors.py").exists()
    assert not (package / "proxy").exists() and not (package / "app.py").exists()
    assert "\nR  src/latgate/proxy/h1.py -> src/latgate/transport/h1.py\n" in "\n" + _git(root, "status", "--short")
    forward = (package / "forwarding" / "forward.py").read_text()
    assert "from latgate.transport import h1\n" in forward
    assert "from latgate.transport.h1 import H1Pool\n" in forward
    assert "from latgate.foundation.errors import GatewayError\n" in forward
    assert 'getLogger("latgate.proxy")' in forward  # a logger's name is not a module's
    test = (root / "tests" / "test_fake.py").read_text()
    assert "latgate.app.asgi.create_app is create_app" in test
    assert "from latgate.app.asgi import create_app\n" in test
    assert "from latgate.forwarding import forward\nfrom latgate.transport import h1\n" in test
    assert '"latgate.transport.h1.H1Pool.open"' in test
    assert (root / "docs" / "ARCHITECTURE.md").read_text() == (
        "The pool: `transport/h1.py`; the app: `app/asgi.py`, `src/latgate/forwarding/forward.py`; GET /proxy/x.\n"
    )
    assert 'fake = "latgate.app.asgi:create_app"' in (root / "pyproject.toml").read_text()
    assert (package / "transport" / "__init__.py").exists()
    imported = subprocess.run(
        [sys.executable, "-c", "import latgate.app.asgi as a, latgate.forwarding.forward as f; print(a.create_app() is f.forward)"],
        cwd=root, env={"PYTHONPATH": str(package.parent)}, check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert imported.stdout == "True\n"


def test_a_second_run_changes_nothing(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _relayout(root)
    _commit(root)
    second = _relayout(root)
    assert "0 moved, 0 files rewritten" in second.stdout
    assert _git(root, "status", "--short") == ""


def test_code_written_for_the_old_layout_is_rewritten_after_the_move(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _relayout(root)
    late = root / "tests" / "test_late.py"
    late.write_text("from latgate.app import create_app\nfrom latgate.proxy.h1 import H1Pool\n")
    _relayout(root)
    assert late.read_text() == "from latgate.app.asgi import create_app\nfrom latgate.transport.h1 import H1Pool\n"
