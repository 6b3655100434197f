"""Which configured rules and fallbacks can apply, per model name that can reach them.

A rule (long context, latency-sensitive, a policy's ``route_to`` or
``long_context_provider``) or a fallback names a provider; at run time the
:class:`~latgate.routing.decision.Router` skips it for a model that provider does not
serve (:func:`~latgate.routing.models.rule_model`), with only a note. ``latgate check``
and ``latgate serve`` ask the same :class:`Router` here, for every model name of the
config (:meth:`~latgate.foundation.config.schema.Config.public_models`), so what they print is
what routing does:

- :func:`rule_reach`: for each rule and each fallback link, the models it applies to
  (and the model it sends) and the models it never applies to (and why);
- :func:`reach_warnings`: a rule that changes where no model goes (it applies only to
  names its provider alone serves, or to none), a fallback link no model can take, a
  model left without any fallback of its provider's chain, and a default route that
  lists no models taking names another provider lists. Each says what would make it
  apply: an ``[aliases]`` table where the names differ.
- :func:`fallback_suggestion`: a ``[routing] fallbacks`` entry for the default route
  that would apply, with the alias table it needs when no provider serves its models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from latgate.foundation.config.schema import Config
from latgate.routing.decision import Router
from latgate.routing.models import same_model, skipped_note

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Reach:
    """One rule or fallback link and the models that can reach it.

    Attributes:
        rule: how ``latgate check`` names it (``long context``, ``latency-sensitive``,
            ``policy "batch" route_to``, ``fallback vllm -> openai``).
        key: the config key that names the provider (``routing.long_context_provider``,
            ``routing.fallbacks.vllm``).
        provider: the provider it sends requests to.
        applies: ``(public model, model sent)`` for each model it applies to.
        never: ``(public model, why)`` for each model it is skipped for.
        only_there: the models of ``applies`` that no other provider serves (the rule
            changes nothing for them: they go to ``provider`` anyway).
        any_name: ``provider`` lists no models: names the config does not list apply too.
    """

    rule: str
    key: str
    provider: str
    applies: tuple[tuple[str, str], ...]
    never: tuple[tuple[str, str], ...]
    only_there: tuple[str, ...]
    any_name: bool

    def summary(self) -> str:
        """``applies to a, b (sent as B); never to c (why)``, each model that reaches it named."""
        parts = []
        if self.applies:
            other = ", and any other name" if self.any_name else ""
            parts.append(
                "applies to " + ", ".join(_shown(public, sent) for public, sent in self.applies) + other
            )
        if self.never:
            parts.append("never to " + "; ".join(f"{public} ({why})" for public, why in self.never))
        return "; ".join(parts) or "no model reaches it"


def rule_reach(config: Config, router: Router | None = None) -> list[Reach]:
    """Every configured rule, then every fallback link, with the models it applies to.

    A rule is reached by every model name the config serves; a fallback link
    ``ORIGIN -> NEXT`` by the names ``ORIGIN`` serves when a rule sends it the request.
    ``router``: the config's router (built without exact tokenizers when not given).
    """
    router = router or Router(config, exact_tokenizers={})
    routing = config.routing
    models = [public for public in config.public_models() if router.serves(public)]
    rules: list[tuple[str, str, str]] = []
    if routing.long_context_threshold and routing.long_context_provider:
        rules.append(("long context", "routing.long_context_provider", routing.long_context_provider))
    latency = router.latency_target
    if latency is not None:
        key = (
            "routing.route_latency_sensitive_to"
            if routing.route_latency_sensitive_to
            else f"providers.{latency}.latency_sensitive"
        )
        rules.append(("latency-sensitive", key, latency))
    for name, policy in routing.policies.items():
        if policy.route_to:
            rules.append((f'policy "{name}" route_to', f"routing.policies.{name}.route_to", policy.route_to))
        if policy.long_context_provider and routing.long_context_threshold:
            key = f"routing.policies.{name}.long_context_provider"
            rules.append((f'policy "{name}" long context', key, policy.long_context_provider))
    reaches = [_rule(config, router, rule, key, provider, models) for rule, key, provider in rules]
    for origin, nexts in routing.fallbacks.items():
        reaching = [public for public in models if router.rule_upstream(origin, public) is not None]
        found = {public: router.fallback_targets(origin, public) for public in reaching}
        for name in dict.fromkeys(nexts):
            applies, never = [], []
            for public, (targets, notes) in found.items():
                sent = next((t.model for t in targets if t.provider == name), None)
                if sent is not None:
                    applies.append((public, sent))
                else:
                    why = next(
                        (n.split(": ", 1)[1] for n in notes if n.startswith(f"fallback {name} skipped: ")),
                        None,
                    )
                    never.append((public, why or f"provider {name} is sent the same model as {origin}"))
            reaches.append(
                Reach(
                    f"fallback {origin} -> {name}",
                    f"routing.fallbacks.{origin}",
                    name,
                    tuple(applies),
                    tuple(never),
                    (),
                    not config.providers[name].models,
                )
            )
    return reaches


def _rule(config: Config, router: Router, rule: str, key: str, provider: str, models: list[str]) -> Reach:
    applies, never, only = [], [], []
    for public in models:
        sent = router.rule_upstream(provider, public)
        if sent is None:
            never.append((public, skipped_note(config.providers[provider], public)))
            continue
        applies.append((public, sent))
        if set(router.serving(public)) <= {provider}:
            only.append(public)
    return Reach(
        rule, key, provider, tuple(applies), tuple(never), tuple(only), not config.providers[provider].models
    )


def reach_warnings(config: Config, router: Router | None = None) -> list[str]:
    """The warnings of :func:`rule_reach`, and the default route's shadowing (module doc)."""
    router = router or Router(config, exact_tokenizers={})
    warnings = []
    reaches = rule_reach(config, router)
    for reach in reaches:
        if reach.rule.startswith("fallback "):
            if reach.never and not reach.applies and not reach.any_name:
                origin = reach.key.rsplit(".", 1)[-1]
                warnings.append(
                    f"{reach.key}: {reach.provider} can never take over from {origin}: "
                    + "; ".join(f"{public} ({why})" for public, why in reach.never)
                    + f"; with {origin} down these requests fail{_alias_hints(config, router, reach)}"
                )
            continue
        if reach.any_name or (reach.applies and len(reach.only_there) < len(reach.applies)):
            continue
        if not reach.never:
            continue
        alone = (
            f" (it applies only to {', '.join(reach.only_there)}, which {reach.provider} alone serves)"
            if reach.only_there
            else ""
        )
        warnings.append(
            f'{reach.key} = "{reach.provider}": the {reach.rule} rule never changes where a request goes{alone}: '
            + "; ".join(f"never for {public}: {why}" for public, why in reach.never)
            + f"; those requests follow the next rule{_alias_hints(config, router, reach)}"
        )
    warnings += _unprotected(config, router, reaches)
    warnings += _shadowed(config, router)
    return warnings


def _unprotected(config: Config, router: Router, reaches: list[Reach]) -> list[str]:
    """A model whose provider has fallbacks none of which applies to it (a link that
    applies to no model at all is reported by itself)."""
    warnings = []
    for origin in config.routing.fallbacks:
        links = [r for r in reaches if r.key == f"routing.fallbacks.{origin}" and (r.applies or r.any_name)]
        if not links:
            continue
        for public in [
            p
            for p in config.public_models()
            if router.serves(p) and router.rule_upstream(origin, p) is not None
        ]:
            if all(public in dict(link.never) for link in links):
                warnings.append(
                    f"routing.fallbacks.{origin}: requests for {public} have no fallback when {origin} fails: "
                    + "; ".join(dict(link.never)[public] for link in links)
                )
    return warnings


def _shadowed(config: Config, router: Router) -> list[str]:
    """The default route lists no models (it serves every name), so it takes requests
    for names another provider lists: the model rule applies only to names the
    default route does not serve."""
    default = config.routing.default_route
    if config.providers[default].models:
        return []
    listed = {
        public: [name for name, p in config.providers.items() if name != default and public in p.models]
        for public in config.public_models()
    }
    listed |= {
        public: [name for name in targets if name != default]
        for public, targets in config.aliases.items()
        if public in listed and default not in targets
    }
    taken = {public: names for public, names in listed.items() if names and default in router.serving(public)}
    if not taken:
        return []
    names = "; ".join(f"{public} (listed by {', '.join(owners)})" for public, owners in taken.items())
    warning = (
        f'routing.default_route = "{default}" lists no models, so it serves every name: requests for {names} '
        f"go to {default}, not to the provider listing them (the model rule applies only to names the default "
        f"route does not serve); list in providers.{default}.models the names {default} serves"
    )
    return [warning]


def _alias_hints(config: Config, router: Router, reach: Reach) -> str:
    """``; to make it apply, map the names under [aliases]: "m" = { p = "m", p_long = "m-long" }``
    for the skipped models, when the provider lists a model to map them to."""
    entries = alias_entries(config, router, reach.provider, [public for public, _ in reach.never])
    return f"; to make it apply, map the names under [aliases]: {entries}" if entries else ""


def alias_entries(config: Config, router: Router, provider: str, publics: list[str]) -> str:
    """The ``[aliases]`` tables that make ``provider`` serve each of ``publics`` (its
    first listed model; the others named), ``""`` when it lists none."""
    served = config.providers[provider].models
    if not served or not publics:
        return ""
    entries = "; ".join(_alias_entry(config, router, public, provider, served[0]) for public in publics)
    return entries + (f" (or another model it lists: {', '.join(served[1:])})" if served[1:] else "")


def _alias_entry(config: Config, router: Router, public: str, provider: str, served: str) -> str:
    """The ``[aliases]`` table for ``public`` with ``provider = served`` added to where it goes now."""
    table = (
        {**router.serving(public), provider: served}
        if public not in config.aliases
        else {**config.aliases[public], provider: served}
    )
    return (
        f'"{public}" = {{ ' + ", ".join(f'{_key(name)} = "{model}"' for name, model in table.items()) + " }"
    )


def fallback_suggestion(config: Config, router: Router | None = None) -> str | None:
    """A ``fallbacks = { ... }`` line for the default route that would apply to every
    model it serves: another provider serving them (a hosted ``role = "upstream"`` one
    first), else the first other provider that lists each of them under its own spelling,
    with the ``[aliases]`` tables that says so. None when no other provider serves them
    all (an alias to a different model is never suggested)."""
    router = router or Router(config, exact_tokenizers={})
    default = config.routing.default_route
    others = sorted(
        (name for name in config.providers if name != default),
        key=lambda n: config.providers[n].role != "upstream",
    )
    if not others:
        return None
    models = [
        public
        for public in config.public_models()
        if router.serves(public) and router.rule_upstream(default, public)
    ]
    line = 'fallbacks = {{ "{default}" = ["{next}"] }}'
    for name in others:
        if all(router.rule_upstream(name, public) is not None for public in models):
            return line.format(default=default, next=name)
    for name in others:
        missing = [public for public in models if router.rule_upstream(name, public) is None]
        spelled = {public: _same_model_served(config, name, public) for public in missing}
        if all(spelled.values()):
            entries = "; ".join(_alias_entry(config, router, p, name, str(served)) for p, served in spelled.items())
            return line.format(default=default, next=name) + f", with under [aliases]: {entries}"
    return None


def _same_model_served(config: Config, provider: str, public: str) -> str | None:
    """The model ``provider`` lists that is ``public`` under another spelling, if any: an
    alias to any other (a 72B model's to an 8B one) would change the answers."""
    return next((served for served in config.providers[provider].models if same_model(public, served)), None)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else f'"{name}"'


def _shown(public: str, sent: str) -> str:
    return public if sent == public else f"{public} (sent as {sent})"
