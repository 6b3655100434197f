"""The static rules' endpoint choices: round robin and least outstanding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latgate.routing.policies.least_outstanding import choose_least_outstanding
from latgate.routing.policies.round_robin import choose_round_robin
from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.registry import LEAST_OUTSTANDING, ROUND_ROBIN

if TYPE_CHECKING:
    from latgate.routing.strategies.base import Choice


class RoundRobin(Strategy):
    """Endpoints in turn by weight (smooth weighted round robin); keeps each
    provider's running credits."""

    name = ROUND_ROBIN

    def __init__(self) -> None:
        self._credit: dict[str, list[float]] = {}

    def choose(self, choice: Choice) -> int:
        runtime, commit = choice.runtime, choice.commit
        if commit:
            runtime.turn += 1
        index, credit = choose_round_robin(choice.views, credit=self._credit.get(runtime.name, ()))
        if commit:
            self._credit[runtime.name] = credit
        return index


class LeastOutstanding(Strategy):
    """The endpoint with the fewest in flight per unit of weight; equal ones in turn."""

    name = LEAST_OUTSTANDING

    def choose(self, choice: Choice) -> int:
        runtime, commit = choice.runtime, choice.commit
        turn = runtime.turn
        if commit:
            runtime.turn = turn + 1
        return choose_least_outstanding(choice.views, turn=turn)
