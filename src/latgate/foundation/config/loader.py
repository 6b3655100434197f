"""config.toml -> :class:`~latgate.foundation.config.schema.Config`.

The pipeline, one step per module:

1. parse with :mod:`tomllib` (a syntax error names the line);
2. expand ``${VAR}``, ``${VAR:-default}``, ``${env:VAR}`` in every string value
   (:mod:`latgate.foundation.config.envvars`);
3. rewrite pool sections and ``[default]`` into canonical sections (:mod:`latgate.foundation.config.shapes`);
4. validate each section into its frozen model: providers
   (:mod:`latgate.foundation.config.providers`), routing, aliases, models and auth
   (:mod:`latgate.foundation.config.references`), state, health;
5. check the names one section uses from another (providers, models, policies).

Every step reports to one :class:`~latgate.foundation.config.errors.Problems` and goes on, so one
run names every mistake of the file, each at its line (:mod:`latgate.foundation.config.positions`)
with its key path and fix; the loader raises one :class:`ConfigError` holding them all.
A TOML syntax error stops at step 1 (one error, with line and column).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from latgate.foundation.config.envvars import expand_env
from latgate.foundation.config.errors import ConfigError, Problems
from latgate.foundation.config.keys import ModelT, check_keys, show, validate_model
from latgate.foundation.config.listen_host import check_host
from latgate.foundation.config.positions import KeyLines
from latgate.foundation.config.providers import build_provider
from latgate.foundation.config.redis_url import RedisAddress
from latgate.foundation.config.references import (
    Known,
    build_aliases,
    build_auth,
    build_models,
    build_routing,
    check_auth,
    check_model_name,
    check_models,
    check_routing,
    expand_aliases,
    servable_models,
)
from latgate.foundation.config.schema import (
    AuthConfig,
    Config,
    DefaultsConfig,
    HealthConfig,
    ServerConfig,
    StateConfig,
)
from latgate.foundation.config.shapes import Document, canonical_document

DEFAULT_CONFIG_PATH = Path("config.toml")
CONFIG_ENV_VAR = "LATGATE_CONFIG"
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def resolve_config_path(cli_path: str | None, *, env: Mapping[str, str] | None = None) -> Path:
    """The config file to read: ``--config``, else ``$LATGATE_CONFIG``, else ``./config.toml``.

    ``env`` defaults to :data:`os.environ`; an empty ``$LATGATE_CONFIG`` counts as
    unset. The file is not opened here.

    Raises:
        ConfigError: ``--config ""`` (an empty path names no file; falling back to
            another one would run a config the user did not ask for).
    """
    env = os.environ if env is None else env
    if cli_path is not None and not cli_path.strip():
        raise ConfigError(
            source="command line",
            key="--config",
            message="empty path",
            fix=f"give the config file's path, or leave --config out to use ${CONFIG_ENV_VAR} or ./config.toml",
        )
    return Path(cli_path or env.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_PATH)


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read, expand and validate the config file at ``path``.

    Args:
        path: the TOML file; messages name it as given.
        env: variables for ``${VAR}`` expansion; defaults to :data:`os.environ`.

    Raises:
        ConfigError: the file cannot be read, or any mistake in it (see
            :func:`load_config_text`).

    Example::

        config = load_config("config.toml")
        config.providers["vllm"].endpoints[0].base_url  # 'http://127.0.0.1:8001/v1'
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            source=source,
            key="file",
            message="no such file",
            fix=f"create it, pass --config PATH or set ${CONFIG_ENV_VAR}",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source=source, key="file", message=f"not UTF-8 text ({exc.reason})", fix="save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(
            source=source,
            key="file",
            message=f"cannot read it ({exc.strerror})",
            fix="check the path and its permissions",
        ) from None
    return load_config_text(text, source=source, env=env)


def load_config_text(text: str, *, source: str, env: Mapping[str, str] | None = None) -> Config:
    """Parse and validate config TOML ``text``; ``source`` names it in messages.

    Accepts both shapes, a provider table (``[providers.NAME]``, ``[defaults]`` or
    ``[default]``) and pool sections (``[upstream]``, ``[decode]``, ``[prefill]``; see
    :mod:`latgate.foundation.config.shapes`).
    ``env`` defaults to :data:`os.environ`.

    Raises:
        ConfigError: holding every mistake of the file (``.errors()``), each with its
            line: unset variable, unknown key or section, wrong type, number out of
            range, bad URL, unknown connector, provider defined twice or with no
            address, no providers, an ``[[auth.keys]]`` entry with both or neither of
            ``key``/``key_sha256``, a bad ``[state] redis_url``, a ``[server] host``
            that is neither an IP address nor a host name; then the names that do
            not resolve (unknown provider, policy or model named anywhere). A TOML
            syntax error is the only mistake reported (the parser stops there), with
            its line and column.
    """
    env = os.environ if env is None else env
    parsed = _parse_toml(text, source=source)
    problems = Problems(source, KeyLines(text))
    raw = cast(dict[str, object], expand_env(parsed, env=env, problems=problems))
    config = _build(canonical_document(raw, problems), problems)
    problems.raise_if_any()
    assert config is not None  # every way to None reports a mistake
    return config


def _parse_toml(text: str, *, source: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        position = _TOML_POSITION.search(message)
        problem = _TOML_POSITION.sub("", message)
        fix = "fix the syntax there (strings need double quotes, sections are [name], key = value lines)"
        if text.startswith("\ufeff"):
            fix = "the file starts with a byte order mark (BOM): save it as UTF-8 without BOM"
        raise ConfigError(
            source=source,
            key="",
            message=f"invalid TOML: {problem[:1].lower()}{problem[1:]}",
            fix=fix,
            line=int(position.group(1)) if position else None,
            column=int(position.group(2)) if position else None,
        ) from None


def _check_redis_url(url: str, problems: Problems) -> None:
    """Report ``url`` unless it is a Redis URL the store can connect with."""
    try:
        RedisAddress.parse(url)
    except ValueError as exc:
        problems.add(
            "state.redis_url",
            f"{show(url)} is not a Redis URL: {exc}",
            'write it like "redis://HOST:6379/0" (or rediss://, unix://PATH?db=0); remove it for in-process state',
        )


# long: every section in the order problems are reported (structure, then the names between sections); the
# cross-checks read what the structural pass built, so one pass keeps that order visible
def _build(document: Document, problems: Problems) -> Config | None:
    """Every section, structure first, then the names between sections; None when
    anything was reported."""
    sections = document.sections
    server = _section(ServerConfig, sections["server"], problems, key="server")
    if isinstance(host := sections["server"].get("host"), str):  # also when another server key is wrong
        check_host(host, problems)
    defaults = _section(DefaultsConfig, sections["defaults"], problems, key=document.defaults_key)
    if not document.providers and not document.broken_names and not document.nameless_providers:
        problems.add(
            "providers",
            "no providers are defined",
            'add a [providers.NAME] section with api_base = "http://HOST:PORT/v1"',
        )
    built = {section.name: build_provider(section, problems) for section in document.providers}
    first = document.providers[0].name if document.providers else None
    routing, policies = build_routing(sections["routing"], problems, first_provider=first)
    alias_entries = build_aliases(sections["aliases"], problems)
    models = build_models(sections["models"], problems)
    auth_keys = build_auth(sections["auth"], problems) if document.auth_given else {}
    state = _section(StateConfig, sections["state"], problems, key="state")
    if state is not None and state.redis_url is not None:
        _check_redis_url(state.redis_url, problems)
    health = _section(HealthConfig, sections["health"], problems, key="health")
    if health is not None and health.max_open_sec < health.open_sec and not problems.has("health"):
        problems.add(
            "health.max_open_sec",
            f"{show(health.max_open_sec)} is less than health.open_sec ({show(health.open_sec)})",
            "make max_open_sec at least open_sec (the first ejection's length)",
        )

    problems.start_references()
    providers = {name: provider for name, provider in built.items() if provider is not None}
    known = Known(
        declared=frozenset([*document.seen_names, *document.broken_names]),
        names_complete=bool(document.seen_names) and not document.nameless_providers,
        providers=providers,
        complete=bool(providers) and len(providers) == len(built) and not document.broken_names,
        broken=frozenset(section.name for section in document.providers if problems.has(section.key)),
    )
    if routing is not None:
        check_routing(routing, known, problems, default_route_key=document.default_route_key)
    aliases = expand_aliases(alias_entries, known, problems)
    complete = known.complete and not document.nameless_providers and not problems.has("aliases")
    servable = servable_models(providers, aliases) if complete else None
    if routing is not None and routing.default_model is not None:
        check_model_name(routing.default_model, servable, problems, key="routing.default_model")
    check_models(models, servable, problems)
    check_auth(auth_keys, policies, servable, problems)
    if routing is None or server is None or defaults is None or state is None or health is None:
        return None
    return Config(
        source=problems.source,
        server=server,
        defaults=defaults,
        providers=providers,
        routing=routing,
        aliases=aliases,
        models=models,
        auth=AuthConfig(keys=tuple(auth_keys.values())) if document.auth_given else None,
        state=state,
        health=health,
    )


def _section(model_cls: type[ModelT], table: dict[str, object], problems: Problems, *, key: str) -> ModelT | None:
    table = check_keys(table, tuple(model_cls.model_fields), problems, prefix=key)
    return validate_model(model_cls, table, problems, prefix=key)
