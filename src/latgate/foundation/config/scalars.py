"""The scalar conversions pydantic would make that a config file never means.

TOML has booleans, integers and floats, so a config value of the wrong TOML type is a mistake,
not a spelling: pydantic's lax mode would read ``port = true`` as port 1, ``port = "8001"`` as
8001 and ``enabled = "off"`` as false. Every config model (:class:`~latgate.foundation.config.schema.Frozen`)
runs :func:`reject_converted_scalar` on each field before pydantic converts it.

A string that a ``${VAR}`` reference produced (:class:`Expanded`, from
:mod:`latgate.foundation.config.envvars`) is converted: an environment has only strings, so
``port = "${PORT}"`` is how a number comes from one.
"""

from __future__ import annotations

import types
import typing

from pydantic_core import PydanticCustomError

_SCALAR_WORDS = {bool: "true or false", int: "a whole number", float: "a number"}
"""What a ``bool``/``int``/``float`` field takes, in the words of a config error."""


class Expanded(str):
    """A config string with ``${...}`` references replaced by their values; pydantic
    takes it as a plain ``str`` (a field keeps no trace of it)."""


def reject_converted_scalar(annotation: object, value: object) -> None:
    """Raise when ``value`` fits a field annotated ``annotation`` only by conversion.

    A ``true``/``false`` for a number field (not also ``bool``) and a string for a
    ``bool``/``int``/``float`` field (not also ``str``), unless :class:`Expanded`, are
    rejected; other values pass
    to pydantic unchanged.

    Raises:
        PydanticCustomError: type ``bool_not_number``, or ``bool_type``/``int_type``/
            ``float_type`` naming the expected type (the loader's error text follows
            pydantic's type word, :func:`latgate.foundation.config.keys.validate_model`).
    """
    if not isinstance(value, bool | str):
        return
    kinds = _annotation_kinds(annotation)
    if isinstance(value, bool) and bool not in kinds and (int in kinds or float in kinds):
        raise PydanticCustomError("bool_not_number", "expected a number, not true/false")
    if isinstance(value, str) and not isinstance(value, Expanded) and str not in kinds:
        for kind, words in _SCALAR_WORDS.items():
            if kind in kinds:
                raise PydanticCustomError(f"{kind.__name__}_type", f"expected {words}, not a quoted string")


def _annotation_kinds(annotation: object) -> tuple[object, ...]:
    """The members of a union annotation (``int | None`` -> ``(int, NoneType)``), else itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)
