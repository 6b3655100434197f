"""The one error a config mistake raises."""

from __future__ import annotations

from collections.abc import Sequence

from latgate.config.masking import mask_secrets


class ConfigError(Exception):
    """A config mistake, rendered as one line naming the file, the key and the fix.

    Attributes:
        source: the file path (or ``<builtin>``).
        key: dotted key path, e.g. ``providers.vllm.connector`` or ``decode.api_base``.
        message: what is wrong.
        fix: how to fix it (may be empty).
        more: further mistakes of the same kind found in the same pass (every
            provider without an address, not only the first), each a ConfigError.

    Anything that looks like a key is masked in ``key``, ``message`` and ``fix``
    (:func:`~latgate.config.masking.mask_secrets`). ``str(err)`` is
    ``"{source}: {key}: {message}[; {fix}]"``, then one such line per error of
    ``more``; :meth:`lines` gives them as a list. The CLI prints each line as
    ``latgate: error: LINE`` and exits 1, never a traceback.
    """

    def __init__(
        self, *, source: str, key: str, message: str, fix: str = "", more: Sequence[ConfigError] = ()
    ) -> None:
        self.source = source
        self.key = mask_secrets(key)
        self.message = mask_secrets(message)
        self.fix = mask_secrets(fix)
        self.more = tuple(more)
        super().__init__(str(self))

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error reporting all of ``errors`` (non-empty): the first, the rest as ``more``."""
        first = errors[0]
        return cls(source=first.source, key=first.key, message=first.message, fix=first.fix, more=errors[1:])

    def lines(self) -> list[str]:
        """One line per mistake: this one, then those of ``more``."""
        line = f"{self.source}: {self.key}: {self.message}"
        return [f"{line}; {self.fix}" if self.fix else line, *(line for e in self.more for line in e.lines())]

    def __str__(self) -> str:
        return "\n".join(self.lines())
