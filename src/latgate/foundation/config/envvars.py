"""Environment variable references in config values: ``${VAR}``, ``${VAR:-default}``, ``${env:VAR}``.

Every string value (not table keys), at any depth, is expanded once; the result is not
expanded again (a number or boolean key takes such a string as its value: the result is
:class:`~latgate.foundation.config.scalars.Expanded`). The rule for a variable that has no value:

- ``${VAR}`` / ``${env:VAR}`` with ``VAR`` unset is a config error naming the key and the
  variable (a silently empty URL or model name would only fail later, further away);
  set but empty, it expands to the empty string.
- ``${VAR:-default}`` (also ``${env:VAR:-default}``) uses ``default`` when ``VAR`` is
  unset *or* empty, as POSIX shells do.

``api_key_env`` names a variable that is read when a request is sent, so a key never
sits in the resolved config: a ``${...}`` there is reported (write the name itself), not
expanded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from latgate.foundation.config.errors import Problems
from latgate.foundation.config.keys import key_path, show
from latgate.foundation.config.scalars import Expanded

_REFERENCE = re.compile(r"\$\{(?P<body>[^}]*)(?P<close>\}?)")
_BODY = re.compile(r"(?:env:)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)
_FORMS = "write ${VAR}, ${VAR:-default} or ${env:VAR}"


def expand_env(value: object, *, env: Mapping[str, str], problems: Problems, key: str = "") -> object:
    """``value`` with every ``${...}`` in its strings replaced from ``env``.

    Tables and lists are rebuilt (the input is not modified); other values are
    returned as they are. ``key`` is the key path of ``value`` in the file, used in
    messages. An unset variable without default, or a malformed reference, is
    reported to ``problems`` and the string is kept as written (any later check of
    that key is not reported again, see :class:`~latgate.foundation.config.errors.Problems`).
    """
    if isinstance(value, str) and key.rsplit(".", 1)[-1] == "api_key_env" and "${" in value:
        name = _BODY.fullmatch(value.strip()[2:-1])
        problems.add(
            key,
            f"{show(value)} is a ${{...}} reference, which stands for a variable's value",
            f'api_key_env names the variable: write api_key_env = "{name.group("name") if name else "MY_API_KEY"}"',
        )
        return value
    if isinstance(value, str):
        return _expand_string(value, env=env, problems=problems, key=key)
    if isinstance(value, Mapping):
        return {k: expand_env(v, env=env, problems=problems, key=key_path(key, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, env=env, problems=problems, key=key_path(key, i)) for i, v in enumerate(value)]
    return value


def _expand_string(text: str, *, env: Mapping[str, str], problems: Problems, key: str) -> str:
    def replace(match: re.Match[str]) -> str:
        reference = match.group(0)
        body = _BODY.fullmatch(match.group("body"))
        if not match.group("close") or body is None:
            problems.add(key, f"malformed variable reference {show(reference)}", _FORMS)
            return reference
        name, default = body.group("name"), body.group("default")
        if default is not None:
            if "${" in default:
                problems.add(
                    key,
                    f"nested reference in {reference}}} is not supported",
                    "give a literal default, e.g. ${VAR:-http://127.0.0.1:8001/v1}",
                )
                return reference
            return env.get(name) or default
        if name not in env:
            problems.add(
                key,
                f"environment variable {name} is not set",
                f"set {name} in the gateway's environment, or give a default: ${{{name}:-VALUE}}",
            )
            return reference
        return env[name]

    expanded = _REFERENCE.sub(replace, text)
    return Expanded(expanded) if "${" in text else expanded
