"""Move latgate's modules into one directory per layer, and every reference with them.

``python tools/relayout.py`` (from the repository root, in a git work tree):

1. turns relative imports under ``src/latgate`` into absolute ones (so a module may move
   away from its old neighbours);
2. ``git mv``\\ s each module or package of :data:`RENAMES` that is still at its old
   place (one already moved is skipped) and gives each new layer directory an
   ``__init__.py``;
3. rewrites the references in :data:`TEXT_ROOTS`: imports (``from latgate.proxy import
   h1`` becomes ``from latgate.transport import h1``), dotted names anywhere
   (``"latgate.proxy.h1.H1Pool.open"`` monkeypatch targets, ``-m latgate.sim``, the
   console script ``latgate.cli:main``, docstrings) and paths (``src/latgate/proxy/h1.py``,
   ``proxy/h1.py`` in the docs). Logger names (``getLogger("latgate.store")``) are left
   as they are: operators filter on them. ``app.py`` becomes ``app/asgi.py``: a name
   taken from it (``latgate.app.create_app``, ``from latgate.app import create_app``)
   is rewritten, a bare ``latgate.app`` (now the package) is not;
4. sets ``tools/layers.py``'s ``LAYERS`` patterns to one directory per layer
   (:data:`LAYER_DIRECTORIES`), re-renders docs/ARCHITECTURE.md's Layers block, and
   sorts the imports it touched (``ruff check --select I --fix``, when ruff is there).

It is idempotent: on a tree already laid out it changes nothing, and on a tree where
code written against the old layout was merged afterwards it rewrites only that code
(a name is rewritten only when its old module is gone). Modules at the top of
``src/latgate`` that no entry places are listed at the end (add them to
:data:`RENAMES`); ``--dry-run`` prints the moves without making them.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

#: old module or package -> new one, for every module that changes place. A package
#: moves whole (its submodules with it); a longer name wins over its package's entry.
RENAMES: dict[str, str] = {
    # foundation: config, the error tree, metrics, logs
    "latgate.config": "latgate.foundation.config",
    "latgate.errors": "latgate.foundation.errors",
    "latgate.metrics": "latgate.foundation.metrics",
    "latgate.logs": "latgate.foundation.logs",
    "latgate.decode_rate": "latgate.foundation.decode_rate",
    "latgate.scope_keys": "latgate.foundation.scope_keys",
    # live: providers' and endpoints' live numbers, shared state, connectors
    "latgate.providers": "latgate.live.providers",
    "latgate.store": "latgate.live.store",
    "latgate.connectors": "latgate.live.connectors",
    # transport: the upstream HTTP/1.1 client (out of proxy/)
    "latgate.proxy.upstream": "latgate.transport.upstream",
    "latgate.proxy.h1": "latgate.transport.h1",
    "latgate.proxy.h1conn": "latgate.transport.h1conn",
    "latgate.proxy.egress": "latgate.transport.egress",
    "latgate.proxy.tunnel": "latgate.transport.tunnel",
    "latgate.proxy.decoding": "latgate.transport.decoding",
    "latgate.proxy.errors": "latgate.transport.errors",
    "latgate.proxy.prelude": "latgate.transport.prelude",
    # forwarding: the rest of proxy/
    "latgate.proxy": "latgate.forwarding",
    # request: one request's routing and auth, tracing, API translation
    "latgate.gateway": "latgate.request.gateway",
    "latgate.auth": "latgate.request.auth",
    "latgate.tracing": "latgate.request.tracing",
    "latgate.translate": "latgate.request.translate",
    # app: the ASGI app, its reload, client connection limits, /ui
    "latgate.app": "latgate.app.asgi",
    "latgate.reload": "latgate.app.reload",
    "latgate.httplimits": "latgate.app.httplimits",
    "latgate.client_limits": "latgate.app.client_limits",
    "latgate.ui": "latgate.app.ui",
    # process: start, drain, signals, workers
    "latgate.server": "latgate.process.server",
    "latgate.workers": "latgate.process.workers",
    "latgate.lifecycle": "latgate.process.lifecycle",
    "latgate.listen": "latgate.process.listen",
    "latgate.starts": "latgate.process.starts",
    "latgate.gcpolicy": "latgate.process.gcpolicy",
    # commands: the CLI and the tools beside the gateway
    "latgate.cli": "latgate.commands.cli",
    "latgate.demo": "latgate.commands.demo",
    "latgate.clients": "latgate.commands.clients",
    "latgate.client_renderers": "latgate.commands.client_renderers",
    "latgate.bench": "latgate.commands.bench",
    "latgate.sim": "latgate.commands.sim",
    # moved by hand before this script (branch layers): for code written before that
    "latgate.config.report": "latgate.commands.check",
    "latgate.routing.dryrun": "latgate.commands.route",
}

#: tools/layers.py layer name -> its directory under src/latgate ("" for the package's
#: own __init__/__main__, which stay at the top)
LAYER_DIRECTORIES: dict[str, str] = {
    "commands": "commands",
    "process": "process",
    "app": "app",
    "api": "api",
    "request": "request",
    "forwarding": "forwarding",
    "routing": "routing",
    "live": "live",
    "transport": "transport",
    "foundation": "foundation",
}

#: modules that stay at the top of src/latgate, and the layer each is in
TOP_LEVEL: dict[str, str] = {"latgate": "foundation", "latgate.__main__": "commands"}

#: docstrings of the layer packages this script creates
PACKAGE_DOCS: dict[str, str] = {
    "foundation": "The bottom layer: config, the error tree, metrics, logs (imports no other layer).",
    "live": "Providers' and endpoints' live numbers, shared state and connectors.",
    "transport": "The upstream HTTP/1.1 client: pool, connections, egress, decoding.",
    "forwarding": "Attempts, retries, hedges, the stream relay and its tap.",
    "request": "One request's routing and auth, tracing, API translation.",
    "app": "The ASGI app, its config reload, client connection limits and /ui.",
    "process": "Start, drain, signals, workers: the gateway as a process.",
    "commands": "latgate's commands and the tools beside the gateway.",
}

#: where references are rewritten (relative to the root); files under SKIP are not
TEXT_ROOTS = (
    "src", "tests", "benchmarks", "tools", "docs", "docker", "deploy", "examples", ".ci",
    "README.md", "CONTRIBUTING.md", "pyproject.toml", "Makefile", "Dockerfile",
)  # fmt: skip
SKIP = ("tools/relayout.py", "tests/test_relayout.py", "tests/fixtures/", "/static/", "/__pycache__/")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".sh", ".cfg", ".ini", ".json", ""}

_DOTTED = re.compile(r"(?<![\w.])latgate(?:\.\w+)+")
_LOGGER_BEFORE = re.compile(r"(getLogger\(|logger=|LogRecord\()\s*['\"]$")


def main(argv: list[str] | None = None) -> int:
    """Run the relayout on the tree at ``--root`` (default: this repository)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    package = root / "src" / "latgate"
    if not package.is_dir():
        parser.error(f"{package}: no such directory")
    moves = pending_moves(package)
    for old, new in moves:
        print(f"relayout: git mv {old.relative_to(root)} {new.relative_to(root)}")
    if args.dry_run:
        return 0
    changed: set[Path] = set()
    changed |= absolute_imports(package)
    for old, new in moves:
        new.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "mv", str(old), str(new))
    changed |= layer_packages(root, package)
    modules = module_names(package)
    for path in text_files(root):
        text = path.read_text()
        new_text = rewrite(text, modules, python=path.suffix == ".py")
        if new_text != text:
            path.write_text(new_text)
            changed.add(path)
            print(f"relayout: rewrote {path.relative_to(root)}")
    layers = root / "tools" / "layers.py"
    if layers.exists():
        text = layers.read_text()
        new_text = directory_layers(text)
        if new_text != text:
            layers.write_text(new_text)
            changed.add(layers)
        subprocess.run([sys.executable, str(layers), "--write-docs"], cwd=root, check=False, capture_output=True)
    _sort_imports(root, sorted(p for p in changed if p.suffix == ".py" and p.exists()))
    for name in unplaced(package):
        print(f"relayout: {name} is at the top of src/latgate and in no layer directory: add it to RENAMES")
    print(f"relayout: {len(moves)} moved, {len(changed)} files rewritten")
    return 0


def pending_moves(package: Path) -> list[tuple[Path, Path]]:
    """(old path, new path) of each entry still at its old place, modules before the
    package they leave (so ``proxy/h1.py`` goes before ``proxy/``)."""
    moves = []
    for old, new in sorted(RENAMES.items(), key=lambda item: -item[0].count(".")):
        source = _path_of(package, old)
        if source is None or _path_of(package, new) is not None:
            continue
        if old.startswith(new + ".") or (source.is_dir() and new.startswith(old + ".")):
            continue
        target = package.parent / Path(*new.split("."))
        moves.append((source, target if source.is_dir() else target.with_suffix(".py")))
    return moves  # app.py -> app/asgi.py needs no care: app.py and app/ are two paths


def _path_of(package: Path, module: str) -> Path | None:
    base = package.parent / Path(*module.split("."))
    if (base / "__init__.py").exists():
        return base
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def layer_packages(root: Path, package: Path) -> set[Path]:
    """An ``__init__.py`` for each layer directory that has none (added to git)."""
    made = set()
    for directory in LAYER_DIRECTORIES.values():
        folder = package / directory
        init = folder / "__init__.py"
        if folder.is_dir() and not init.exists():
            init.write_text(f'"""{PACKAGE_DOCS.get(directory, directory)}"""\n')
            _git(root, "add", str(init))
            made.add(init)
    return made


def module_names(package: Path) -> set[str]:
    """Every module and package name under ``package`` (``latgate.x.y``)."""
    names = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def unplaced(package: Path) -> list[str]:
    """Top-level modules and packages no layer directory holds."""
    keep = {n.removeprefix("latgate.") for n in TOP_LEVEL} | {"__init__"} | set(LAYER_DIRECTORIES.values())
    found = []
    for path in sorted(package.iterdir()):
        name = path.stem if path.suffix == ".py" else path.name if (path / "__init__.py").exists() else None
        if name is not None and name not in keep:
            found.append(f"latgate.{name}")
    return found


def text_files(root: Path) -> Iterable[Path]:
    """The files :data:`TEXT_ROOTS` names, less :data:`SKIP`."""
    for entry in TEXT_ROOTS:
        base = root / entry
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for path in paths:
            relative = "/" + path.relative_to(root).as_posix()
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES and path.name not in ("Makefile", "Dockerfile"):
                continue
            if any(skip in relative or relative.endswith("/" + skip) for skip in SKIP):
                continue
            if path.suffix == "" and path.name not in ("Makefile", "Dockerfile") and not _is_text(path):
                continue
            yield path


def _is_text(path: Path) -> bool:
    try:
        path.read_text()
    except (UnicodeDecodeError, OSError):
        return False
    return True


# --- names --------------------------------------------------------------------------


def renamed(dotted: str, modules: set[str], following: str | None = None) -> str | None:
    """``dotted`` (``latgate.proxy.h1.H1Pool``) written for the new layout, or ``None``
    when it needs no change. ``modules``: the tree's modules now; ``following``: the
    name imported from it (``from dotted import following``), if any."""
    parts = dotted.split(".")
    for length in range(len(parts), 1, -1):
        old = ".".join(parts[:length])
        new = RENAMES.get(old)
        if new is None:
            continue
        if old in modules:
            if not new.startswith(old + "."):
                return None  # still at its old place: not moved in this tree
            # the old module is now a package of its name (app.py -> app/asgi.py): only
            # a name taken from it (latgate.app.create_app) is the old module's
            nxt = parts[length] if length < len(parts) else following
            if nxt is None or f"{old}.{nxt}" in modules:
                return None
        return ".".join([new, *parts[length:]])
    return None


def rewrite(text: str, modules: set[str], *, python: bool) -> str:
    """``text`` with its imports (Python), dotted names and paths in the new layout."""
    if python:
        text = _rewrite_from_imports(text, modules)

    def dotted(match: re.Match[str]) -> str:
        if _LOGGER_BEFORE.search(text, max(0, match.start() - 16), match.start()):
            return match.group()
        after = re.match(r"(?:\s+import\s+\(?\s*|:)(\w+)", text[match.end() : match.end() + 80])
        return renamed(match.group(), modules, after.group(1) if after else None) or match.group()

    text = _DOTTED.sub(dotted, text)
    return _rewrite_paths(text, modules)


def _rewrite_from_imports(text: str, modules: set[str]) -> str:
    """``from P import m`` where ``P.m`` moves elsewhere than ``P`` does (``from latgate
    import cli``, ``from latgate.proxy import h1``): one statement per new package."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("latgate"):
            continue
        module = node.module or ""
        base = renamed(module, modules, node.names[0].name) or module
        groups: dict[str, list[str]] = {}
        moved = False
        for alias in node.names:
            full = renamed(f"{module}.{alias.name}", modules)
            parent, _, name = (full or "").rpartition(".")
            if full is not None and parent != base:
                moved = True
                local = alias.asname or alias.name
                groups.setdefault(parent, []).append(name if name == local else f"{name} as {local}")
            else:
                groups.setdefault(base, []).append(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}")
        if moved:
            indent = re.match(r"\s*", lines[node.lineno - 1]).group()
            statements = "".join(f"{indent}from {p} import {', '.join(names)}\n" for p, names in groups.items())
            edits.append((node.lineno, node.end_lineno or node.lineno, statements))
    for first, last, statements in sorted(edits, reverse=True):
        lines[first - 1 : last] = [statements]
    return "".join(lines)


def _rewrite_paths(text: str, modules: set[str]) -> str:
    """``proxy/h1.py``, ``src/latgate/config/``, ``app.py`` as paths in the new layout."""
    for old, new in sorted(RENAMES.items(), key=lambda item: -len(item[0])):
        old_path, new_path = old.removeprefix("latgate.").replace(".", "/"), new.removeprefix("latgate.").replace(".", "/")
        if old in modules and not new.startswith(old + "."):
            continue
        before = r"(?:(?<=latgate/)|(?<![\w/.\-]))"
        if new in modules and _is_package(new, modules):
            if old not in modules:
                text = re.sub(before + re.escape(old_path) + r"(?=/)", new_path, text)
        else:
            text = re.sub(before + re.escape(old_path) + r"\.py\b", new_path + ".py", text)
    return text


def _is_package(name: str, modules: set[str]) -> bool:
    return any(m.startswith(name + ".") for m in modules)


# --- tools/layers.py ----------------------------------------------------------------


def directory_layers(text: str) -> str:
    """tools/layers.py's source with each layer of ``LAYERS`` matched by its directory
    (:data:`LAYER_DIRECTORIES`; the top-level modules of :data:`TOP_LEVEL` kept)."""
    tree = ast.parse(text)
    node = next(
        n for n in tree.body if isinstance(n, ast.AnnAssign | ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets))
    )  # fmt: skip
    layers = ast.literal_eval(node.value)
    rows = []
    for name, what, patterns in layers:
        directory = LAYER_DIRECTORIES.get(name)
        if directory is not None:
            top = tuple(m for m, layer in TOP_LEVEL.items() if layer == name)
            patterns = (*top, f"latgate.{directory}", f"latgate.{directory}.*")
        shown = ", ".join(_quoted(p) for p in patterns) + ("," if len(patterns) == 1 else "")
        rows.append(f"    ({_quoted(name)}, {_quoted(what)}, ({shown})),\n")
    lines = text.splitlines(keepends=True)
    head = lines[node.lineno - 1].split("=", 1)[0]
    lines[node.lineno - 1 : node.end_lineno] = [f"{head.rstrip()} = (\n", *rows, ")\n"]
    return "".join(lines)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sort_imports(root: Path, paths: list[Path]) -> None:
    ruff = shutil.which("ruff") or (str(Path(sys.executable).with_name("ruff")) if Path(sys.executable).with_name("ruff").exists() else None)
    if ruff and paths:
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *map(str, paths)], cwd=root, check=False, capture_output=True)


# --- relative imports ---------------------------------------------------------------


def absolute_imports(package: Path) -> set[Path]:
    """Every relative import under ``package`` written as the absolute one it means."""
    changed = set()
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        parts = path.relative_to(package.parent).with_suffix("").parts
        here = list(parts[:-1])  # the package the module is in (itself, for an __init__)
        tree = ast.parse(text)
        lines = text.splitlines(keepends=True)
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
                names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
                indent = re.match(r"\s*", lines[node.lineno - 1]).group()
                edits.append((node.lineno, node.end_lineno or node.lineno, f"{indent}from {module} import {names}\n"))
        if edits:
            for first, last, statement in sorted(edits, reverse=True):
                lines[first - 1 : last] = [statement]
            path.write_text("".join(lines))
            changed.add(path)
    return changed


if __name__ == "__main__":
    sys.exit(main())
