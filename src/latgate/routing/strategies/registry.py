"""The names ``routing.strategy`` accepts, and what each name is (import-light: the
config, the pool and the router read it without building a strategy).

- ``predicted_latency`` (alias ``latgate``, the default): live numbers decide: each
  endpoint's predicted time to first token (queue wait, prefill of the prompt's uncached
  part, the fixed part), overflow for a budget, hedging, latency ejection, admission.
- ``round_robin``: the rules' provider order; endpoints in turn by weight.
- ``least_outstanding`` (alias ``rules``): the rules' provider order; the endpoint with
  the fewest in flight per unit of weight.
"""

from __future__ import annotations

PREDICTED_LATENCY = "predicted_latency"
ROUND_ROBIN = "round_robin"
LEAST_OUTSTANDING = "least_outstanding"
ALIASES = {"latgate": PREDICTED_LATENCY, "rules": LEAST_OUTSTANDING}
"""Accepted names that mean another: ``latgate`` is the default strategy's old name."""
_PREDICTS = {PREDICTED_LATENCY: True, ROUND_ROBIN: False, LEAST_OUTSTANDING: False}


def canonical(name: str) -> str:
    """The strategy ``name`` means (aliases resolved).

    Raises:
        KeyError: ``name`` is no strategy (the config loader refuses such a name first).
    """
    name = ALIASES.get(name, name)
    if name not in _PREDICTS:
        raise KeyError(name)
    return name


def predicts(name: str) -> bool:
    """True when strategy ``name`` routes on live predictions (and so overflows for a
    budget, hedges, ejects slow endpoints and holds requests for admission)."""
    return _PREDICTS[canonical(name)]
