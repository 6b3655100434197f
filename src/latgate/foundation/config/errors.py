"""The error a config mistake raises, and the collector every validator reports to.

Validation never stops at the first mistake: each validator adds what it finds to one
:class:`Problems` and carries on with the rest of the file, and the loader raises one
:class:`ConfigError` holding every mistake at the end (a TOML syntax error is the one
exception: the parser stops there).
"""

from __future__ import annotations

from collections.abc import Sequence

from latgate.foundation.config.masking import mask_secrets
from latgate.foundation.config.positions import KeyLines


class ConfigError(Exception):
    """Config mistakes: this one, then the rest of the same file in ``more``.

    Attributes:
        source: the file path (or ``<builtin>``, ``command line``).
        key: key path as written in the file, e.g. ``providers.vllm.endpoints[1].url``
            or ``decode.api_base`` (empty for a TOML syntax error).
        message: what is wrong.
        fix: how to fix it: the closest valid name, the range a number must be in, the
            form a value takes (may be empty).
        line / column: where in the file (1-based; None when the key is not written
            there, e.g. a missing section).
        more: the further mistakes found in the same run, each a ConfigError.

    Anything that looks like a key is masked in ``key``, ``message`` and ``fix``
    (:func:`~latgate.foundation.config.masking.mask_secrets`). :meth:`lines` renders each mistake as
    ``"{source}[:{line}[:{column}]]: {key}: {message}[; {fix}]"``, then, for more than one,
    a count line; ``str(err)`` joins them with newlines. The CLI prints each line as
    ``latgate: error: LINE`` and exits 1, never a traceback.
    """

    def __init__(
        self,
        *,
        source: str,
        key: str,
        message: str,
        fix: str = "",
        line: int | None = None,
        column: int | None = None,
        more: Sequence[ConfigError] = (),
    ) -> None:
        self.source = source
        self.key = mask_secrets(key)
        self.message = mask_secrets(message)
        self.fix = mask_secrets(fix)
        self.line = line
        self.column = column
        self.more = tuple(more)
        super().__init__(str(self))

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error reporting all of ``errors`` (non-empty): the first, the rest as ``more``."""
        first = errors[0]
        return cls(
            source=first.source, key=first.key, message=first.message, fix=first.fix,
            line=first.line, column=first.column, more=errors[1:],
        )  # fmt: skip

    def errors(self) -> list[ConfigError]:
        """Every mistake, this one first, each without ``more``."""
        return [self, *(e for other in self.more for e in other.errors())]

    def line_text(self) -> str:
        """This mistake alone as one line (see the class docstring)."""
        where = self.source
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{text}; {self.fix}" if self.fix else text

    def lines(self) -> list[str]:
        """One line per mistake, then ``N errors in FILE`` when there is more than one."""
        errors = self.errors()
        lines = [e.line_text() for e in errors]
        return lines + [f"{len(errors)} errors in {self.source}"] if len(errors) > 1 else lines

    def as_dicts(self) -> list[dict[str, object]]:
        """Every mistake as ``{"file", "line", "column", "key", "message", "fix"}`` (JSON-ready)."""
        return [
            {"file": e.source, "line": e.line, "column": e.column, "key": e.key, "message": e.message, "fix": e.fix}
            for e in self.errors()
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


class Problems:
    """The collector of one load: every validator reports its mistakes here and goes on.

    A mistake is placed at the line its key is written on (``lines``; the nearest
    written parent for a missing key). Only the first mistake at one key path is kept,
    so a value already reported (an unset ``${VAR}``, a wrong type) is not reported
    again by a later check of the same key.

    Mistakes come in two phases: the structure of each section (keys, types, ranges,
    URLs, names), then, after :meth:`start_references`, the names one section uses
    from another (providers, models, policies). :meth:`errors` gives them structural
    first, each phase in file order.

    Example::

        problems = Problems("gw.toml", KeyLines(text))
        problems.add("server.port", "must be at most 65535 (got 70000)", "e.g. port = 8000")
        problems.raise_if_any()  # ConfigError: gw.toml:2: server.port: ...
    """

    def __init__(self, source: str, lines: KeyLines | None = None) -> None:
        self.source = source
        self._lines = lines
        self._found: list[tuple[int, float, int, ConfigError]] = []
        self._keys: set[str] = set()
        self._phase = 0

    def add(self, key: str, message: str, fix: str = "") -> None:
        """Report a mistake at ``key`` (a key path as written in the file)."""
        if key in self._keys:
            return
        self._keys.add(key)
        line = self._lines.line_of(key) if self._lines is not None else None
        error = ConfigError(source=self.source, key=key, message=message, fix=fix, line=line)
        self._found.append((self._phase, float("inf") if line is None else line, len(self._found), error))

    def has(self, key: str) -> bool:
        """True when a mistake was reported at ``key`` or inside it (``key.sub``, ``key[0]``)."""
        return any(k == key or k.startswith((f"{key}.", f"{key}[")) for k in self._keys)

    def start_references(self) -> None:
        """Mistakes reported from now on are cross-references, listed after the structural ones."""
        self._phase = 1

    def errors(self) -> list[ConfigError]:
        """Every mistake: structural first, then references, each phase by line, then as found."""
        return [error for *_, error in sorted(self._found, key=lambda found: found[:3])]

    def raise_if_any(self) -> None:
        """Raises:
            ConfigError: holding every mistake reported (see :meth:`errors`), if any.
        """
        if self._found:
            raise ConfigError.of(self.errors())
