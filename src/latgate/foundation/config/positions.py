"""Where each key of a config.toml is written: key path -> line number.

:mod:`tomllib` returns values without positions, so this module scans the text a second
time (only after tomllib accepted it, so the text is known to be valid TOML) and records
the line of every table header, key and array element, under the key path the
validators use (``providers.vllm.endpoints[1].url``, ``auth.keys[0]``,
``models."a/b"``; see :func:`latgate.foundation.config.keys.key_path`). A key that is not written
in the file (a missing one, a default) is placed on the line of its nearest written
parent: ``decode.api_base`` missing -> the line of ``[decode]``.

The grammar followed is TOML 1.0 (https://toml.io/en/v1.0.0): headers ``[a.b]`` and
``[[a.b]]`` (array-of-tables elements numbered in order, nested ones under the last
element of their parent), dotted and quoted keys, arrays and inline tables at any depth,
basic, literal and multi-line strings, comments.
"""

from __future__ import annotations

import bisect
import re
import tomllib

Path = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SEGMENT = re.compile(r'\.?(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<bare>[^.\[\]"]+))|\[(?P<index>\d+)\]')


class KeyLines:
    """The line (1-based) of every key path written in one TOML text.

    Example::

        lines = KeyLines('[providers.vllm]\\nendpoints = ["http://a:1", { url = "x" }]\\n')
        lines.line_of("providers.vllm.endpoints[1].url")  # 2
        lines.line_of("providers.vllm.timeout_sec")       # 1 (not written: its table)
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._newlines = [i for i, c in enumerate(text) if c == "\n"]
        self._lines: dict[Path, int] = {}
        self._array_tables: dict[Path, int] = {}
        self._i = 0
        try:
            self._scan()
        except (ValueError, IndexError):  # a construct this scanner misreads: fewer lines known, never a failed load
            pass

    def line_of(self, key: str) -> int | None:
        """The line of ``key`` (a key path as the validators spell it), or of its
        nearest written parent; None when neither is in the file."""
        path = parse_key_path(key)
        while path:
            line = self._lines.get(path)
            if line is not None:
                return line
            path = path[:-1]
        return None

    # --- scanning -------------------------------------------------------------------

    def _line(self, index: int) -> int:
        return bisect.bisect_left(self._newlines, index) + 1

    def _record(self, path: Path, index: int) -> None:
        self._lines.setdefault(path, self._line(index))

    def _peek(self, n: int = 1) -> str:
        return self._text[self._i : self._i + n]

    def _skip_space(self, *, newlines: bool) -> None:
        text = self._text
        while self._i < len(text):
            c = text[self._i]
            if c in " \t\r" or (newlines and c == "\n"):
                self._i += 1
            elif c == "#":
                end = text.find("\n", self._i)
                self._i = len(text) if end < 0 else end
            else:
                return

    def _scan(self) -> None:
        table: Path = ()
        while True:
            self._skip_space(newlines=True)
            if self._i >= len(self._text):
                return
            start = self._i
            if self._peek(2) == "[[":
                self._i += 2
                keys = self._keys()
                self._i += 2  # ]]
                parent = self._resolve(keys[:-1])
                array = (*parent, keys[-1])
                index = self._array_tables.get(array, -1) + 1
                self._array_tables[array] = index
                table = (*array, index)
                self._record(array, start)
                self._record(table, start)
            elif self._peek() == "[":
                self._i += 1
                table = self._resolve(self._keys())
                self._i += 1  # ]
                self._record_parents(table, start)
                self._lines[table] = self._line(start)  # its own header, over an earlier [table.sub]
            else:
                path = (*table, *self._keys())
                self._record_parents(path, start)
                self._skip_space(newlines=False)
                self._i += 1  # =
                self._value(path)

    def _record_parents(self, path: Path, index: int) -> None:
        for end in range(1, len(path) + 1):
            self._record(path[:end], index)

    def _resolve(self, keys: list[str]) -> Path:
        """A header's keys, each array of tables among them replaced by its last element."""
        path: Path = ()
        for key in keys:
            path = (*path, key)
            if path in self._array_tables:
                path = (*path, self._array_tables[path])
        return path

    def _keys(self) -> list[str]:
        keys = []
        while True:
            self._skip_space(newlines=False)
            if self._peek() in ('"', "'"):
                start = self._i
                self._string()
                keys.append(tomllib.loads(f"k = {self._text[start : self._i]}")["k"])
            else:
                match = _BARE.match(self._text, self._i)
                if match is None:
                    return keys
                keys.append(match.group())
                self._i = match.end()
            self._skip_space(newlines=False)
            if self._peek() != ".":
                return keys
            self._i += 1

    def _value(self, path: Path) -> None:
        self._skip_space(newlines=False)
        c = self._peek()
        if c in ('"', "'"):
            self._string()
        elif c == "[":
            self._array(path)
        elif c == "{":
            self._inline_table(path)
        else:
            text = self._text
            while self._i < len(text) and text[self._i] not in ",]}\n#":
                self._i += 1

    def _array(self, path: Path) -> None:
        self._i += 1
        index = 0
        while True:
            self._skip_space(newlines=True)
            start = self._i
            if self._peek() == "]" or start >= len(self._text):
                self._i += 1
                return
            self._record((*path, index), start)
            self._value((*path, index))
            self._skip_space(newlines=True)
            if self._peek() == ",":
                self._i += 1
                index += 1
            elif self._i == start:  # not a value: step over it rather than loop
                self._i += 1

    def _inline_table(self, path: Path) -> None:
        self._i += 1
        while True:
            self._skip_space(newlines=False)
            if self._peek() == "}" or self._i >= len(self._text):
                self._i += 1
                return
            start = self._i
            key = (*path, *self._keys())
            self._record_parents(key, start)
            self._skip_space(newlines=False)
            self._i += 1  # = (always a step forward)
            self._value(key)
            self._skip_space(newlines=False)
            if self._peek() == ",":
                self._i += 1

    def _string(self) -> None:
        text, quote = self._text, self._peek()
        if self._peek(3) == quote * 3:
            end = text.find(quote * 3, self._i + 3)
            while quote == '"' and end > 0 and _escaped(text, end):
                end = text.find(quote * 3, end + 1)
            end = len(text) if end < 0 else end + 3
            while end < len(text) and text[end] == quote:  # up to two quotes end the content
                end += 1
            self._i = end
            return
        i = self._i + 1
        while i < len(text) and text[i] != quote:
            i += 2 if quote == '"' and text[i] == "\\" else 1
        self._i = i + 1


def _escaped(text: str, index: int) -> bool:
    """True when the character at ``index`` follows an odd number of backslashes."""
    backslashes = 0
    while index - backslashes - 1 >= 0 and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def parse_key_path(key: str) -> Path:
    """``providers.vllm.endpoints[1].url`` -> ``("providers", "vllm", "endpoints", 1, "url")``;
    quoted segments (``models."a/b"``) are unquoted. Text that is no key path gives ``()``."""
    path: list[str | int] = []
    position = 0
    while position < len(key):
        match = _SEGMENT.match(key, position)
        if match is None or match.end() == position:
            return ()
        if match.group("index") is not None:
            path.append(int(match.group("index")))
        elif match.group("quoted") is not None:
            path.append(tomllib.loads(f"k = {match.group('quoted')}")["k"])
        else:
            path.append(match.group("bare"))
        position = match.end()
    return tuple(path)
