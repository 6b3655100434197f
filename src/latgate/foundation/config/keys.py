"""The config vocabulary: which keys each section accepts, and how a mistake is reported.

Every mistake reported here (to a :class:`~latgate.foundation.config.errors.Problems`) names the
key path as it is written in the file (``providers.vllm.api_bse``, ``decode.engine``,
``auth.keys[0].rpm``), says what is wrong in one line and how to fix it, with the
closest valid name (:mod:`difflib`) when one is near and the range a number takes.
Pydantic's validation errors are translated here and only here (all of them, not the
first), so its multi-line dump never reaches a user.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Collection, Mapping
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from latgate.foundation.config.errors import Problems
from latgate.foundation.config.masking import mask_url

ModelT = TypeVar("ModelT", bound=BaseModel)

SECTIONS = (
    "server",
    "defaults",
    "default",
    "providers",
    "upstream",
    "decode",
    "prefill",
    "routing",
    "aliases",
    "models",
    "auth",
    "state",
    "health",
)
"""Top-level tables: the canonical ones plus those of the other spellings (``default``, ``upstream``,
``decode``, ``prefill``)."""

PROVIDER_KEYS = (
    "api_base",
    "base_url",
    "endpoints",
    "api_key_env",
    "models",
    "extra_body",
    "engine",
    "connector",
    "role",
    "max_batch_size",
    "enable_prefix_cache",
    "prefix_cache_tokens",
    "responses_api",
    "tokenizer",
    "latency_sensitive",
    "timeout_sec",
    "max_connections",
    "first_token_keepalive_sec",
    "max_stream_sec",  # (sec, issue 23)
    "hints",
    "api_base_exact",
    "proxy",
    "ca_file",
    "client_cert",
    "client_key",
    "verify",
)
"""Keys of ``[providers.NAME]`` (and of the pool sections ``[upstream]``, ``[decode]``, ``[prefill]``)."""

ENGINE_HINT_KEYS = (
    # vLLM engine arguments
    "chunked_prefill",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "block_size",
    "swap_space",
    "speculative_model",
    "num_speculative_tokens",
    # SGLang server arguments
    "tp_size",
    "dp_size",
    "mem_fraction_static",
    "chunked_prefill_size",
    "max_running_requests",
    "max_prefill_tokens",
    "context_length",
    "attention_backend",
    "schedule_policy",
)
"""Engine capacity/launch settings accepted beside the provider keys and kept, untouched,
in ``ProviderConfig.hints`` (shown by ``latgate check``; latgate does not act on them).
Anything else goes under an explicit ``hints = { ... }`` table."""

DEFAULT_SECTION_KEYS = ("provider", "api_base", "base_url", "api_key_env")
"""Keys ``[default]`` accepts besides the ``[defaults]`` ones."""

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def key_path(prefix: str, *parts: str | int) -> str:
    """Join a key path as TOML would spell it: ``models."a/b".latency_sensitive``, ``keys[0]``."""
    path = prefix
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        segment = part if _BARE_KEY.match(part) else json.dumps(part, ensure_ascii=False)
        path = f"{path}.{segment}" if path else segment
    return path


def closest(name: str, choices: Collection[str]) -> str | None:
    """The valid name nearest to ``name``, or None.

    The longest choice written inside ``name`` first (``vllm_connector`` -> ``vllm``, not
    ``tile_rt_connector``, which only shares its ending); then difflib's best match
    (ratio >= 0.6); failing that, a choice that contains ``name``; each ignoring case and
    ``-``/``_`` (``tile-rt`` -> ``tile_rt_connector``).
    """
    folded = _fold(name)
    inside = [c for c in choices if len(c) >= 3 and _fold(c) in folded]
    if inside:
        return max(inside, key=len)
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    if matches:
        return matches[0]
    if len(folded) < 3:
        return None
    return next((c for c in choices if len(c) >= 3 and (folded in _fold(c) or _fold(c) in folded)), None)


def _fold(name: str) -> str:
    return name.lower().replace("-", "_")


def suggestion(name: str, choices: Collection[str], *, noun: str, plural: str | None = None) -> str:
    """Fix text: ``did you mean "x"? (NOUNs: a, b, c)``, or only the list when nothing is near."""
    plural = plural or f"{noun}s"
    listing = f"{plural}: {', '.join(choices)}" if choices else f"no {plural} are defined"
    near = closest(name, choices)
    return f'did you mean "{near}"? ({listing})' if near else listing


def show(value: object) -> str:
    """A config value as it would be written in TOML, shortened for a one-line message
    (a URL's password masked: ``latgate check`` prints these lines)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    text = json.dumps(mask_url(value), ensure_ascii=False) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def require_table(value: object, problems: Problems, *, key: str) -> dict[str, object] | None:
    """``value`` as a dict, or None after reporting that ``key`` must be a table."""
    if not isinstance(value, Mapping):
        problems.add(
            key,
            f"expected a table, got {show(value)}",
            f"write it as a [{key}] section or {key.rsplit('.', 1)[-1]} = {{ ... }}",
        )
        return None
    return dict(value)


def check_keys(
    table: Mapping[str, object], allowed: Collection[str], problems: Problems, *, prefix: str, extra_fix: str = ""
) -> dict[str, object]:
    """Report every key of ``table`` not in ``allowed``; return the table without them."""
    noun = "key" if prefix else "section"
    for key in table:
        if key not in allowed:
            near = closest(key, allowed)
            shown = (f'"{near}"' if prefix else f"[{near}]") if near else ""
            fix = f"did you mean {shown}?" if near else f"valid {noun}s here: {', '.join(allowed)}"
            problems.add(key_path(prefix, key), f"unknown {noun}", f"{fix}{extra_fix}")
    return {key: value for key, value in table.items() if key in allowed}


def validate_model(
    model_cls: type[ModelT], data: Mapping[str, object], problems: Problems, *, prefix: str
) -> ModelT | None:
    """``model_cls.model_validate(data)``, every error reported, translated.

    ``prefix`` is where ``data`` sits in the file (``server``, ``providers.vllm``,
    ``decode``), so an error names ``decode.max_batch_size``, not a pydantic location.
    With errors, the model is built again from the fields that had none (the others
    take their defaults), so the checks that follow still see the rest of the section;
    None when even that fails (a required field is missing or wrong).
    """
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
    for error in errors:
        _report(error, model_cls, problems, prefix=prefix)
    bad = {error["loc"][0] for error in errors if error["loc"]}
    rest = {key: value for key, value in data.items() if key not in bad}
    if len(rest) == len(data):
        return None
    try:
        return model_cls.model_validate(rest)
    except ValidationError:
        return None


def _report(error: ErrorDetails, model_cls: type[BaseModel], problems: Problems, *, prefix: str) -> None:
    loc = error["loc"]
    key = key_path(prefix, *loc)
    leaf = next((part for part in reversed(loc) if isinstance(part, str)), key)
    kind = str(error["type"])
    if kind == "extra_forbidden":
        parent = _model_at(model_cls, loc[:-1])
        near = closest(str(loc[-1]), parent.model_fields) if parent is not None else None
        problems.add(key, "unknown key", f'did you mean "{near}"?' if near else "remove it (see docs/configuration.md)")
        return
    if kind == "missing":
        problems.add(key, "missing", f"add {leaf} = ...")
        return
    message = _MESSAGES.get(kind.split("_")[0]) or str(error["msg"])
    message = message[0].lower() + message[1:]
    field = _field(model_cls, loc)
    value = error.get("input")
    fix = _type_fix(kind, leaf, field, value)
    if loc and isinstance(loc[-1], int) and kind.startswith("string_"):  # an item of a list of strings
        fix = f'write each item as a quoted string, e.g. {leaf} = ["..."]'
    problems.add(key, f"{message} (got {show(value)})", fix)


_MESSAGES = {
    "list": "input should be a list",
    "tuple": "input should be a list",
    "set": "input should be a list",
    "dict": "input should be a table",
}
"""Pydantic's Python type words replaced by TOML's (a ``tuple`` is written as a list)."""
TABLE_EXAMPLES = {"fallbacks": 'fallbacks = { PROVIDER = ["NEXT", ...] }'}
"""The shape of the table keys whose entries are not plain ``name = "value"``."""


_NUMBER_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _type_fix(kind: str, leaf: str, field: FieldInfo | None, value: object = None) -> str:
    example = f"{leaf} = {example_number(field, leaf)}"
    bounds = number_range(field)
    within = f" {bounds}" if bounds else ""
    if kind == "finite_number":
        return f"write a finite number{within} (not inf or nan), e.g. {example}"
    if kind.startswith("int_"):
        return f"write a whole number{within}, e.g. {example}"
    if kind == "bool_not_number" or kind.startswith("float_"):
        return f"write a number{within}, e.g. {example}"
    if kind in _NUMBER_BOUNDS:
        return f"write a number{within}, e.g. {example}" if bounds else f"e.g. {example}"
    if kind.startswith("bool_"):
        return f"write {leaf} = true or {leaf} = false"
    if kind.startswith("string_"):
        return f'write a quoted string, e.g. {leaf} = "..."'
    if kind.startswith(("list_", "tuple_", "set_")):
        item = json.dumps(value, ensure_ascii=False) if isinstance(value, str) and len(value) <= 60 else '"a", "b"'
        return f"write a list, e.g. {leaf} = [{item}]"
    if kind.startswith(("dict_", "model_")):
        return "write a table, e.g. " + TABLE_EXAMPLES.get(leaf, f'{leaf} = {{ name = "value" }}')
    if kind == "literal_error":
        return "use one of the values listed"
    return "change the value"


def _field(model_cls: type[BaseModel], loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The pydantic field an error location names, following nested models
    (``("endpoints", 0, "weight")`` in :class:`ProviderConfig` -> ``EndpointConfig.weight``)."""
    current: type[BaseModel] | None = model_cls
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        field = current.model_fields[part]
        current = _nested_model(field.annotation)
    return field


def _model_at(model_cls: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model a location's table is an instance of (``()`` -> ``model_cls``)."""
    if not loc:
        return model_cls
    field = _field(model_cls, loc)
    return _nested_model(field.annotation) if field is not None else None


def _nested_model(annotation: object) -> type[BaseModel] | None:
    """The model inside ``Model``, ``Model | None``, ``tuple[Model, ...]``, ``dict[str, Model]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def number_range(field: FieldInfo | None) -> str:
    """The values a number field takes, as words: ``from 0 to 65535``, ``above 0``,
    ``at least 1``, ``above 0 and at most 10000``; empty when it has no bounds."""
    if field is None:
        return ""
    low = high = ""
    for bound in field.metadata:
        if getattr(bound, "ge", None) is not None:
            low = f"at least {_number(bound.ge)}"
        elif getattr(bound, "gt", None) is not None:
            low = f"above {_number(bound.gt)}"
        elif getattr(bound, "le", None) is not None:
            high = f"at most {_number(bound.le)}"
        elif getattr(bound, "lt", None) is not None:
            high = f"below {_number(bound.lt)}"
    if low.startswith("at least") and high.startswith("at most"):
        return f"from {low[9:]} to {high[8:]}"
    return " and ".join(part for part in (low, high) if part)


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


NUMBER_EXAMPLES: dict[str, int] = {
    "max_batch_size": 8,
    "timeout_sec": 600,
    "first_token_timeout_sec": 30,
    "max_connections": 256,
    "first_token_keepalive_sec": 15,
    "max_stream_sec": 3600,  # (sec, issue 23)
    "latency_threshold_ms": 200,
    "latency_budget_ms": 200,
    "long_context_threshold": 16384,
    "max_context_tokens": 131072,
    "rpm": 60,
    "tpm": 100000,
    "prefix_cache_tokens": 262144,
}
"""Example values of the number keys that have no numeric default (optional ones)."""


def example_number(field: FieldInfo | None, leaf: str = "") -> int | float:
    """A value that fits a number field, for a fix's ``e.g. KEY = VALUE``: its default
    when that is a number (``port`` -> 8000, ``max_retries`` -> 1), else the key's
    :data:`NUMBER_EXAMPLES` entry (``rpm`` -> 60), else the smallest value its bounds
    allow (``gt=0`` -> 1), else 1. A whole float is shown as an integer (600.0 -> 600)."""
    if field is None:
        return NUMBER_EXAMPLES.get(leaf, 1)
    default = field.default
    if isinstance(default, int | float) and not isinstance(default, bool):
        return int(default) if float(default).is_integer() else default
    if leaf in NUMBER_EXAMPLES:
        return NUMBER_EXAMPLES[leaf]
    for bound in field.metadata:
        low = getattr(bound, "ge", None)
        if low is not None:
            return low if low > 0 else 1
        low = getattr(bound, "gt", None)
        if low is not None:
            return int(low) + 1
    return 1
