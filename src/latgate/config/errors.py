"""The one error a config mistake raises."""

from __future__ import annotations


class ConfigError(Exception):
    """A config mistake, rendered as one line naming the file, the key and the fix.

    Attributes:
        source: the file path (or ``<builtin>``).
        key: dotted key path, e.g. ``providers.vllm.connector`` or ``decode.api_base``.
        message: what is wrong.
        fix: how to fix it (may be empty).

    ``str(err)`` is ``"{source}: {key}: {message}[; {fix}]"``; the CLI prints exactly that
    line and exits 1, never a traceback.
    """

    def __init__(self, *, source: str, key: str, message: str, fix: str = "") -> None:
        self.source = source
        self.key = key
        self.message = message
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        line = f"{self.source}: {self.key}: {self.message}"
        return f"{line}; {self.fix}" if self.fix else line
