"""Cross-section checks: every name one section uses must exist in another.

Routing names providers (``default_route``, ``route_latency_sensitive_to``,
``long_context_provider``, fallbacks keys and values, policies' ``route_to`` and
``long_context_provider``); aliases name providers and served models; ``[models]``,
``default_model`` and auth keys' allow-lists name public models; auth keys name
policies. A name that does not resolve is a ConfigError naming the key and the closest
valid name: nothing is ever silently routed elsewhere.

A model is *servable* when a provider lists it, it is an alias, some provider
accepts any model (empty ``models``), or ``[aliases]`` has the catch-all ``"*"``.
"""

from __future__ import annotations

from collections.abc import Mapping

from latgate.config.errors import ConfigError
from latgate.config.keys import check_keys, key_path, require_table, show, suggestion, validate_model
from latgate.config.schema import (
    CATCH_ALL,
    STRATEGIES,
    AuthConfig,
    AuthKey,
    ModelConfig,
    PolicyConfig,
    ProviderConfig,
    RoutingConfig,
)


def build_routing(
    table: dict[str, object], providers: Mapping[str, ProviderConfig], *, source: str, default_route_key: str
) -> RoutingConfig:
    """``[routing]`` with ``default_route`` filled in (first provider) and every provider name checked."""
    check_keys(table, tuple(RoutingConfig.model_fields), source=source, prefix="routing")
    _check_strategy(table.get("strategy"), source=source)
    policies = require_table(table.get("policies", {}), source=source, key="routing.policies")
    for name, policy in policies.items():
        policy_key = key_path("routing.policies", name)
        check_keys(
            require_table(policy, source=source, key=policy_key),
            tuple(PolicyConfig.model_fields),
            source=source,
            prefix=policy_key,
        )
    routing = validate_model(
        RoutingConfig, {"default_route": next(iter(providers)), **table}, source=source, prefix="routing"
    )
    names = list(providers)

    def check(provider: str | None, key: str) -> None:
        if provider is not None and provider not in providers:
            raise ConfigError(
                source=source,
                key=key,
                message=f'unknown provider "{provider}"',
                fix=suggestion(provider, names, noun="provider"),
            )

    check(routing.default_route, default_route_key)
    check(routing.route_latency_sensitive_to, "routing.route_latency_sensitive_to")
    check(routing.long_context_provider, "routing.long_context_provider")
    for origin, nexts in routing.fallbacks.items():
        check(origin, key_path("routing.fallbacks", origin))
        for index, provider in enumerate(nexts):
            key = key_path("routing.fallbacks", origin, index)
            check(provider, key)
            if provider == origin or provider in nexts[:index]:
                raise ConfigError(
                    source=source,
                    key=key,
                    message=f'"{provider}" is listed twice in the fallback chain of "{origin}"',
                    fix="name each fallback once, never the provider itself",
                )
    for name, policy in routing.policies.items():
        check(policy.route_to, key_path("routing.policies", name, "route_to"))
        check(policy.long_context_provider, key_path("routing.policies", name, "long_context_provider"))
    _check_long_context_pair(routing, source=source)
    return routing


def _check_long_context_pair(routing: RoutingConfig, *, source: str) -> None:
    """The long-context rule needs both halves: a threshold and a provider (in
    ``[routing]`` or in a policy); either alone would be silently ignored."""
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
        raise ConfigError(
            source=source,
            key=key,
            message="given without routing.long_context_threshold, so it would never be used",
            fix="add long_context_threshold = TOKENS to [routing] (e.g. 16384), or remove it",
        )
    if routing.long_context_provider is None and not policy_providers:
        raise ConfigError(
            source=source,
            key="routing.long_context_threshold",
            message="given without a long_context_provider, so it would never be used",
            fix='add long_context_provider = "PROVIDER" to [routing], or remove the threshold',
        )


def _check_strategy(strategy: object, *, source: str) -> None:
    if strategy is None or strategy in STRATEGIES:
        return
    text = strategy if isinstance(strategy, str) else show(strategy)
    raise ConfigError(
        source=source,
        key="routing.strategy",
        message=f"unknown strategy {show(strategy)}",
        fix=suggestion(text, STRATEGIES, noun="strategy", plural="strategies"),
    )


def expand_aliases(
    table: dict[str, object], providers: Mapping[str, ProviderConfig], *, source: str
) -> dict[str, dict[str, str]]:
    """``[aliases]`` as ``{public: {provider: served}}``.

    ``"public" = "served"`` goes to every provider that lists ``served``; when none
    lists it, to every provider accepting any model; when there is none of those either
    it is an error. ``"public" = { PROVIDER = "served" }`` is kept as given, once each
    provider is known to accept ``served``.
    """
    aliases: dict[str, dict[str, str]] = {}
    listed = sorted({m for p in providers.values() for m in p.models})
    for public, target in table.items():
        key = key_path("aliases", public)
        if isinstance(target, str):
            takers = [p.name for p in providers.values() if target in p.models]
            takers = takers or [p.name for p in providers.values() if not p.models]
            if not takers:
                raise ConfigError(
                    source=source,
                    key=key,
                    message=f'no provider serves "{target}"',
                    fix="add it to a provider's models, or "
                    + suggestion(target, listed, noun="served model"),
                )
            aliases[public] = dict.fromkeys(takers, target)
        elif isinstance(target, Mapping):
            aliases[public] = _alias_table(target, providers, source=source, key=key)
        else:
            raise ConfigError(
                source=source,
                key=key,
                message=f"expected a model name or a table, got {show(target)}",
                fix=f'write "{public}" = "served-name" or "{public}" = {{ PROVIDER = "served-name" }}',
            )
    return aliases


def _alias_table(
    target: Mapping[str, object], providers: Mapping[str, ProviderConfig], *, source: str, key: str
) -> dict[str, str]:
    if not target:
        raise ConfigError(
            source=source, key=key, message="empty table", fix='write { PROVIDER = "served-name" }'
        )
    for provider, served in target.items():
        entry = key_path(key, provider)
        if provider not in providers:
            raise ConfigError(
                source=source,
                key=entry,
                message=f'unknown provider "{provider}"',
                fix=suggestion(provider, list(providers), noun="provider"),
            )
        if not isinstance(served, str):
            raise ConfigError(
                source=source,
                key=entry,
                message=f"expected a model name, got {show(served)}",
                fix=f'write {provider} = "served-name"',
            )
        if not providers[provider].serves(served):
            raise ConfigError(
                source=source,
                key=entry,
                message=f'provider "{provider}" does not serve "{served}"',
                fix=suggestion(
                    served, providers[provider].models, noun="model", plural=f'models of "{provider}"'
                ),
            )
    return dict(target)  # type: ignore[arg-type]


def servable_models(
    providers: Mapping[str, ProviderConfig], aliases: Mapping[str, object]
) -> list[str] | None:
    """Every model a client may name, or None when some provider accepts any model (or
    a catch-all ``"*"`` alias takes any name)."""
    if CATCH_ALL in aliases or any(not p.models for p in providers.values()):
        return None
    return list(dict.fromkeys([*(m for p in providers.values() for m in p.models), *aliases]))


def check_model_name(model: str, servable: list[str] | None, *, source: str, key: str) -> None:
    """Raise when no provider or alias takes ``model`` (never when a provider accepts any)."""
    if servable is not None and model not in servable:
        raise ConfigError(
            source=source,
            key=key,
            message=f'no provider or alias serves model "{model}"',
            fix=suggestion(model, servable, noun="servable model"),
        )


def build_models(
    table: dict[str, object], servable: list[str] | None, *, source: str
) -> dict[str, ModelConfig]:
    """``[models."public-name"]`` sections, each naming a servable model (and fallback_model)."""
    models = {}
    for public, section in table.items():
        key = key_path("models", public)
        body = require_table(section, source=source, key=key)
        check_keys(body, tuple(ModelConfig.model_fields), source=source, prefix=key)
        model = validate_model(ModelConfig, body, source=source, prefix=key)
        check_model_name(public, servable, source=source, key=key)
        if model.fallback_model is not None:
            check_model_name(
                model.fallback_model, servable, source=source, key=key_path(key, "fallback_model")
            )
        models[public] = model
    return models


def build_auth(
    table: dict[str, object], routing: RoutingConfig, servable: list[str] | None, *, source: str
) -> AuthConfig:
    """``[auth]``: every ``[[auth.keys]]`` has one of key/key_sha256, a known policy, servable models."""
    check_keys(table, tuple(AuthConfig.model_fields), source=source, prefix="auth")
    entries = table.get("keys", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            source=source,
            key="auth.keys",
            message="[auth] is given but has no [[auth.keys]] entries",
            fix='add [[auth.keys]] with name and key = "${env:VAR}"; remove [auth] to run without keys',
        )
    keys: list[AuthKey] = []
    for index, entry in enumerate(entries):
        key = key_path("auth.keys", index)
        body = require_table(entry, source=source, key=key)
        check_keys(body, tuple(AuthKey.model_fields), source=source, prefix=key)
        auth_key = validate_model(AuthKey, body, source=source, prefix=key)
        _check_auth_key(auth_key, keys, routing, servable, source=source, key=key)
        keys.append(auth_key)
    return AuthConfig(keys=tuple(keys))


def _check_auth_key(
    auth_key: AuthKey,
    earlier: list[AuthKey],
    routing: RoutingConfig,
    servable: list[str] | None,
    *,
    source: str,
    key: str,
) -> None:
    if (auth_key.key is None) == (auth_key.key_sha256 is None):
        raise ConfigError(
            source=source,
            key=key,
            message=f'key "{auth_key.name}" must give exactly one of key and key_sha256',
            fix='write key = "${env:VAR}" or key_sha256 = "<64 hex digits>", not both',
        )
    if auth_key.key is not None and not auth_key.key:
        raise ConfigError(
            source=source, key=key_path(key, "key"), message="empty key", fix="give a non-empty key"
        )
    sha = auth_key.key_sha256
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha)):
        raise ConfigError(
            source=source,
            key=key_path(key, "key_sha256"),
            message="expected 64 hex digits",
            fix='write the SHA-256 of the key, e.g. from: printf %s "$KEY" | sha256sum',
        )
    for other in earlier:
        if other.name == auth_key.name:
            raise ConfigError(
                source=source,
                key=key_path(key, "name"),
                message=f'duplicate key name "{auth_key.name}"',
                fix="give each key its own name",
            )
        if (other.key, other.key_sha256) == (auth_key.key, auth_key.key_sha256):
            raise ConfigError(
                source=source,
                key=key,
                message=f'same key as "{other.name}"',
                fix="give each client its own key",
            )
    if auth_key.policy is not None and auth_key.policy not in routing.policies:
        raise ConfigError(
            source=source,
            key=key_path(key, "policy"),
            message=f'unknown policy "{auth_key.policy}"',
            fix=f"define [routing.policies.{auth_key.policy}] or "
            + suggestion(auth_key.policy, list(routing.policies), noun="policy", plural="policies"),
        )
    for index, model in enumerate(auth_key.models):
        check_model_name(model, servable, source=source, key=key_path(key, "models", index))
