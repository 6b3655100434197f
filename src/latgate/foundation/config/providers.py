"""Provider sections -> :class:`~latgate.foundation.config.schema.ProviderConfig`.

One section gives its address as ``api_base`` (``base_url`` is a synonym) or as
``endpoints = ["http://a:1/v1", {url = "http://b:2/v1"}]`` for replicas, whose ids are
``NAME-0``, ``NAME-1``... in order (one ``api_base`` is the endpoint ``NAME-0``); a
table entry may also give that replica's ``max_batch_size`` and ``weight``. URLs
must be http(s) with a host, without whitespace, query or fragment (not even an empty
``?`` or ``#``: paths are appended to the base), not ending in an operation path
(``/chat/completions``, ``/completions``, ``/embeddings``, ``/messages``, ``/responses``:
a full URL pasted, which would call the operation twice), and without ``user:password@`` when
``api_key_env`` is set (the upstream can take one ``Authorization`` only); only a
trailing slash is removed (the version segment is :attr:`EndpointConfig.base_url`'s
business; ``api_base_exact = true`` uses each URL as given). Two endpoints that call the same versioned URL (``http://h:1`` and
``http://h:1/v1``) are duplicates. Engine settings from
:data:`~latgate.foundation.config.keys.ENGINE_HINT_KEYS` and an explicit ``hints`` table go to
``hints``. ``connector`` defaults to the ``engine`` when that names a connector
(``engine = "vllm"`` gets vLLM's load gauges), else ``openai``.

``extra_body`` fields are added to each upstream request the client did not set them
in, so they must encode as JSON (orjson: integers within 64 bits, nesting under 255
levels) and may not name what the request itself decides (:data:`REQUEST_OWNED_FIELDS`).
``models`` lists non-empty names, each once; ``models = []`` is refused (leaving the key
out is how a provider serves any model name, and an empty list looks like the opposite). A ``tokenizer`` (relative paths are
taken from the config file's folder) must load here, so ``latgate check`` fails on it
exactly when ``latgate serve`` would.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from latgate.foundation.config.connector_names import (
    BUILTIN_NAMES,
    UnknownConnector,
    known_connectors,
    load_plugin,
)
from latgate.foundation.config.egress import Proxy, tls_context
from latgate.foundation.config.errors import Problems
from latgate.foundation.config.keys import (
    ENGINE_HINT_KEYS,
    PROVIDER_KEYS,
    check_keys,
    key_path,
    require_table,
    show,
    suggestion,
    validate_model,
)
from latgate.foundation.config.masking import looks_like_secret
from latgate.foundation.config.schema import EndpointConfig, ProviderConfig, versioned_base
from latgate.foundation.config.shapes import ProviderSection
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


#: the role a provider has when it sets none and its connector says what kind of pool it
#: is: a TileRT PD router is a low-latency decode pool (docs/configuration.md "What role
#: does"); vLLM and SGLang engines serve either kind, so they get none
EVIDENT_ROLES = {"tile_rt_connector": "decode"}

def build_provider(section: ProviderSection, problems: Problems) -> ProviderConfig | None:
    """Validate one provider section and return its frozen config.

    Every mistake is reported to ``problems`` (then the returned config, if any, holds
    only the parts that were right): unknown key (closest name given), no address or
    two kinds of address, a URL that is not http(s) with a host, a duplicate endpoint
    URL, an ``api_key_env`` that is not a variable name, an unknown connector (the
    known ones listed), a wrong type or a number out of range, ``extra_body``,
    ``models``, ``tokenizer``, proxy and TLS files. None when the section cannot be
    built at all.
    """
    source = problems.source
    table = check_keys(
        section.table,
        (*PROVIDER_KEYS, *ENGINE_HINT_KEYS),
        problems,
        prefix=section.key,
        extra_fix=" (other engine settings go under hints = { ... })",
    )
    endpoints = _endpoints(section, table, problems)
    if table.get("models") == []:
        problems.add(
            key_path(section.key, "models"),
            "an empty list names no model, yet a provider without models serves any model name",
            'list the names it serves, e.g. models = ["Qwen/Qwen2.5-7B-Instruct"], or remove the key to serve any model',
        )
    connector = table.get("connector", _connector_for_engine(table.get("engine")))
    connector_ok = _check_connector(connector, problems, key=key_path(section.key, "connector"))
    _check_api_key_env(table.get("api_key_env"), problems, key=key_path(section.key, "api_key_env"))
    hints = require_table(table.get("hints", {}), problems, key=key_path(section.key, "hints")) or {}
    hints.update({k: v for k, v in table.items() if k in ENGINE_HINT_KEYS})
    fields = {
        k: v for k, v in table.items() if k not in ENGINE_HINT_KEYS and k not in ("api_base", "base_url", "hints")
    }
    fields.update(name=section.name, endpoints=endpoints, hints=hints)
    if connector_ok:
        fields["connector"] = connector
    for name in ("ca_file", "client_cert", "client_key"):  # relative to the config file, as tokenizer
        if isinstance(path := fields.get(name), str):
            fields[name] = str(tokenizer_path(source, path))
    if section.role is not None:
        fields["role"] = section.role
    if "role" not in fields and connector_ok and connector in EVIDENT_ROLES:
        fields["role"] = EVIDENT_ROLES[connector]
    provider = validate_model(ProviderConfig, fields, problems, prefix=section.key)
    if provider is None:
        return None
    _check_extra_body(provider.extra_body, problems, key=key_path(section.key, "extra_body"))
    _check_models(provider.models, problems, key=key_path(section.key, "models"))
    _check_tokenizer(provider.tokenizer, problems, key=key_path(section.key, "tokenizer"))
    _check_egress(provider, problems, prefix=section.key)
    return provider


def _check_egress(provider: ProviderConfig, problems: Problems, *, prefix: str) -> None:
    """The proxy URL parses; the CA, certificate and key files load (so ``latgate
    check`` fails where ``serve`` would)."""
    if isinstance(provider.proxy, str):
        try:
            Proxy.parse(provider.proxy)
        except ValueError as exc:
            problems.add(
                key_path(prefix, "proxy"), str(exc),
                'write proxy = "http://HOST:PORT" (user:password@ for Basic credentials), or proxy = false',
            )  # fmt: skip
    if provider.client_key and not provider.client_cert:
        problems.add(
            key_path(prefix, "client_key"), "client_key is given without client_cert",
            "add client_cert = \"PATH\" (the certificate the key belongs to)",
        )  # fmt: skip
        return
    try:
        tls_context(
            ca_file=provider.ca_file, client_cert=provider.client_cert, client_key=provider.client_key,
            verify=provider.verify, env={},
        )  # fmt: skip
    except (OSError, ssl.SSLError) as exc:
        key = "ca_file" if provider.ca_file and not provider.client_cert else "client_cert"
        reason = exc.strerror or str(exc)  # ssl.SSLError is an OSError
        problems.add(
            key_path(prefix, key), f"cannot load the TLS files: {reason}",
            "give PEM files that exist (ca_file: the CA bundle; client_cert/client_key: the certificate and its key)",
        )  # fmt: skip


def tokenizer_path(source: str, tokenizer: str) -> Path:
    """Where a file a provider names (``tokenizer``, ``ca_file``, ``client_cert``,
    ``client_key``) is: relative paths are taken from the folder of the config file
    ``source`` (when it is a file), ``~`` is expanded."""
    candidate = Path(tokenizer).expanduser()
    config_file = Path(source)
    if candidate.is_absolute() or not config_file.is_file():
        return candidate
    return config_file.parent / candidate


def _endpoints(section: ProviderSection, table: dict[str, object], problems: Problems) -> tuple[EndpointConfig, ...]:
    """The section's endpoints; each bad one reported and left out."""
    given = [k for k in ("api_base", "base_url", "endpoints") if k in table]
    if not given:
        problems.add(key_path(section.key, "api_base"), f"{section.label} gives no address for its engine", _ADDRESS_FIX)
        return ()
    if len(given) > 1:
        problems.add(
            key_path(section.key, given[1]),
            f"{given[0]} is given too",
            "give one address: api_base (base_url is the same key) or endpoints = [...] for replicas",
        )
    if given[0] != "endpoints":
        urls: list[tuple[str, object, EndpointSettings]] = [(key_path(section.key, given[0]), table[given[0]], {})]
    else:
        urls = _endpoint_urls(table["endpoints"], problems, key=key_path(section.key, "endpoints"))
    seen: dict[str, str] = {}
    endpoints = []
    for index, (key, url, settings) in enumerate(urls):
        api_base = _checked_url(url, problems, key=key)
        if api_base is None:
            continue
        if "api_key_env" in table and urlsplit(api_base).username is not None:
            problems.add(
                key,
                f"{show(api_base)} carries user:password@ and api_key_env is set too, "
                "but an upstream request takes one Authorization only",
                "remove the user:password@ part, or remove api_key_env",
            )
        if (operation := _operation_in_base(api_base)) is not None:
            problems.add(
                key,
                f"{show(api_base)} ends with the operation path {operation}, but latgate appends the "
                f"operation to the base URL, even with api_base_exact (it would call ...{operation}/chat/completions)",
                _base_fix(key, api_base[: -len(operation)]),
            )
            continue
        exact = table.get("api_base_exact") is True
        calls = versioned_base(api_base, exact=exact)
        if calls in seen:
            problems.add(
                key, f"duplicate endpoint {show(api_base)}: it calls {show(calls)} like {seen[calls]}", "list each replica once"
            )
            continue
        seen[calls] = key
        endpoints.append(EndpointConfig(id=f"{section.name}-{index}", api_base=api_base, exact=exact, **settings))
    return tuple(endpoints)


def _endpoint_urls(value: object, problems: Problems, *, key: str) -> list[tuple[str, object, EndpointSettings]]:
    """Each entry's key path, URL and per-endpoint settings (``max_batch_size``,
    ``weight`` of a table entry)."""
    if not isinstance(value, list) or not value:
        problems.add(
            key,
            f"expected a non-empty list of URLs, got {show(value)}",
            'write endpoints = ["http://HOST:PORT/v1", ...] or [{ url = "http://HOST:PORT/v1" }, ...]',
        )
        return []
    urls: list[tuple[str, object, EndpointSettings]] = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            urls.append((key_path(key, index), item, {}))
            continue
        entry = check_keys(item, ("url", *_ENDPOINT_SETTINGS), problems, prefix=key_path(key, index))
        settings = {
            name: setting
            for name in _ENDPOINT_SETTINGS
            if name in entry
            and (setting := _endpoint_setting(entry[name], name, problems, key=key_path(key, index, name))) is not None
        }
        if "url" not in entry:
            problems.add(key_path(key, index, "url"), "missing", 'write { url = "http://HOST:PORT/v1" }')
            continue
        urls.append((key_path(key, index, "url"), entry["url"], settings))
    return urls


_ENDPOINT_SETTINGS = ("max_batch_size", "weight")
#: an endpoint table entry's settings, checked: keyword arguments of EndpointConfig
#: (pydantic validates them again), so their values are typed there, not here
EndpointSettings = dict[str, Any]


def _endpoint_setting(value: object, name: str, problems: Problems, *, key: str) -> object | None:
    """A table entry's ``max_batch_size`` (a whole number >= 1) or ``weight`` (a number > 0)."""
    whole = name == "max_batch_size"
    number: int | float | None = None
    if (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and not whole):
        number = value
    if number is None or number <= 0:
        problems.add(
            key,
            f"expected a {'whole number' if whole else 'number'} above 0, got {show(value)}",
            f"write {name} = {'8' if whole else '1'}",
        )
        return None
    return number if whole else float(number)


def _checked_url(url: object, problems: Problems, *, key: str) -> str | None:
    """``url`` with a trailing slash removed, or None after reporting that it is not
    http(s) with a host."""
    if not isinstance(url, str):
        problem: str | None = f"expected a URL string, got {show(url)}"
    else:
        url = url.strip()
        problem = _url_problem(url)
    if problem:
        problems.add(key, problem, 'write it like "http://HOST:PORT/v1"')
        return None
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


_OPERATIONS = ("/chat/completions", "/completions", "/embeddings", "/messages", "/responses")
"""Paths latgate appends to a base URL: a base ending in one is a full URL pasted."""


def _base_fix(key: str, base: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    return f"write {show(base)} (the base URL)" if leaf.endswith("]") else f"write {leaf} = {show(base)}"


def _operation_in_base(url: str) -> str | None:
    """The operation path ``url`` (checked, no trailing slash) ends with, if any."""
    path = urlsplit(url).path
    return next((op for op in _OPERATIONS if path.endswith(op)), None)


def _check_tokenizer(tokenizer: str | None, problems: Problems, *, key: str) -> None:
    if tokenizer is None:
        return
    try:
        ExactTokenizer(tokenizer_path(problems.source, tokenizer))
    except TokenizerError as exc:
        problems.add(
            key,
            " ".join(str(exc).split()),
            "point it at a Hugging Face tokenizer.json, or remove it to use the estimate",
        )


def _check_extra_body(extra_body: dict[str, object], problems: Problems, *, key: str) -> None:
    owned = [field for field in REQUEST_OWNED_FIELDS if field in extra_body]
    for field in owned:
        problems.add(
            key_path(key, field),
            f"extra_body may not set {field}: {REQUEST_OWNED_FIELDS[field]}",
            "remove it from extra_body",
        )
    try:
        orjson.dumps(extra_body)
    except orjson.JSONEncodeError as exc:
        problems.add(
            key,
            f"cannot be sent as JSON ({exc})",
            "keep integers within 64 bits (-2^63 .. 2^64-1) and nesting shallow",
        )


def _check_models(models: tuple[str, ...], problems: Problems, *, key: str) -> None:
    for index, model in enumerate(models):
        if not model.strip():
            problems.add(
                key_path(key, index),
                "empty model name",
                'write the served model name, e.g. "Qwen/Qwen2.5-7B-Instruct", or remove it',
            )
        elif model in models[:index]:
            problems.add(key_path(key, index), f"{show(model)} is listed twice", "list each model once")


def _connector_for_engine(engine: object) -> str:
    return engine if isinstance(engine, str) and engine in known_connectors() else "openai"


def _check_connector(name: object, problems: Problems, *, key: str) -> bool:
    """True when ``name`` is a connector that loads; else reported."""
    known = known_connectors()
    if not isinstance(name, str) or name not in known:
        text = name if isinstance(name, str) else show(name)
        problems.add(key, f"unknown connector {show(name)}", suggestion(text, known, noun="known connector"))
        return False
    try:
        if name not in BUILTIN_NAMES:
            load_plugin(name)
    except UnknownConnector as exc:
        problems.add(key, str(exc), "reinstall the package that provides it, or pick another")
        return False
    return True


def _check_api_key_env(name: object, problems: Problems, *, key: str) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not _ENV_NAME.match(name) or looks_like_secret(name):
        problems.add(
            key,
            f"{show(name)} is not an environment variable name",
            'api_key_env names the variable holding the key (e.g. "MY_API_KEY"), not the key itself',
        )
