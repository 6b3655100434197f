"""``[routing]``, ``[aliases]``, ``[models]`` and ``[auth]``: each section's own shape,
then every name one section uses from another.

Routing names providers (``default_route``, ``route_latency_sensitive_to``,
``long_context_provider``, fallbacks keys and values, policies' ``route_to`` and
``long_context_provider``); aliases name providers and served models; ``[models]``,
``default_model`` and auth keys' allow-lists name public models; auth keys name
policies. A name that does not resolve is reported with the key and the closest valid
name: nothing is ever silently routed elsewhere.

Each section is read in two steps: ``build_*`` checks its keys, types and values
(structural mistakes), ``check_*`` its names once every section is read (reported after
the structural ones, see :class:`~latgate.foundation.config.errors.Problems`). A name is not
checked against a section that had mistakes of its own: :class:`Known` says what can
be trusted, so a broken provider section is not echoed as "unknown provider" or "no
provider serves" elsewhere.

A model is *servable* when a provider lists it, it is an alias, some provider
accepts any model (no ``models``), or ``[aliases]`` has the catch-all ``"*"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from latgate.foundation.config.errors import Problems
from latgate.foundation.config.keys import (
    check_keys,
    key_path,
    require_table,
    show,
    suggestion,
    validate_model,
)
from latgate.foundation.config.schema import (
    CATCH_ALL,
    STRATEGIES,
    AuthConfig,
    AuthKey,
    ModelConfig,
    PolicyConfig,
    ProviderConfig,
    RoutingConfig,
)


@dataclass(frozen=True)
class Known:
    """What the name checks may rely on after the structural pass.

    ``declared``: every provider name a section declares, built or not (a reference to
    one is never "unknown"); ``names_complete``: no provider's name is missing (a pool
    section without ``engine``), so a name not declared really is unknown.
    ``providers``: those that could be built, the keys with mistakes left at their
    defaults (a provider whose ``models`` was wrong accepts any model, so nothing is
    reported against it); ``complete``: every provider section could be built, so a
    model no one serves really is missing. ``broken``: the providers whose section had
    a mistake of its own (built or not): nothing is reported against them by name.
    """

    declared: frozenset[str]
    names_complete: bool
    providers: Mapping[str, ProviderConfig]
    complete: bool
    broken: frozenset[str] = frozenset()


def build_routing(
    table: dict[str, object], problems: Problems, *, first_provider: str | None
) -> tuple[RoutingConfig | None, tuple[str, ...] | None]:
    """``[routing]`` with ``default_route`` filled in (``first_provider`` when not given),
    and the names of its policies (every ``[routing.policies.NAME]``, even one with
    mistakes; None when ``policies`` is not a table). The routing config is None when
    it cannot be built."""
    table = check_keys(table, tuple(RoutingConfig.model_fields), problems, prefix="routing")
    if not _strategy_ok(table.get("strategy"), problems):
        table.pop("strategy")
    policies = require_table(table.get("policies", {}), problems, key="routing.policies")
    if policies is None:
        table.pop("policies")
        return _routing(table, problems, first_provider), None
    for name, policy in policies.items():
        policy_key = key_path("routing.policies", name)
        body = require_table(policy, problems, key=policy_key)
        if body is not None:
            policies[name] = check_keys(body, tuple(PolicyConfig.model_fields), problems, prefix=policy_key)
    if policies:
        table["policies"] = policies
    return _routing(table, problems, first_provider), tuple(policies)


def _routing(table: dict[str, object], problems: Problems, first_provider: str | None) -> RoutingConfig | None:
    if first_provider is None and "default_route" not in table:
        return None
    return validate_model(RoutingConfig, {"default_route": first_provider, **table}, problems, prefix="routing")


def check_routing(routing: RoutingConfig, known: Known, problems: Problems, *, default_route_key: str) -> None:
    """Every provider ``[routing]`` names exists, and the long-context rule has both its
    halves (reference phase)."""
    names = sorted(known.declared)

    def check(provider: str | None, key: str) -> None:
        if provider is not None and provider not in known.declared and known.names_complete:
            problems.add(key, f'unknown provider "{provider}"', suggestion(provider, names, noun="provider"))

    check(routing.default_route, default_route_key)
    check(routing.route_latency_sensitive_to, "routing.route_latency_sensitive_to")
    check(routing.long_context_provider, "routing.long_context_provider")
    for origin, nexts in routing.fallbacks.items():
        check(origin, key_path("routing.fallbacks", origin))
        for index, provider in enumerate(nexts):
            key = key_path("routing.fallbacks", origin, index)
            check(provider, key)
            if provider == origin or provider in nexts[:index]:
                problems.add(
                    key,
                    f'"{provider}" is listed twice in the fallback chain of "{origin}"',
                    "name each fallback once, never the provider itself",
                )
    for name, policy in routing.policies.items():
        check(policy.route_to, key_path("routing.policies", name, "route_to"))
        check(policy.long_context_provider, key_path("routing.policies", name, "long_context_provider"))
    _check_long_context_pair(routing, problems)


def _check_long_context_pair(routing: RoutingConfig, problems: Problems) -> None:
    """The long-context rule needs both halves: a threshold and a provider (in
    ``[routing]`` or in a policy); either alone would be silently ignored. Not checked
    when either half had a mistake of its own."""
    if problems.has("routing.long_context_threshold") or problems.has("routing.long_context_provider"):
        return
    policy_providers = [
        (name, p.long_context_provider) for name, p in routing.policies.items() if p.long_context_provider
    ]
    if routing.long_context_threshold is None:
        if routing.long_context_provider is not None:
            key = "routing.long_context_provider"
        elif policy_providers:
            key = key_path("routing.policies", policy_providers[0][0], "long_context_provider")
        else:
            return
        problems.add(
            key,
            "given without routing.long_context_threshold, so it would never be used",
            "add long_context_threshold = TOKENS to [routing] (e.g. 16384), or remove it",
        )
    elif routing.long_context_provider is None and not policy_providers and not problems.has("routing.policies"):
        problems.add(
            "routing.long_context_threshold",
            "given without a long_context_provider, so it would never be used",
            'add long_context_provider = "PROVIDER" to [routing], or remove the threshold',
        )


def _strategy_ok(strategy: object, problems: Problems) -> bool:
    if strategy is None or strategy in STRATEGIES:
        return True
    text = strategy if isinstance(strategy, str) else show(strategy)
    problems.add(
        "routing.strategy",
        f"unknown strategy {show(strategy)}",
        suggestion(text, STRATEGIES, noun="strategy", plural="strategies"),
    )
    return False


def build_aliases(table: dict[str, object], problems: Problems) -> dict[str, str | dict[str, str]]:
    """``[aliases]`` entries of the right shape: ``"public" = "served"`` or
    ``"public" = { PROVIDER = "served" }`` (non-empty, names as strings)."""
    aliases: dict[str, str | dict[str, str]] = {}
    for public, target in table.items():
        key = key_path("aliases", public)
        if isinstance(target, str):
            aliases[public] = target
        elif isinstance(target, Mapping):
            if not target:
                problems.add(key, "empty table", 'write { PROVIDER = "served-name" }')
                continue
            for provider, served in target.items():
                if not isinstance(served, str):
                    problems.add(
                        key_path(key, provider), f"expected a model name, got {show(served)}",
                        f'write {provider} = "served-name"',
                    )  # fmt: skip
            aliases[public] = {p: served for p, served in target.items() if isinstance(served, str)}
        else:
            problems.add(
                key,
                f"expected a model name or a table, got {show(target)}",
                f'write "{public}" = "served-name" or "{public}" = {{ PROVIDER = "served-name" }}',
            )
    return aliases


def expand_aliases(
    entries: Mapping[str, str | dict[str, str]], known: Known, problems: Problems
) -> dict[str, dict[str, str]]:
    """``[aliases]`` as ``{public: {provider: served}}`` (reference phase).

    ``"public" = "served"`` goes to every provider that lists ``served``; when none
    lists it, to every provider accepting any model; when there is none of those either
    it is reported. ``"public" = { PROVIDER = "served" }`` is kept as given, once each
    provider is known to accept ``served``.
    """
    providers = known.providers
    aliases: dict[str, dict[str, str]] = {}
    listed = sorted({m for p in providers.values() for m in p.models})
    for public, target in entries.items():
        key = key_path("aliases", public)
        if isinstance(target, str):
            takers = [p.name for p in providers.values() if target in p.models]
            takers = takers or [p.name for p in providers.values() if not p.models]
            if not takers and known.complete:
                problems.add(
                    key,
                    f'no provider serves "{target}"',
                    "add it to a provider's models, or " + suggestion(target, listed, noun="served model"),
                )
            aliases[public] = dict.fromkeys(takers, target)
            continue
        for provider, served in target.items():
            entry = key_path(key, provider)
            if provider not in known.declared:
                if known.names_complete:
                    problems.add(
                        entry, f'unknown provider "{provider}"', suggestion(provider, sorted(known.declared), noun="provider")
                    )
            elif provider in providers and provider not in known.broken and not providers[provider].serves(served):
                problems.add(
                    entry,
                    f'provider "{provider}" does not serve "{served}"',
                    suggestion(
                        served,
                        list(dict.fromkeys(providers[provider].models)),
                        noun="model",
                        plural=f'models of "{provider}"',
                    ),
                )
        aliases[public] = dict(target)
    return aliases


def servable_models(
    providers: Mapping[str, ProviderConfig], aliases: Mapping[str, object]
) -> list[str] | None:
    """Every model a client may name, or None when some provider accepts any model (or
    a catch-all ``"*"`` alias takes any name)."""
    if CATCH_ALL in aliases or any(not p.models for p in providers.values()):
        return None
    return list(dict.fromkeys([*(m for p in providers.values() for m in p.models), *aliases]))


def check_model_name(model: str, servable: list[str] | None, problems: Problems, *, key: str) -> None:
    """Report when no provider or alias takes ``model`` (never when ``servable`` is None:
    a provider accepts any model, or not every section could be read)."""
    if servable is not None and model not in servable:
        problems.add(
            key, f'no provider or alias serves model "{model}"', suggestion(model, servable, noun="servable model")
        )


def build_models(table: dict[str, object], problems: Problems) -> dict[str, ModelConfig]:
    """``[models."public-name"]`` sections of the right shape."""
    models = {}
    for public, section in table.items():
        key = key_path("models", public)
        body = require_table(section, problems, key=key)
        if body is None:
            continue
        body = check_keys(body, tuple(ModelConfig.model_fields), problems, prefix=key)
        model = validate_model(ModelConfig, body, problems, prefix=key)
        if model is not None:
            models[public] = model
    return models


def check_models(models: Mapping[str, ModelConfig], servable: list[str] | None, problems: Problems) -> None:
    """Each ``[models]`` name and its ``fallback_model`` is servable (reference phase)."""
    for public, model in models.items():
        key = key_path("models", public)
        check_model_name(public, servable, problems, key=key)
        if model.fallback_model is not None:
            check_model_name(model.fallback_model, servable, problems, key=key_path(key, "fallback_model"))


def build_auth(table: dict[str, object], problems: Problems) -> dict[str, AuthKey]:
    """``[auth]``: every ``[[auth.keys]]`` has one of key/key_sha256, each name and key
    once, and ``models`` (if given) not empty. The keys without mistakes, by their key path (``auth.keys[0]``)."""
    table = check_keys(table, tuple(AuthConfig.model_fields), problems, prefix="auth")
    entries = table.get("keys", [])
    if not isinstance(entries, list) or not entries:
        problems.add(
            "auth.keys",
            "[auth] is given but has no [[auth.keys]] entries",
            'add [[auth.keys]] with name and key = "${env:VAR}"; remove [auth] to run without keys',
        )
        return {}
    keys: dict[str, AuthKey] = {}
    names: set[str] = set()  # of every entry, even one with mistakes: a name is given once
    secrets: dict[tuple[str | None, str | None], str] = {}
    for index, entry in enumerate(entries):
        key = key_path("auth.keys", index)
        body = require_table(entry, problems, key=key)
        if body is None:
            continue
        body = check_keys(body, tuple(AuthKey.model_fields), problems, prefix=key)
        if body.get("models") == []:
            problems.add(
                key_path(key, "models"),
                "an empty list allows no model, yet a key without models may use every model",
                'list the models this key may use, e.g. models = ["glm-5.1"], or remove the key to allow every model',
            )
        auth_key = validate_model(AuthKey, body, problems, prefix=key)
        name = body.get("name")
        unique = not (isinstance(name, str) and name in names)
        if not unique:
            problems.add(key_path(key, "name"), f'duplicate key name "{name}"', "give each key its own name")
        elif isinstance(name, str):
            names.add(name)
        if auth_key is None or not _auth_key_ok(auth_key, problems, key=key):
            continue
        secret = (auth_key.key, auth_key.key_sha256)
        if secret in secrets:
            problems.add(key, f'same key as "{secrets[secret]}"', "give each client its own key")
            continue
        secrets[secret] = auth_key.name
        if unique:
            keys[key] = auth_key
    return keys


def _auth_key_ok(auth_key: AuthKey, problems: Problems, *, key: str) -> bool:
    if (auth_key.key is None) == (auth_key.key_sha256 is None):
        problems.add(
            key,
            f'key "{auth_key.name}" must give exactly one of key and key_sha256',
            'write key = "${env:VAR}" or key_sha256 = "<64 hex digits>", not both',
        )
        return False
    if auth_key.key is not None and not auth_key.key:
        problems.add(key_path(key, "key"), "empty key", "give a non-empty key")
        return False
    sha = auth_key.key_sha256
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha)):
        problems.add(
            key_path(key, "key_sha256"),
            "expected 64 hex digits",
            'write the SHA-256 of the key, e.g. from: printf %s "$KEY" | sha256sum',
        )
        return False
    return True


def check_auth(
    keys: Mapping[str, AuthKey], policies: tuple[str, ...] | None, servable: list[str] | None, problems: Problems
) -> None:
    """Each key's policy is defined (unless ``policies`` is None: unknown) and its
    models are servable (reference phase)."""
    for key, auth_key in keys.items():
        if auth_key.policy is not None and policies is not None and auth_key.policy not in policies:
            problems.add(
                key_path(key, "policy"),
                f'unknown policy "{auth_key.policy}"',
                f"define [routing.policies.{auth_key.policy}]"
                + (f" or {suggestion(auth_key.policy, policies, noun='policy', plural='policies')}" if policies else ""),
            )
        for model_index, model in enumerate(auth_key.models):
            check_model_name(model, servable, problems, key=key_path(key, "models", model_index))
