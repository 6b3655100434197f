"""The import check of ``benchmarks/``: no import cycle among its modules, and no module
that sets another benchmark module's attribute.

    .venv/bin/python tools/bench_imports.py [DIR]   (default: benchmarks/; exit 1 on a finding)

Each scenario is a standalone script over ``benchmarks/harness.py``; a cycle (a scenario
importing another one that imports it back, even inside a function) or a monkeypatched
module global is what made the figures of one scenario depend on which script started
it. Imports are read from the syntax trees (``import x``, ``from x import y`` at any
depth); only names of modules in DIR count. ``tests/test_bench_harness.py`` runs it in
the fast suite.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def import_graph(directory: Path) -> dict[str, set[str]]:
    """``{module: the modules of directory it imports}`` for each ``*.py`` in ``directory``
    (module = file stem). Raises SyntaxError for a file that does not parse."""
    files = {path.stem: path for path in sorted(directory.glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        graph[name] = {m for m in imported if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (each
    sorted; Tarjan's algorithm): every import cycle is inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def patched_globals(directory: Path) -> list[str]:
    """``"file:line: module.attr"`` for each assignment to an attribute of an imported
    benchmark module (``routing_scenarios.wait_until_up = ...``)."""
    names = {path.stem for path in directory.glob("*.py")}
    out = []
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in names:
                    out.append(f"{path.name}:{node.lineno}: {target.value.id}.{target.attr}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    directory = Path(argv[0]) if argv else BENCHMARKS
    problems = [f"import cycle in {directory.name}/: {' -> '.join(c)}" for c in cycles(import_graph(directory))]
    problems += [f"{directory.name}/{p} sets another benchmark module's global" for p in patched_globals(directory)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
