"""latgate's import contract: which layer each module of ``src/latgate`` is in, and which
layers it may import.

Run by ``make lint`` (``python tools/layers.py``); exit 1 when:

- a module is in no layer, or in two; a layer has no :data:`REQUEST_PATH` line;
- a pure leaf (:data:`LEAVES`) imports a latgate module that is not a leaf;
- a module imports a layer above its own (an *upward* import), unless the edge is
  listed in :data:`KNOWN_DEBTS` with the reason it is still there;
- modules import each other in a cycle (imports under ``if TYPE_CHECKING:`` count: a
  cycle held together by type hints is still a cycle), unless listed in
  :data:`KNOWN_CYCLES`;
- a listed debt or cycle no longer exists (the list only shrinks: delete the line);
- the "Layers" section of ``docs/ARCHITECTURE.md`` is not what this contract renders
  (``python tools/layers.py --write-docs`` rewrites it).

Imports are read from the syntax tree of every module (``import latgate.x``,
``from latgate.x import y``, relative imports), wherever they stand: at the top, in a
function, or under ``TYPE_CHECKING``. The pure leaves (:data:`LEAVES`: no I/O, no
latgate module but other leaves) may be imported from any layer.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "latgate"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- layers:begin (tools/layers.py --write-docs) -->", "<!-- layers:end -->"

#: top to bottom: (layer, what it is, module patterns). A module may import its own layer
#: and those below it. A pattern matches a module name (``latgate.transport.h1``) exactly or
#: by glob; the most specific (exact) match wins.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("commands", "the CLI and the tools beside the gateway (demo, clients, bench, sim)", ("latgate.__main__", "latgate.commands", "latgate.commands.*")),
    ("process", "start, drain, signals, workers", ("latgate.process", "latgate.process.*")),
    ("app", "the ASGI app, its config reload, client connection limits, /ui", ("latgate.app", "latgate.app.*")),
    ("api", "the route table, the one serve path, each wire API's description, admin", ("latgate.api", "latgate.api.*")),
    ("request", "one request's routing and auth, tracing, API translation", ("latgate.request", "latgate.request.*")),
    ("forwarding", "attempts, retries, hedges, the stream relay and its tap", ("latgate.forwarding", "latgate.forwarding.*")),
    ("routing", "rules, targets, selection and admission over live numbers", ("latgate.routing", "latgate.routing.*")),
    ("live", "providers' and endpoints' live numbers, shared state, connectors", ("latgate.live", "latgate.live.*")),
    ("transport", "the upstream HTTP/1.1 client: pool, connections, egress, decoding", ("latgate.transport", "latgate.transport.*")),
    ("foundation", "config, the error tree, metrics, logs", ("latgate", "latgate.foundation", "latgate.foundation.*")),
)

#: layer -> what one streamed chat completion does in it, drawn beside the layer in
#: docs/ARCHITECTURE.md's picture (the section above the picture follows it module by module)
REQUEST_PATH: dict[str, str] = {
    "commands": "`latgate serve` reads its flags and the config, then runs process/server.py",
    "process": "process/server.py binds the socket; uvicorn accepts; process/starts.py paces request starts",
    "app": "app/httplimits.py holds the client to its limits; app/asgi.py dispatches the POST by its path",
    "api": "api/serve.py, the one path of every API: key, body limits, the API's prepare (translation)",
    "request": "request/gateway.py Gateway.proxy: the routing decision, priority, the key's token limits",
    "forwarding": "forwarding/forward.py: attempts, retries, hedges; forwarding/relay.py streams the answer back "
    "through the tap; forwarding/recorder.py records the end",
    "routing": "routing/decision.py: rules -> targets; routing/admission.py: the queue when full; "
    "routing/selection.py: the endpoint",
    "live": "live/providers/pool.py: the endpoints' live numbers selection reads and each outcome updates",
    "transport": "transport/upstream.py UpstreamClient.open over the transport/h1.py pool (HTTP/1.1 to the engine)",
    "foundation": "the config, the error envelope a failure is answered in, metrics and the access line at the end",
}

#: pure leaves any layer may import: they do no I/O and import no latgate module but
#: other leaves (checked), so they cannot carry a dependency upwards. Data structures
#: (the prefix index, the session map) and pure functions over plain data.
LEAVES = (
    "latgate.routing.policies*",
    "latgate.routing.tokens",
    "latgate.routing.prefix_index",
    "latgate.routing.sessions",
    "latgate.routing.strategies.registry",
)

#: (importer, imported) -> why the upward import is still there. Remove a line when its
#: import goes; never add one without a reason and a plan.
KNOWN_DEBTS: dict[tuple[str, str], str] = {}

#: each a frozenset of modules that import each other in a cycle, with the reason
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """``latgate.x.y`` -> its file, for every module and package of ``package``."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The latgate modules ``name`` (at ``path``) imports, anywhere in its syntax tree."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.add(child if child in known else module)
    return {module for module in found if module in known and module != name}


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module``'s layer (an exact pattern beats a glob)."""
    exact = [i for i, (_, _, patterns) in enumerate(LAYERS) if module in patterns]
    if exact:
        return exact[0]
    globbed = [i for i, (_, _, patterns) in enumerate(LAYERS) if any(fnmatch.fnmatchcase(module, p) for p in patterns)]
    return globbed[0] if len(globbed) == 1 else None if not globbed else min(globbed)


def _is_leaf(module: str) -> bool:
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in LEAVES)


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root, targets in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def check(package: Path = PACKAGE) -> list[str]:
    """Every breach of the contract in ``package``, as lines to print (empty: none)."""
    names = module_names(package)
    graph = {name: imports_of(name, path, names) for name, path in names.items()}
    problems = [f"{name}: in no layer of tools/layers.py LAYERS" for name in names if layer_of(name) is None]
    problems += [f"layer {layer}: no REQUEST_PATH line (what a request does in it)" for layer, _, _ in LAYERS if layer not in REQUEST_PATH]
    upward = set()
    for importer, imported in sorted((a, b) for a, targets in graph.items() for b in targets):
        if _is_leaf(importer) and not _is_leaf(imported):
            problems.append(f"{importer} is a leaf (LEAVES) but imports {imported}: a leaf imports only leaves")
        if _is_leaf(imported):
            continue
        low, high = layer_of(importer), layer_of(imported)
        if low is not None and high is not None and high < low:
            upward.add((importer, imported))
            if (importer, imported) not in KNOWN_DEBTS:
                problems.append(
                    f"{importer} ({LAYERS[low][0]}) imports {imported} ({LAYERS[high][0]}): an upward import"
                )
    problems += [f"known debt {a} -> {b} is gone: delete it from KNOWN_DEBTS" for a, b in KNOWN_DEBTS if (a, b) not in upward]
    found = cycles(graph)
    problems += [f"import cycle: {' <-> '.join(sorted(c))}" for c in found if c not in KNOWN_CYCLES]
    problems += [f"known cycle {' <-> '.join(sorted(c))} is gone: delete it from KNOWN_CYCLES" for c in KNOWN_CYCLES if c not in found]
    return problems


def tree_picture(package: Path = PACKAGE) -> list[str]:
    """The source tree drawn by layer, top to bottom: each layer's directories and
    modules under ``src/latgate/`` (a directory holding modules of two layers is drawn
    in the one most of them are in, the others' modules by name)."""
    by_first: dict[str, dict[int, list[str]]] = {}
    for name, path in module_names(package).items():
        layer = layer_of(name)
        if layer is None:
            continue
        relative = path.relative_to(package).as_posix()
        by_first.setdefault(relative.split("/")[0], {}).setdefault(layer, []).append(relative)
    entries: dict[int, list[str]] = {}
    for first, layers_here in sorted(by_first.items()):
        main = max(layers_here, key=lambda i: len(layers_here[i]))
        for index, paths in layers_here.items():
            if first.endswith(".py"):
                entries.setdefault(index, []).append(first)
            elif index == main:
                entries.setdefault(index, []).append(first + "/")
            else:
                entries.setdefault(index, []).extend(sorted(paths))
    width = max(len(name) for name, _, _ in LAYERS)
    pad = " " * (width + 2)
    lines = [
        "```",
        "src/latgate/, one row per layer, top to bottom. A layer imports its own and the",
        "layers below it, never one above; no cycles (type-only imports included).",
        "",
    ]
    for index, (name, what, _) in enumerate(LAYERS):
        shown = sorted(entries.get(index, []), key=lambda e: (e.count("/") > 1, e))
        if index:
            lines.append(f"{'':<{width}}  │")
        lines.append(f"{name:<{width}}  {', '.join(shown)}")
        lines.append(f"{pad}holds: {what}")
        lines += textwrap.wrap(
            REQUEST_PATH.get(name, "-"), 96, initial_indent=f"{pad}a request: ", subsequent_indent=pad + "   "
        )
    return [*lines, "```"]


def render_layers() -> str:
    """The "Layers" block of docs/ARCHITECTURE.md, from :data:`LAYERS`, :data:`REQUEST_PATH`,
    the tree and the debts."""
    lines = [BEGIN, "", *tree_picture()]
    lines += [
        "",
        "Pure leaves any layer may import: " + ", ".join(f"`{p.removeprefix('latgate.').replace('.', '/')}`" for p in LEAVES) + ".",
        "",
        f"Known upward imports ({len(KNOWN_DEBTS)}; the list only shrinks):",
        "",
    ]
    lines += [f"- `{a}` -> `{b}`: {why}" for (a, b), why in KNOWN_DEBTS.items()]
    lines += ["", f"Known import cycles ({len(KNOWN_CYCLES)}):", ""]
    lines += [f"- {', '.join(f'`{m}`' for m in sorted(c))}: {why}" for c, why in KNOWN_CYCLES.items()]
    return "\n".join([*lines, "", END])


def _doc_with_layers(text: str) -> str:
    head, begin, rest = text.partition(BEGIN)
    if not begin:
        raise SystemExit(f"{DOC}: no {BEGIN!r} marker")
    _, end, tail = rest.partition(END)
    if not end:
        raise SystemExit(f"{DOC}: no {END!r} marker")
    return head + render_layers() + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="rewrite the Layers block of docs/ARCHITECTURE.md")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    if args.write_docs:
        DOC.write_text(_doc_with_layers(text))
    problems = check()
    if _doc_with_layers(text) != text and not args.write_docs:
        problems.append(f"{DOC.relative_to(ROOT)}: its Layers block is not the contract's: run python tools/layers.py --write-docs")
    for line in problems:
        print(f"tools/layers.py: {line}", file=sys.stderr)
    if not problems:
        print(f"tools/layers.py: {len(module_names())} modules in {len(LAYERS)} layers, no new upward import or cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
