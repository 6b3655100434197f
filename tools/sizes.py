"""latgate's size check: no module of ``src/latgate`` over :data:`MAX_MODULE_LINES` lines,
no function over :data:`MAX_FUNCTION_LINES`, unless a reason is written beside it.

Run by ``make lint`` (``python tools/sizes.py``); exit 1 when:

- a module is longer than :data:`MAX_MODULE_LINES` lines and not in :data:`KNOWN_MODULES`;
- a function or method (its ``def`` line to its last line, docstring included) is longer
  than :data:`MAX_FUNCTION_LINES` and has no ``# long: <reason>`` comment on its ``def``
  line or in the comment block right above it (above its decorators), and is not in
  :data:`KNOWN_FUNCTIONS`;
- a listed module or function is no longer over its limit (the lists only shrink:
  delete the line).

Functions are named ``module:Class.method`` (``latgate.forwarding.sse:StreamTap.feed``).
``--list`` prints every module and function over its limit, listed or not.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "latgate"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
_LONG = re.compile(r"#\s*long:\s*\S")

#: modules over the limit today, each to be split (the list only shrinks; empty: keep it so)
KNOWN_MODULES: dict[str, str] = {}

#: functions over the limit today without a reason beside them (the list only shrinks)
KNOWN_FUNCTIONS: set[str] = {
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``latgate.x.y`` for the file ``path`` of ``package``."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _has_reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``# long: <reason>`` on the ``def`` line, or a line of the comment block right
    above the function (above its decorators, if any) that starts with it."""
    if _LONG.search(lines[node.lineno - 1]):
        return True
    top = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)]) - 1  # 0-based
    above = top - 1
    while above >= 0 and lines[above].lstrip().startswith("#"):
        if _LONG.match(lines[above].lstrip()):
            return True
        above -= 1
    return False


def long_functions(path: Path, name: str) -> list[tuple[str, int, bool]]:
    """``(module:qualified.name, lines, has a # long: reason)`` of each function of the
    file over :data:`MAX_FUNCTION_LINES` lines."""
    text = path.read_text()
    lines = text.splitlines()
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualified = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append((f"{name}:{qualified}", length, _has_reason(lines, child)))
                visit(child, qualified + ".")

    visit(ast.parse(text, str(path)), "")
    return found


def check(package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(breaches as lines to print, everything over a limit as lines for ``--list``)."""
    problems, over = [], []
    long_modules, long_functions_seen = set(), set()
    for path in sorted(package.rglob("*.py")):
        name = module_name(path, package)
        count = len(path.read_text().splitlines())
        if count > MAX_MODULE_LINES:
            long_modules.add(name)
            over.append(f"{name}: {count} lines")
            if name not in KNOWN_MODULES:
                problems.append(f"{name} is {count} lines (over {MAX_MODULE_LINES}): split it by a real seam")
        for function, length, reason in long_functions(path, name):
            over.append(f"{function}: {length} lines{' (# long: given)' if reason else ''}")
            if reason:
                continue
            long_functions_seen.add(function)
            if function not in KNOWN_FUNCTIONS:
                problems.append(
                    f"{function} is {length} lines (over {MAX_FUNCTION_LINES}): split it, "
                    "or write '# long: <reason>' beside its def"
                )
    problems += [f"known long module {m} is not over {MAX_MODULE_LINES} lines: delete it from KNOWN_MODULES" for m in KNOWN_MODULES if m not in long_modules]
    problems += [f"known long function {f} is gone or has its reason: delete it from KNOWN_FUNCTIONS" for f in KNOWN_FUNCTIONS if f not in long_functions_seen]
    return problems, over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every module and function over its limit")
    args = parser.parse_args(argv)
    problems, over = check()
    if args.list:
        print("\n".join(over))
    for line in problems:
        print(f"tools/sizes.py: {line}", file=sys.stderr)
    if not problems:
        print(
            f"tools/sizes.py: modules <= {MAX_MODULE_LINES} lines and functions <= {MAX_FUNCTION_LINES} "
            f"but {len(KNOWN_MODULES)} known modules and {len(KNOWN_FUNCTIONS)} known functions"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
