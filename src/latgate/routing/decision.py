"""The routing rules: request body and headers -> provider, upstream model, fallbacks.

A :class:`Router` is built once per config and is pure: :meth:`Router.decide` does no
I/O and keeps no state between requests, so it can be unit-tested with plain
:class:`~latgate.foundation.config.schema.Config` objects. Endpoints' live numbers (health, in-flight,
TTFT estimates) are the :class:`~latgate.routing.selection.Selector`'s business: it turns
``RouteDecision.candidates`` into the plan the forwarder walks.

Rules, first match wins (``reason`` as in the ``X-Latgate-Route-Reason`` header):

1. ``override``: ``X-Route-To: PROVIDER``, only with ``routing.allow_route_override``.
2. ``long_context``: prompt tokens > ``routing.long_context_threshold`` -> the policy's
   or the routing section's ``long_context_provider``.
3. ``latency_sensitive``: ``X-Latency-Sensitive: 1``, ``X-Latency-Budget-Ms`` <=
   ``latency_threshold_ms``, a policy or ``[models."NAME"]`` saying so ->
   ``route_latency_sensitive_to`` (else the first provider flagged ``latency_sensitive``).
4. ``policy:NAME``: the selected policy's ``route_to``.
5. ``model``: the default route cannot serve the model -> the first provider (file
   order) that lists it or has an alias for it, else the first that can serve it.
6. ``default``: ``routing.default_route``.

A rule whose provider cannot serve the requested model is skipped, and ``notes`` says
why. With ``routing.strategy = "predicted_latency"`` (the default), a request with a time-to-first-token budget
also gets ``overflow`` candidates (reason ``overflow:FROM``): the primary's fallbacks,
then every other provider serving the model, in file order; the selector moves the
request to one of them when live numbers predict the primary will miss the budget
(never for ``override`` or ``long_context`` decisions).

Model names (:mod:`latgate.routing.models`): a provider serves a name through its
``[aliases]`` entry, or because it lists that exact name (or lists none). A name no
provider serves is a 404 ``model_not_found``, unless ``[aliases]`` has a catch-all
``"*"`` entry, which then serves it. The model and default rules go only to providers
serving the name exactly, so a listed name always reaches the providers listing it.
A configured rule (override, long context, latency-sensitive, policy, fallback) may
also send a provider listing one model that model, when both name the same model
(``llama-3-8b-instruct`` -> ``meta-llama/Meta-Llama-3-8B-Instruct``); a served name of
another model (``qwen2.5-7b`` vs ``qwen2.5-7b-instruct``) skips the rule, with a note.

What a decision costs is measured in docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.providers import tokenizer_path
from latgate.foundation.config.schema import Config, PolicyConfig
from latgate.foundation.errors import InvalidRequest, NotFound
from latgate.routing.alternatives import Alternatives
from latgate.routing.headers import budget_header, debug_header, flag_header
from latgate.routing.models import near_model, rule_model, skipped_note, upstream_model
from latgate.routing.prefix_index import estimate_and_sample
from latgate.routing.sessions import session_key
from latgate.routing.strategies.registry import predicts
from latgate.routing.targets import RouteDecision, Target
from latgate.routing.tokens import ExactTokenizer, TokenizerError, estimate_prompt_tokens

__all__ = ["RouteDecision", "Router", "Target"]

_EXACT_COUNT_BAND = 4
"""The exact tokenizer runs only when the estimate is within this factor of the
threshold: the estimate is never off by that much on real text, and exact counting of
a long prompt costs milliseconds."""


class Router:
    """The routing rules of one config, precomputed.

    Args:
        config: the resolved config.
        exact_tokenizers: exact counters by provider name; by default one
            :class:`~latgate.routing.tokens.ExactTokenizer` is loaded for each provider
            whose config sets ``tokenizer``.

    Raises:
        ConfigError: a configured ``tokenizer`` cannot be loaded (key
            ``providers.NAME.tokenizer``).

    Example::

        router = Router(load_config("config.toml"))
        decision = router.decide(body, request.headers)
        decision.provider, decision.model, decision.reason   # ('vllm', 'llama-3', 'default')
    """

    def __init__(
        self, config: Config, *, exact_tokenizers: Mapping[str, ExactTokenizer] | None = None
    ) -> None:
        routing = config.routing
        self._config = config
        self._routing = routing
        self._providers = config.providers
        self._public_models = tuple(config.public_models())
        self._catch_all = config.aliases.get("*", {})
        self._exact = dict(exact_tokenizers) if exact_tokenizers is not None else _load_tokenizers(config)
        self._latency_target = routing.route_latency_sensitive_to or next(
            (name for name, provider in config.providers.items() if provider.latency_sensitive), None
        )
        known = set(self._public_models) | {
            model.fallback_model for model in config.models.values() if model.fallback_model
        }
        self._serving_known = {public: self._compute_serving(public) for public in known}
        self._predicts = predicts(routing.strategy)
        self._alternatives = Alternatives(
            config,
            serving=self._serving,
            rule_upstream=self._rule_upstream,
            known=frozenset(self._serving_known),
            overflows=self._predicts,
        )
        # providers where a session's place counts: a prefix cache and a choice of endpoints
        self._affine = frozenset(
            name
            for name, provider in config.providers.items()
            if self._predicts and provider.caches_prefixes and len(provider.endpoints) > 1
        )

    def decide(
        self, body: Mapping[str, Any], headers: Mapping[str, str], *, key_policy: str | None = None
    ) -> RouteDecision:
        """Choose the provider, upstream model and fallbacks for one request.

        Args:
            body: the parsed JSON request body (chat, completions, embeddings...).
            headers: request headers, looked up by lowercase name (Starlette
                ``Headers`` or a dict with lowercase keys).
            key_policy: the route policy of the caller's gateway key, used when the
                request sends no ``X-Route-Policy``.

        Raises:
            InvalidRequest: no model and no ``routing.default_model`` (param
                ``model``); a malformed ``X-Latency-Sensitive`` or
                ``X-Latency-Budget-Ms``; ``X-Route-To`` naming an unknown provider
                while overrides are allowed (param is the header name).
            NotFound: no provider serves the model (code ``model_not_found``; the
                message lists the available models).
        """
        public = self._public_model(body)
        serving = self._serving(public)
        if not serving:
            raise NotFound(self._not_found(public), code="model_not_found", param="model")
        notes: list[str] = []
        policy_name, policy = self._policy(headers.get("x-route-policy"), key_policy, notes)
        latency_sensitive, budget_ms = self._latency(headers, policy, public)
        # where the prefix index runs, the estimate's walk samples the prompt for it
        prompt_tokens = estimate_and_sample(body) if self._affine else estimate_prompt_tokens(body)
        (provider, reason, upstream), prompt_tokens = self._first_rule(
            body, headers, public, serving, (policy_name, policy), latency_sensitive, prompt_tokens, notes
        )
        primary = Target(provider, upstream, reason)
        candidates = (primary, *self._alternatives.fallbacks(primary, public, notes))
        overflow = self._alternatives.overflow(primary, public) if budget_ms is not None else ()
        session = None
        if self._affine and any(t.provider in self._affine for t in (*candidates, *overflow)):
            session = session_key(body, headers)
        return RouteDecision(
            provider=provider,
            model=primary.model,
            public_model=public,
            reason=reason,
            prompt_tokens=prompt_tokens,
            latency_sensitive=latency_sensitive,
            budget_ms=budget_ms,
            policy=policy_name if policy is not None else None,
            hedge=policy.hedge if policy is not None else False,
            candidates=candidates,
            notes=tuple(notes),
            overflow=overflow,
            strategy=self._routing.strategy,
            explain=debug_header(headers.get("x-latgate-debug")),
            session_key=session,
        )

    def _latency(self, headers: Mapping[str, str], policy: PolicyConfig | None, public: str) -> tuple[bool, int | None]:
        """``(latency-sensitive, TTFT budget ms)``: the headers', else the policy's, else
        ``latency_threshold_ms`` for a latency-sensitive request (raises as :meth:`decide`)."""
        budget_ms = budget_header(headers.get("x-latency-budget-ms"))
        threshold = self._routing.latency_threshold_ms
        sensitive = flag_header(headers.get("x-latency-sensitive")) or (
            budget_ms is not None and threshold is not None and budget_ms <= threshold
        )
        if not sensitive and policy is not None:
            policy_budget_ms = policy.latency_budget_ms
            sensitive = policy.latency_sensitive is True or (
                policy_budget_ms is not None and threshold is not None and policy_budget_ms <= threshold
            )
        if not sensitive:
            model = self._config.models.get(public)
            sensitive = model is not None and model.latency_sensitive is True
        if budget_ms is None and policy is not None:
            budget_ms = policy.latency_budget_ms
        if budget_ms is None and sensitive:
            budget_ms = threshold
        return sensitive, budget_ms

    def _first_rule(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        public: str,
        serving: dict[str, str],
        named_policy: tuple[str | None, PolicyConfig | None],
        latency_sensitive: bool,
        prompt_tokens: int,
        notes: list[str],
    ) -> tuple[tuple[str, str, str], int]:
        """``((provider, reason, upstream model), prompt tokens)`` of the first rule that
        matches (the module docstring's order); prompt tokens exact if the long-context rule counted."""
        policy_name, policy = named_policy
        choice: tuple[str, str, str] | None = self._override(headers.get("x-route-to"), public, notes)
        if choice is None:
            choice, prompt_tokens = self._long_context(body, prompt_tokens, policy, public, notes)
        if choice is None and latency_sensitive:
            choice = self._latency_sensitive(public, notes)
        if choice is None and policy is not None and policy.route_to:
            choice = self._take(policy.route_to, f"policy:{policy_name}", public, notes)
        if choice is None:
            choice = self._model_or_default(serving, public)
        return choice, prompt_tokens

    # -- the request's model ------------------------------------------------------

    def _public_model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        if model is None or model == "":
            if self._routing.default_model:
                return self._routing.default_model
            raise InvalidRequest("model is required", param="model")
        if not isinstance(model, str):
            raise InvalidRequest("model must be a string", param="model")
        return model

    def _serving(self, public: str) -> dict[str, str]:
        """``{provider: upstream model}`` for every provider that can serve ``public``, file order."""
        known = self._serving_known.get(public)
        return known if known is not None else self._compute_serving(public)

    def _compute_serving(self, public: str) -> dict[str, str]:
        aliases = self._config.aliases.get(public, {})
        serving: dict[str, str] = {}
        for name, provider in self._providers.items():
            upstream = aliases.get(name) or upstream_model(provider, public)
            if upstream is not None:
                serving[name] = upstream
        return serving or dict(self._catch_all)

    def _rule_upstream(self, provider: str, public: str) -> str | None:
        """The model a configured rule sends ``provider`` for ``public``, or None."""
        served = self._serving(public).get(provider)
        return served if served is not None else rule_model(self._providers[provider], public)

    def _take(self, provider: str, reason: str, public: str, notes: list[str]) -> tuple[str, str, str] | None:
        upstream = self._rule_upstream(provider, public)
        if upstream is not None:
            return provider, reason, upstream
        notes.append(f"{reason} rule skipped: {skipped_note(self._providers[provider], public)}")
        return None

    @property
    def latency_target(self) -> str | None:
        """The provider latency-sensitive requests go to: ``route_latency_sensitive_to``,
        else the first provider flagged ``latency_sensitive``, else None."""
        return self._latency_target

    def rule_upstream(self, provider: str, public: str) -> str | None:
        """The model a configured rule (long context, latency-sensitive, a policy's
        ``route_to``, an override) sends ``provider`` for the public name ``public``,
        or None when the rule is skipped for it (``latgate check`` asks this)."""
        return self._rule_upstream(provider, public)

    def fallback_targets(self, provider: str, public: str) -> tuple[tuple[Target, ...], tuple[str, ...]]:
        """``(targets, notes)``: the fallbacks a request for ``public`` gets when
        ``provider`` is its primary, and why configured ones were skipped (the same
        computation :meth:`decide` makes). ``provider`` must serve ``public``
        (:meth:`rule_upstream` is not None)."""
        upstream = self._rule_upstream(provider, public)
        if upstream is None:
            raise ValueError(f"provider {provider!r} does not serve {public!r}")
        notes: list[str] = []
        targets = self._alternatives.fallbacks(Target(provider, upstream, "default"), public, notes)
        return targets, tuple(notes)

    def serving(self, public: str) -> dict[str, str]:
        """``{provider: upstream model}`` for every provider serving ``public`` by name
        (an alias, a listed name, no model list, or the catch-all), file order."""
        return dict(self._serving(public))

    def serves(self, public: str) -> bool:
        """Whether a request for the public model name ``public`` would be routed (a
        listed name, an alias, a provider without a model list, or the catch-all)."""
        return bool(self._serving(public))

    def serving_providers(self, public: str) -> tuple[str, ...]:
        """The providers a request for ``public`` could go to (file order); for
        answers scoped to what one gateway key may use (sec, issue 23)."""
        return tuple(self._serving(public))

    def not_found_message(self, public: str) -> str:
        """The 404 ``model_not_found`` message for ``public``: the available names."""
        return self._not_found(public)

    def _not_found(self, public: str) -> str:
        """The 404 message: the available names, and a same-model one when there is one."""
        near = near_model(public, list(self._public_models))
        hint = f" (did you mean {near!r}?)" if near else ""
        return (
            f"model {public!r} is not served here{hint}; available models: {', '.join(self._public_models)}"
        )

    # -- the rules ----------------------------------------------------------------

    def _policy(
        self, header: str | None, key_policy: str | None, notes: list[str]
    ) -> tuple[str | None, PolicyConfig | None]:
        policies = self._routing.policies
        name = header.strip() if header else None
        if name:
            if name in policies:
                return name, policies[name]
            notes.append(f"X-Route-Policy {name!r} ignored: no such policy in [routing.policies]")
        if key_policy:
            if key_policy in policies:
                return key_policy, policies[key_policy]
            notes.append(f"key policy {key_policy!r} ignored: no such policy in [routing.policies]")
        return None, None

    def _override(self, header: str | None, public: str, notes: list[str]) -> tuple[str, str, str] | None:
        name = header.strip() if header else None
        if not name:
            return None
        if not self._routing.allow_route_override:
            notes.append("X-Route-To ignored: routing.allow_route_override is false")
            return None
        if name not in self._providers:
            raise InvalidRequest(
                f"X-Route-To names unknown provider {name!r}; known providers: {', '.join(self._providers)}",
                param="X-Route-To", code="invalid_header_value",
            )
        return self._take(name, "override", public, notes)

    def _long_context(
        self,
        body: Mapping[str, Any],
        prompt_tokens: int,
        policy: PolicyConfig | None,
        public: str,
        notes: list[str],
    ) -> tuple[tuple[str, str, str] | None, int]:
        threshold = self._routing.long_context_threshold
        provider = (policy.long_context_provider if policy is not None else None) or (
            self._routing.long_context_provider
        )
        if threshold is None or provider is None:
            return None, prompt_tokens
        exact = self._exact.get(provider)
        if (
            exact is not None
            and threshold / _EXACT_COUNT_BAND <= prompt_tokens <= threshold * _EXACT_COUNT_BAND
        ):
            prompt_tokens = exact.count_prompt(body)
        if prompt_tokens <= threshold:
            return None, prompt_tokens
        return self._take(provider, "long_context", public, notes), prompt_tokens

    def _latency_sensitive(self, public: str, notes: list[str]) -> tuple[str, str, str] | None:
        if self._latency_target is None:
            notes.append("latency-sensitive, but no routing.route_latency_sensitive_to is configured")
            return None
        return self._take(self._latency_target, "latency_sensitive", public, notes)

    def _model_or_default(self, serving: dict[str, str], public: str) -> tuple[str, str, str]:
        default = self._routing.default_route
        if default in serving:
            return default, "default", serving[default]
        aliases = self._config.aliases.get(public, {})
        for name, provider in self._providers.items():
            if name in serving and (public in provider.models or name in aliases):
                return name, "model", serving[name]
        name = next(iter(serving))
        return name, "model", serving[name]


def _load_tokenizers(config: Config) -> dict[str, ExactTokenizer]:
    tokenizers: dict[str, ExactTokenizer] = {}
    for name, provider in config.providers.items():
        if provider.tokenizer:
            try:
                tokenizers[name] = ExactTokenizer(tokenizer_path(config.source, provider.tokenizer))
            except TokenizerError as exc:
                raise ConfigError(
                    source=config.source,
                    key=f"providers.{name}.tokenizer",
                    message=str(exc),
                    fix="point it at a Hugging Face tokenizer.json, or remove it to use the estimate",
                ) from None
    return tokenizers
