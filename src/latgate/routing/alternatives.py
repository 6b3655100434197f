"""A primary provider's alternatives: its fallbacks (``routing.fallbacks``, the model's
``fallback_model``) and its overflow candidates (for a request with a TTFT budget under
a strategy that predicts), as :class:`~latgate.routing.decision.Router` adds them to a
decision. Memoised for configured model names: they depend on the config only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from latgate.foundation.config.schema import Config
from latgate.routing.models import skipped_note
from latgate.routing.targets import Target


class Alternatives:
    """The fallbacks and overflow candidates of one config.

    Args:
        config: the resolved config.
        serving: ``{provider: upstream model}`` serving a public name (file order).
        rule_upstream: the model a configured rule sends a provider for a public name,
            or None when the rule is skipped for it.
        known: the configured public names (their answers are memoised).
        overflows: the strategy predicts (only then are there overflow candidates).
    """

    def __init__(
        self,
        config: Config,
        *,
        serving: Callable[[str], dict[str, str]],
        rule_upstream: Callable[[str, str], str | None],
        known: Collection[str],
        overflows: bool,
    ) -> None:
        self._config = config
        self._providers = config.providers
        self._serving = serving
        self._rule_upstream = rule_upstream
        self._known = known
        self._overflows = overflows
        self._overflow_known: dict[tuple[str, str], tuple[Target, ...]] = {}
        self._fallbacks_known: dict[tuple[str, str, str], tuple[tuple[Target, ...], tuple[str, ...]]] = {}

    def fallbacks(self, primary: Target, public: str, notes: list[str]) -> tuple[Target, ...]:
        """The primary's fallbacks, with notes for those skipped (memoised for configured
        model names: they depend on the config only)."""
        key = (primary.provider, primary.model, public)
        known = self._fallbacks_known.get(key)
        if known is None:
            found: list[str] = []
            known = (tuple(self._compute_fallbacks(primary, public, found)), tuple(found))
            if public in self._known:
                self._fallbacks_known[key] = known
        notes.extend(known[1])
        return known[0]

    def _compute_fallbacks(self, primary: Target, public: str, notes: list[str]) -> list[Target]:
        reason = f"fallback:{primary.provider}"
        model_config = self._config.models.get(public)
        fallback_model = model_config.fallback_model if model_config is not None else None
        seen = {(primary.provider, primary.model)}
        targets: list[Target] = []
        for name in self._config.routing.fallbacks.get(primary.provider, ()):
            upstream = self._rule_upstream(name, public)
            instead = None
            if upstream is None and fallback_model:
                upstream = self._rule_upstream(name, fallback_model)
                instead = fallback_model
            if upstream is None:
                notes.append(f"fallback {name} skipped: {skipped_note(self._providers[name], public)}")
            elif (name, upstream) not in seen:
                seen.add((name, upstream))
                targets.append(Target(name, upstream, reason, instead))
        upstream = (
            self._rule_upstream(primary.provider, fallback_model) if fallback_model and not targets else None
        )
        if upstream is not None and (primary.provider, upstream) not in seen:
            targets.append(Target(primary.provider, upstream, reason, fallback_model))
        return targets

    def overflow(self, primary: Target, public: str) -> tuple[Target, ...]:
        """The primary's fallbacks then the other providers serving ``public`` (memoised
        for configured model names)."""
        if not self._overflows or primary.reason in ("override", "long_context"):
            return ()
        key = (primary.provider, public)
        known = self._overflow_known.get(key)
        if known is not None:
            return known
        order = [*self._config.routing.fallbacks.get(primary.provider, ()), *self._serving(public)]
        reason = f"overflow:{primary.provider}"
        upstreams = {
            name: self._rule_upstream(name, public)
            for name in dict.fromkeys(order)
            if name != primary.provider
        }
        targets = tuple(
            Target(name, upstream, reason) for name, upstream in upstreams.items() if upstream is not None
        )
        if public in self._known:
            self._overflow_known[key] = targets
        return targets
