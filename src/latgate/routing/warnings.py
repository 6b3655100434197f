"""The start-up warnings that need the router: a rule or fallback that can never apply,
a latency threshold whose requests no rule sends anywhere. ``serve`` and ``check`` print
the same list (:func:`startup_warnings`), so they cannot disagree with routing."""

from __future__ import annotations

from collections.abc import Mapping

from latgate.foundation.config.masking import mask_secrets
from latgate.foundation.config.schema import Config
from latgate.foundation.config.warnings import config_warnings
from latgate.routing.decision import Router
from latgate.routing.reach import reach_warnings
from latgate.routing.strategies.registry import predicts


def startup_warnings(config: Config, env: Mapping[str, str] | None = None, *, can_listen: bool = True) -> list[str]:
    """Every warning about a valid ``config``: :func:`~latgate.foundation.config.warnings.config_warnings`
    (``env``, ``can_listen`` as there), then :func:`routing_warnings`."""
    return config_warnings(config, env, can_listen=can_listen) + routing_warnings(config)


def routing_warnings(config: Config) -> list[str]:
    """One line per routing setting that loads but does nothing, secrets masked:

    - ``routing.latency_threshold_ms`` without ``routing.route_latency_sensitive_to``
      while another provider than ``default_route`` exists: the requests it marks
      latency-sensitive stay on ``default_route`` (the threshold is then only their
      time-to-first-token budget): a ``role = "decode"`` provider serving their models is
      suggested, else adding one;
    - a rule or fallback that can never apply, a model left without a fallback, a
      default route listing no models that takes names another provider lists
      (:func:`latgate.routing.reach.reach_warnings`);
    - a ``[routing.queue]`` section written for a strategy that has no gateway queue.
    """
    found = _latency_threshold_unrouted(config) + reach_warnings(config) + _queue_unused(config)
    return [mask_secrets(warning) for warning in found]


def _queue_unused(config: Config) -> list[str]:
    """``[routing.queue]`` keys set (enabled, preempt, bounds) while ``[routing] strategy``
    is one without the queue: they do nothing."""
    routing = config.routing
    if not routing.queue.model_fields_set or predicts(routing.strategy) or not routing.queue.enabled:
        return []
    written = ", ".join(sorted(routing.queue.model_fields_set))
    why = '"predicted_latency" holds requests in a gateway queue; remove the section or change the strategy'
    return [f"[routing.queue] ({written}) does nothing with strategy = {routing.strategy!r}: only {why}"]


def _latency_threshold_unrouted(config: Config) -> list[str]:
    """The threshold marks requests latency-sensitive but no rule sends them anywhere:
    name a ``role = "decode"`` provider serving their models, else say to add one."""
    routing = config.routing
    others = [name for name in config.providers if name != routing.default_route]
    if routing.latency_threshold_ms is None or routing.route_latency_sensitive_to is not None or not others:
        return []
    router = Router(config, exact_tokenizers={})
    if router.latency_target is not None:
        return []  # latency-sensitive requests go to the first provider flagged so
    models = [public for public in config.public_models() if router.serves(public)]
    decode = [
        name
        for name in others
        if config.providers[name].role == "decode"
        and (not config.providers[name].models or any(router.rule_upstream(name, m) for m in models))
    ]
    marked = (
        f"routing.latency_threshold_ms = {routing.latency_threshold_ms} is set without "
        f"routing.route_latency_sensitive_to: requests it marks latency-sensitive (X-Latency-Budget-Ms <= "
        f'{routing.latency_threshold_ms}) stay on default_route "{routing.default_route}"; '
    )
    if decode:
        alternatives = f" (or {', '.join(decode[1:])})" if decode[1:] else ""
        return [
            marked + f'add route_latency_sensitive_to = "{decode[0]}"{alternatives} under [routing] to send them '
            'to the low-latency decode pool (role = "decode")'
        ]
    return [
        marked + 'no provider is a low-latency decode pool (role = "decode") serving their models: add one '
        '(TileRT: connector = "tile_rt_connector") and name it in route_latency_sensitive_to under [routing]'
    ]
