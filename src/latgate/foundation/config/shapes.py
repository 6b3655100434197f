"""The document: a parsed config.toml, in either accepted shape, as canonical sections.

Two spellings besides ``[defaults]`` + ``[providers.NAME]`` are rewritten here, so the
rest of the loader sees one form:

- pool sections: ``[upstream]``, ``[decode]`` and ``[prefill]`` are shorthand providers.
  ``[upstream]`` is the provider ``upstream`` (role ``upstream``); ``[decode]`` and
  ``[prefill]`` are named after their ``engine`` value (roles ``decode``/``prefill``),
  which is the name its ``[routing]`` refers to.
- the provider table's ``[default]``: ``[defaults]`` plus ``provider`` (the default route) and the
  ``api_base``/``api_key_env`` of that provider repeated. Those fill in what the
  provider section leaves out and must agree with what it gives; when the named
  provider has no section but ``api_base`` is given, ``[default]`` defines it.

Providers keep file order. Each remembers where it was written (``providers.vllm``,
``decode``), so messages name the key the user typed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from latgate.foundation.config.errors import Problems
from latgate.foundation.config.keys import (
    DEFAULT_SECTION_KEYS,
    SECTIONS,
    check_keys,
    key_path,
    require_table,
    show,
    suggestion,
)
from latgate.foundation.config.masking import mask_url
from latgate.foundation.config.schema import DefaultsConfig, versioned_base

_PROVIDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RESERVED_PROVIDER_NAMES = ("none", "other")
"""Names a provider may not take: latgate's metrics use them as label values (``none``:
a request no provider took; ``other``: a model outside the configured ones)."""
_SHORTHAND_ROLES: dict[str, Literal["upstream", "decode", "prefill"]] = {
    "upstream": "upstream",
    "decode": "decode",
    "prefill": "prefill",
}


@dataclass(frozen=True)
class ProviderSection:
    """One provider table as written.

    ``key`` is its key path in the file (``providers.vllm``, ``decode``); ``name_key``
    the key that gave its name (``prefill.engine`` for a shorthand); ``label`` how
    messages refer to it; ``role`` the role a shorthand section implies. ``table`` may
    be completed by ``[default]`` (see :func:`canonical_document`).
    """

    name: str
    key: str
    name_key: str
    label: str
    table: dict[str, object]
    role: Literal["upstream", "decode", "prefill"] | None = None


@dataclass
class Document:
    """The canonical sections of one file, still plain tables (validated later).

    ``default_route_key`` is where ``routing.default_route`` was written
    (``default.provider`` when ``[default]`` names it) and ``defaults_key`` where the defaults were;
    ``seen_names`` maps each provider name to the section that defined it;
    ``broken_names`` and ``nameless_providers`` say which names a reference to a
    provider may use although no section for it could be read (so no "unknown
    provider" follows from a section that was already reported).
    """

    sections: dict[str, dict[str, object]]
    providers: list[ProviderSection]
    auth_given: bool = False
    defaults_key: str = "defaults"
    default_route_key: str = "routing.default_route"
    seen_names: dict[str, str] = field(default_factory=dict)
    #: provider names declared by a section too broken to build (not a table, a bad name)
    broken_names: set[str] = field(default_factory=set)
    #: a pool section lacks its ``engine``, so some provider's name is unknown
    nameless_providers: bool = False


def canonical_document(raw: dict[str, object], problems: Problems) -> Document:
    """Rewrite a parsed (and env-expanded) file into a :class:`Document`.

    Reports (to ``problems``) and leaves out: an unknown section, a section that is not
    a table, a shorthand without ``engine`` (``nameless_providers`` is then set), a
    provider defined twice (the first is kept), a bad provider name, a ``[default]``
    that contradicts the provider it names.
    """
    known = check_keys(raw, SECTIONS, problems, prefix="")
    tables = {
        name: table for name, value in known.items() if (table := require_table(value, problems, key=name)) is not None
    }
    doc = Document(
        sections={
            name: tables.get(name, {})
            for name in ("server", "defaults", "routing", "aliases", "models", "auth", "state", "health")
        },
        providers=[],
        auth_given="auth" in tables,
    )
    for name, table in tables.items():
        if name == "providers":
            for provider, body in table.items():
                key = key_path("providers", provider)
                provider_table = require_table(body, problems, key=key)
                if provider_table is None:
                    doc.broken_names.add(provider)
                    continue
                label = f'provider "{provider}"'
                _add(doc, ProviderSection(provider, key, key, label, provider_table), problems)
        elif name in _SHORTHAND_ROLES:
            section = _shorthand(name, table, problems)
            if section is None:
                doc.nameless_providers = True
            else:
                _add(doc, section, problems)
    if "default" in tables:
        _merge_default_section(doc, tables["default"], problems, defaults_given="defaults" in tables)
    return doc


def _shorthand(section: str, table: dict[str, object], problems: Problems) -> ProviderSection | None:
    role = _SHORTHAND_ROLES[section]
    given_role = table.get("role", role)
    if given_role != role:
        problems.add(
            f"{section}.role",
            f"role {show(given_role)} contradicts section [{section}]",
            "remove role (the section name sets it), or move the table to [providers.NAME]",
        )
    body = {k: v for k, v in table.items() if k != "role"}
    if section == "upstream":
        return ProviderSection("upstream", "upstream", "upstream", "section [upstream]", body, role)
    engine = table.get("engine")
    if not isinstance(engine, str) or not engine:
        problems.add(
            f"{section}.engine",
            f"section [{section}] gives no engine name",
            'add engine = "NAME" (the provider name [routing] refers to, e.g. "vllm")',
        )
        return None
    label = f'section [{section}] (engine "{engine}")'
    return ProviderSection(engine, section, f"{section}.engine", label, body, role)


def check_provider_name(name: str, problems: Problems, *, key: str) -> bool:
    """Report (and return False) unless ``name`` is a usable provider name.

    Usable: 1 to 64 of letters, digits and ``_ . -``, starting with a letter or digit
    (it goes into metric labels and the ``X-Latgate-Provider`` header), and not one of
    :data:`RESERVED_PROVIDER_NAMES`.
    """
    if not _PROVIDER_NAME.fullmatch(name):
        problems.add(
            key,
            f"provider name {show(name)} is not usable",
            "use 1 to 64 letters, digits and _ . - only, starting with a letter or digit",
        )
        return False
    if name in RESERVED_PROVIDER_NAMES:
        problems.add(
            key,
            f'provider name "{name}" is reserved (latgate\'s metrics use it as a label value)',
            "give the provider another name",
        )
        return False
    return True


def _add(doc: Document, section: ProviderSection, problems: Problems) -> None:
    if not check_provider_name(section.name, problems, key=section.name_key):
        doc.broken_names.add(section.name)
    earlier = doc.seen_names.get(section.name)
    if earlier is not None:
        problems.add(
            section.name_key,
            f'provider "{section.name}" is defined twice (also at {earlier})',
            "remove one of them, or give one a different name",
        )
        return
    doc.seen_names[section.name] = section.key
    doc.providers.append(section)


def _merge_default_section(doc: Document, table: dict[str, object], problems: Problems, *, defaults_given: bool) -> None:
    if defaults_given:
        problems.add(
            "default",
            "both [default] and [defaults] are given",
            "merge them into [defaults] (and move provider to [routing] default_route)",
        )
        return
    table = check_keys(table, (*DefaultsConfig.model_fields, *DEFAULT_SECTION_KEYS), problems, prefix="default")
    doc.sections["defaults"] = {k: v for k, v in table.items() if k in DefaultsConfig.model_fields}
    doc.defaults_key = "default"
    repeated = {k: v for k, v in table.items() if k in ("api_base", "base_url", "api_key_env")}
    provider = table.get("provider")
    if provider is None:
        if repeated:
            problems.add(
                key_path("default", next(iter(repeated))),
                "given without default.provider, so it belongs to no provider",
                'add provider = "NAME" to [default], or move it to [providers.NAME]',
            )
        return
    if not isinstance(provider, str):
        problems.add("default.provider", f"expected a provider name, got {show(provider)}", 'write provider = "NAME"')
        return
    routing = doc.sections["routing"]
    if "default_route" in routing and routing["default_route"] != provider:
        problems.add(
            "default.provider",
            f'"{provider}" contradicts routing.default_route {show(routing["default_route"])}',
            "keep only one of them",
        )
        return
    if "default_route" not in routing:
        routing["default_route"] = provider
        doc.default_route_key = "default.provider"
    _apply_repeated_settings(doc, provider, repeated, problems)


def _apply_repeated_settings(doc: Document, provider: str, repeated: dict[str, object], problems: Problems) -> None:
    target = next((p for p in doc.providers if p.name == provider), None)
    if target is None:
        if provider in doc.broken_names or not check_provider_name(provider, problems, key="default.provider"):
            return
        if "api_base" not in repeated and "base_url" not in repeated:
            if not doc.nameless_providers:  # it may be the one whose name is missing
                names = [p.name for p in doc.providers]
                problems.add(
                    "default.provider", f'unknown provider "{provider}"', suggestion(provider, names, noun="provider")
                )
            return
        label = f'section [default] (provider "{provider}")'
        doc.providers.insert(0, ProviderSection(provider, "default", "default.provider", label, dict(repeated)))
        doc.seen_names[provider] = "default"
        return
    addresses = _addresses(target.table)
    for key, value in repeated.items():
        if key == "api_key_env":
            given = target.table.get("api_key_env")
            if given is None:
                target.table["api_key_env"] = value
            elif given != value:
                problems.add(
                    "default.api_key_env",
                    f"{show(value)} differs from {target.key}.api_key_env {show(given)}",
                    "remove it from [default] or make the two equal",
                )
        elif not addresses:
            target.table["api_base"] = value
        elif not isinstance(value, str) or versioned_base(value.strip()) not in addresses:
            known = ", ".join(sorted(map(mask_url, addresses)))
            problems.add(
                f"default.{key}",
                f"{show(value)} is not an address of {target.label} ({known})",
                "remove it from [default] or make it equal to the provider's api_base",
            )


def _addresses(table: dict[str, object]) -> set[str]:
    """The URLs a provider table calls, as :func:`versioned_base` gives them (malformed
    entries skipped), so ``http://h:1`` and ``http://h:1/v1/`` are one address."""
    found = [table.get("api_base"), table.get("base_url")]
    endpoints = table.get("endpoints")
    if isinstance(endpoints, list):
        found += [e.get("url") if isinstance(e, dict) else e for e in endpoints]
    return {versioned_base(url.strip()) for url in found if isinstance(url, str)}
