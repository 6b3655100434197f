"""Provider sections -> :class:`~latgate.config.schema.ProviderConfig`.

One section gives its address as ``api_base`` (``base_url`` is a synonym) or as
``endpoints = ["http://a:1/v1", {url = "http://b:2/v1"}]`` for replicas, whose ids are
``NAME-0``, ``NAME-1``... in order (one ``api_base`` is the endpoint ``NAME-0``); a
table entry may also give that replica's ``max_batch_size`` and ``weight``. URLs
must be http(s) with a host, without whitespace, query or fragment (not even an empty
``?`` or ``#``: paths are appended to the base), and without ``user:password@`` when
``api_key_env`` is set (the upstream can take one ``Authorization`` only); only a
trailing slash is removed (the version segment is :attr:`EndpointConfig.base_url`'s
business; ``api_base_exact = true`` uses each URL as given). Two endpoints that call the same versioned URL (``http://h:1`` and
``http://h:1/v1``) are duplicates. Engine settings from
:data:`~latgate.config.keys.ENGINE_HINT_KEYS` and an explicit ``hints`` table go to
``hints``. ``connector`` defaults to the ``engine`` when that names a connector
(``engine = "vllm"`` gets vLLM's load gauges), else ``openai``.

``extra_body`` fields are added to each upstream request the client did not set them
in, so they must encode as JSON (orjson: integers within 64 bits, nesting under 255
levels) and may not name what the request itself decides (:data:`REQUEST_OWNED_FIELDS`).
``models`` lists non-empty names, each once. A ``tokenizer`` (relative paths are
taken from the config file's folder) must load here, so ``latgate check`` fails on it
exactly when ``latgate serve`` would.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from latgate.config.errors import ConfigError
from latgate.config.keys import (
    ENGINE_HINT_KEYS,
    PROVIDER_KEYS,
    check_keys,
    key_path,
    require_table,
    show,
    suggestion,
    validate_model,
)
from latgate.config.masking import looks_like_secret
from latgate.config.schema import EndpointConfig, ProviderConfig, versioned_base
from latgate.config.shapes import ProviderSection
from latgate.connectors import UnknownConnector, get_connector, known_connectors
from latgate.proxy.egress import Proxy, tls_context
from latgate.routing.tokens import ExactTokenizer, TokenizerError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REQUEST_OWNED_FIELDS: dict[str, str] = {
    "stream": "whether to stream is the client's choice (a non-streaming client would get SSE bytes)",
    "stream_options": "stream options are the client's and the gateway's (usage is asked for already)",
    "model": "the upstream model name comes from models and [aliases]",
    "messages": "the prompt is the client's request",
    "prompt": "the prompt is the client's request",
    "input": "the input is the client's request",
}
"""Request fields ``extra_body`` may not set, with the reason given in the error."""
_ADDRESS_FIX = 'add api_base = "http://HOST:PORT/v1" (or endpoints = [...])'


def build_provider(section: ProviderSection, *, source: str) -> ProviderConfig:
    """Validate one provider section and return its frozen config.

    Raises:
        ConfigError: unknown key (closest name given), no address or two kinds of
            address, a URL that is not http(s) with a host, a duplicate endpoint URL,
            an ``api_key_env`` that is not a variable name, an unknown connector
            (the known ones listed), or a wrong type.
    """
    table = section.table
    check_keys(
        table,
        (*PROVIDER_KEYS, *ENGINE_HINT_KEYS),
        source=source,
        prefix=section.key,
        extra_fix=" (other engine settings go under hints = { ... })",
    )
    endpoints = _endpoints(section, source=source)
    connector = table.get("connector", _connector_for_engine(table.get("engine")))
    _check_connector(connector, source=source, key=key_path(section.key, "connector"))
    _check_api_key_env(table.get("api_key_env"), source=source, key=key_path(section.key, "api_key_env"))
    hints = dict(require_table(table.get("hints", {}), source=source, key=key_path(section.key, "hints")))
    hints.update({k: v for k, v in table.items() if k in ENGINE_HINT_KEYS})
    fields = {
        k: v for k, v in table.items() if k not in ENGINE_HINT_KEYS and k not in ("api_base", "base_url")
    }
    fields.update(name=section.name, endpoints=endpoints, connector=connector, hints=hints)
    for name in ("ca_file", "client_cert", "client_key"):  # relative to the config file, as tokenizer
        if isinstance(fields.get(name), str):
            fields[name] = str(tokenizer_path(source, fields[name]))
    if section.role is not None:
        fields["role"] = section.role
    provider = validate_model(ProviderConfig, fields, source=source, prefix=section.key)
    _check_extra_body(provider.extra_body, source=source, key=key_path(section.key, "extra_body"))
    _check_models(provider.models, source=source, key=key_path(section.key, "models"))
    _check_tokenizer(provider.tokenizer, source=source, key=key_path(section.key, "tokenizer"))
    _check_egress(provider, source=source, prefix=section.key)
    return provider


def _check_egress(provider: ProviderConfig, *, source: str, prefix: str) -> None:
    """The proxy URL parses; the CA, certificate and key files load (so ``latgate
    check`` fails where ``serve`` would)."""
    if isinstance(provider.proxy, str):
        try:
            Proxy.parse(provider.proxy)
        except ValueError as exc:
            raise ConfigError(
                source=source, key=key_path(prefix, "proxy"), message=str(exc),
                fix='write proxy = "http://HOST:PORT" (user:password@ for Basic credentials), or proxy = false',
            ) from None  # fmt: skip
    if provider.client_key and not provider.client_cert:
        raise ConfigError(
            source=source, key=key_path(prefix, "client_key"), message="client_key is given without client_cert",
            fix="add client_cert = \"PATH\" (the certificate the key belongs to)",
        )  # fmt: skip
    try:
        tls_context(
            ca_file=provider.ca_file, client_cert=provider.client_cert, client_key=provider.client_key,
            verify=provider.verify, env={},
        )  # fmt: skip
    except (OSError, ssl.SSLError) as exc:
        key = "ca_file" if provider.ca_file and not provider.client_cert else "client_cert"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            source=source, key=key_path(prefix, key), message=f"cannot load the TLS files: {reason}",
            fix="give PEM files that exist (ca_file: the CA bundle; client_cert/client_key: the certificate and its key)",
        ) from None  # fmt: skip


def tokenizer_path(source: str, tokenizer: str) -> Path:
    """Where a file a provider names (``tokenizer``, ``ca_file``, ``client_cert``,
    ``client_key``) is: relative paths are taken from the folder of the config file
    ``source`` (when it is a file), ``~`` is expanded."""
    candidate = Path(tokenizer).expanduser()
    config_file = Path(source)
    if candidate.is_absolute() or not config_file.is_file():
        return candidate
    return config_file.parent / candidate


def missing_address(section: ProviderSection, *, source: str) -> ConfigError | None:
    """The error for a section that gives no address (no ``api_base``, ``base_url``
    or ``endpoints``), else None: the loader checks every section before building any,
    so a file missing several addresses names them all in one run."""
    if any(k in section.table for k in ("api_base", "base_url", "endpoints")):
        return None
    return ConfigError(
        source=source,
        key=key_path(section.key, "api_base"),
        message=f"{section.label} gives no address for its engine",
        fix=_ADDRESS_FIX,
    )


def _endpoints(section: ProviderSection, *, source: str) -> tuple[EndpointConfig, ...]:
    table = section.table
    given = [k for k in ("api_base", "base_url", "endpoints") if k in table]
    if (missing := missing_address(section, source=source)) is not None:
        raise missing
    if len(given) > 1:
        raise ConfigError(
            source=source,
            key=key_path(section.key, given[1]),
            message=f"{given[0]} is given too",
            fix="give one address: api_base (base_url is the same key) or endpoints = [...] for replicas",
        )
    if given[0] != "endpoints":
        urls = [(key_path(section.key, given[0]), table[given[0]], {})]
    else:
        urls = _endpoint_urls(table["endpoints"], source=source, key=key_path(section.key, "endpoints"))
    seen: dict[str, str] = {}
    endpoints = []
    for index, (key, url, settings) in enumerate(urls):
        api_base = _checked_url(url, source=source, key=key)
        if "api_key_env" in table and urlsplit(api_base).username is not None:
            raise ConfigError(
                source=source,
                key=key,
                message=f"{show(api_base)} carries user:password@ and api_key_env is set too, "
                "but an upstream request takes one Authorization only",
                fix="remove the user:password@ part, or remove api_key_env",
            )
        exact = table.get("api_base_exact") is True
        calls = versioned_base(api_base, exact=exact)
        if calls in seen:
            raise ConfigError(
                source=source,
                key=key,
                message=f"duplicate endpoint {show(api_base)}: it calls {show(calls)} like {seen[calls]}",
                fix="list each replica once",
            )
        seen[calls] = key
        endpoints.append(EndpointConfig(id=f"{section.name}-{index}", api_base=api_base, exact=exact, **settings))
    return tuple(endpoints)


def _endpoint_urls(value: object, *, source: str, key: str) -> list[tuple[str, object, dict[str, object]]]:
    """Each entry's key path, URL and per-endpoint settings (``max_batch_size``,
    ``weight`` of a table entry)."""
    if not isinstance(value, list) or not value:
        raise ConfigError(
            source=source,
            key=key,
            message=f"expected a non-empty list of URLs, got {show(value)}",
            fix='write endpoints = ["http://HOST:PORT/v1", ...] or [{ url = "http://HOST:PORT/v1" }, ...]',
        )
    urls: list[tuple[str, object, dict[str, object]]] = []
    for index, item in enumerate(value):
        if isinstance(item, dict):
            check_keys(item, ("url", *_ENDPOINT_SETTINGS), source=source, prefix=key_path(key, index))
            if "url" not in item:
                raise ConfigError(
                    source=source,
                    key=key_path(key, index, "url"),
                    message="missing",
                    fix='write { url = "http://HOST:PORT/v1" }',
                )
            settings = {
                name: _endpoint_setting(item[name], name, source=source, key=key_path(key, index, name))
                for name in _ENDPOINT_SETTINGS
                if name in item
            }
            urls.append((key_path(key, index, "url"), item["url"], settings))
        else:
            urls.append((key_path(key, index), item, {}))
    return urls


_ENDPOINT_SETTINGS = ("max_batch_size", "weight")


def _endpoint_setting(value: object, name: str, *, source: str, key: str) -> object:
    """A table entry's ``max_batch_size`` (a whole number >= 1) or ``weight`` (a number > 0)."""
    whole = name == "max_batch_size"
    ok = not isinstance(value, bool) and isinstance(value, int if whole else (int, float)) and value > 0
    if not ok:
        raise ConfigError(
            source=source,
            key=key,
            message=f"expected a {'whole number' if whole else 'number'} above 0, got {show(value)}",
            fix=f"write {name} = {'8' if whole else '1'}",
        )
    return value if whole else float(value)


def _checked_url(url: object, *, source: str, key: str) -> str:
    """``url`` with a trailing slash removed, or a ConfigError if it is not http(s) with a host."""
    if not isinstance(url, str):
        problem: str | None = f"expected a URL string, got {show(url)}"
    else:
        url = url.strip()
        problem = _url_problem(url)
    if problem:
        raise ConfigError(source=source, key=key, message=problem, fix='write it like "http://HOST:PORT/v1"')
    return str(url).rstrip("/")


def _url_problem(url: str) -> str | None:
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"{show(url)} contains a space or control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError as exc:
        return f"{show(url)} is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{show(url)} is not an http(s) URL with a host"
    if "?" in url or "#" in url:
        return f"{show(url)} has a query or fragment (? or #), which a base URL cannot have"
    return None


def _check_tokenizer(tokenizer: str | None, *, source: str, key: str) -> None:
    if tokenizer is None:
        return
    try:
        ExactTokenizer(tokenizer_path(source, tokenizer))
    except TokenizerError as exc:
        raise ConfigError(
            source=source,
            key=key,
            message=" ".join(str(exc).split()),
            fix="point it at a Hugging Face tokenizer.json, or remove it to use the estimate",
        ) from None


def _check_extra_body(extra_body: dict[str, object], *, source: str, key: str) -> None:
    for field, reason in REQUEST_OWNED_FIELDS.items():
        if field in extra_body:
            raise ConfigError(
                source=source,
                key=key_path(key, field),
                message=f"extra_body may not set {field}: {reason}",
                fix="remove it from extra_body",
            )
    try:
        orjson.dumps(extra_body)
    except orjson.JSONEncodeError as exc:
        raise ConfigError(
            source=source,
            key=key,
            message=f"cannot be sent as JSON ({exc})",
            fix="keep integers within 64 bits (-2^63 .. 2^64-1) and nesting shallow",
        ) from None


def _check_models(models: tuple[str, ...], *, source: str, key: str) -> None:
    for index, model in enumerate(models):
        if not model.strip():
            raise ConfigError(
                source=source,
                key=key_path(key, index),
                message="empty model name",
                fix='write the served model name, e.g. "Qwen/Qwen2.5-7B-Instruct", or remove it',
            )
        if model in models[:index]:
            raise ConfigError(
                source=source,
                key=key_path(key, index),
                message=f"{show(model)} is listed twice",
                fix="list each model once",
            )


def _connector_for_engine(engine: object) -> str:
    return engine if isinstance(engine, str) and engine in known_connectors() else "openai"


def _check_connector(name: object, *, source: str, key: str) -> None:
    known = known_connectors()
    if not isinstance(name, str) or name not in known:
        text = name if isinstance(name, str) else show(name)
        raise ConfigError(
            source=source,
            key=key,
            message=f"unknown connector {show(name)}",
            fix=suggestion(text, known, noun="known connector"),
        )
    try:
        get_connector(name)
    except UnknownConnector as exc:
        raise ConfigError(
            source=source,
            key=key,
            message=str(exc),
            fix="reinstall the package that provides it, or pick another",
        ) from None


def _check_api_key_env(name: object, *, source: str, key: str) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not _ENV_NAME.match(name) or looks_like_secret(name):
        raise ConfigError(
            source=source,
            key=key,
            message=f"{show(name)} is not an environment variable name",
            fix='api_key_env names the variable holding the key (e.g. "MY_API_KEY"), not the key itself',
        )
