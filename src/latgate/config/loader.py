"""config.toml -> :class:`~latgate.config.schema.Config`.

The pipeline, one step per module:

1. parse with :mod:`tomllib` (a syntax error names the line);
2. expand ``${VAR}``, ``${VAR:-default}``, ``${env:VAR}`` in every string value
   (:mod:`latgate.config.envvars`);
3. rewrite pool sections and ``[default]`` into canonical sections (:mod:`latgate.config.shapes`);
4. validate each section into its frozen model: providers
   (:mod:`latgate.config.providers`), then routing, aliases, models and auth, whose
   names must resolve (:mod:`latgate.config.references`).

Any mistake is one :class:`ConfigError` naming the file, the key and the fix.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from latgate.config.envvars import expand_env
from latgate.config.errors import ConfigError
from latgate.config.keys import ModelT, check_keys, show, validate_model
from latgate.config.providers import build_provider, missing_address
from latgate.config.references import (
    build_auth,
    build_models,
    build_routing,
    check_model_name,
    expand_aliases,
    servable_models,
)
from latgate.config.schema import (
    Config,
    DefaultsConfig,
    HealthConfig,
    ProviderConfig,
    ServerConfig,
    StateConfig,
)
from latgate.config.shapes import Document, canonical_document
from latgate.store.resp import RedisAddress

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
    :mod:`latgate.config.shapes`).
    ``env`` defaults to :data:`os.environ`.

    Raises:
        ConfigError: TOML syntax (with line), unset variable, unknown key or section,
            wrong type, bad URL, unknown connector, provider defined twice or with no
            address, no providers, unknown provider/policy/model named anywhere, or
            an ``[[auth.keys]]`` entry with both or neither of ``key``/``key_sha256``.
    """
    env = os.environ if env is None else env
    raw = cast(dict[str, object], expand_env(_parse_toml(text, source=source), env=env, source=source))
    document = canonical_document(raw, source=source)
    return _build(document, source=source)


def _parse_toml(text: str, *, source: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        position = _TOML_POSITION.search(message)
        key = f"line {position.group(1)}" if position else "syntax"
        problem = _TOML_POSITION.sub("", message)
        fix = "fix the syntax there (strings need double quotes, sections are [name], key = value lines)"
        if text.startswith("\ufeff"):
            fix = "the file starts with a byte order mark (BOM): save it as UTF-8 without BOM"
        raise ConfigError(
            source=source, key=key, message=f"invalid TOML: {problem[:1].lower()}{problem[1:]}", fix=fix
        ) from None


def _check_redis_url(url: str, *, source: str) -> None:
    """A ConfigError unless ``url`` is a Redis URL the store can connect with."""
    try:
        RedisAddress.parse(url)
    except ValueError as exc:
        raise ConfigError(
            source=source,
            key="state.redis_url",
            message=f"{show(url)} is not a Redis URL: {exc}",
            fix='write it like "redis://HOST:6379/0" (or rediss://, unix://PATH?db=0); remove it for in-process state',
        ) from None


def _build(document: Document, *, source: str) -> Config:
    sections = document.sections
    server = _section(ServerConfig, sections["server"], source=source, key="server")
    if not server.host.strip():
        raise ConfigError(
            source=source,
            key="server.host",
            message="empty address",
            fix='write host = "127.0.0.1" (this machine only) or "0.0.0.0" (every interface), or remove it',
        )
    defaults = _section(DefaultsConfig, sections["defaults"], source=source, key=document.defaults_key)
    providers = _providers(document, source=source)
    routing = build_routing(
        sections["routing"], providers, source=source, default_route_key=document.default_route_key
    )
    aliases = expand_aliases(sections["aliases"], providers, source=source)
    servable = servable_models(providers, aliases)
    if routing.default_model is not None:
        check_model_name(routing.default_model, servable, source=source, key="routing.default_model")
    models = build_models(sections["models"], servable, source=source)
    auth = build_auth(sections["auth"], routing, servable, source=source) if document.auth_given else None
    state = _section(StateConfig, sections["state"], source=source, key="state")
    if state.redis_url is not None:
        _check_redis_url(state.redis_url, source=source)
    health = _section(HealthConfig, sections["health"], source=source, key="health")
    if health.max_open_sec < health.open_sec:
        raise ConfigError(
            source=source,
            key="health.max_open_sec",
            message=f"{show(health.max_open_sec)} is less than health.open_sec ({show(health.open_sec)})",
            fix="make max_open_sec at least open_sec (the first ejection's length)",
        )
    return Config(
        source=source,
        server=server,
        defaults=defaults,
        providers=providers,
        routing=routing,
        aliases=aliases,
        models=models,
        auth=auth,
        state=state,
        health=health,
    )


def _section(model_cls: type[ModelT], table: dict[str, object], *, source: str, key: str) -> ModelT:
    check_keys(table, tuple(model_cls.model_fields), source=source, prefix=key)
    return validate_model(model_cls, table, source=source, prefix=key)


def _providers(document: Document, *, source: str) -> dict[str, ProviderConfig]:
    if not document.providers:
        raise ConfigError(
            source=source,
            key="providers",
            message="no providers are defined",
            fix='add a [providers.NAME] section with api_base = "http://HOST:PORT/v1"',
        )
    missing = [e for section in document.providers if (e := missing_address(section, source=source))]
    if missing:
        raise ConfigError.of(missing)
    return {section.name: build_provider(section, source=source) for section in document.providers}
