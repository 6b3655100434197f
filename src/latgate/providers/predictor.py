"""Time to first token as a function of prompt length, fitted online per endpoint.

Model: ``ttft = base_ms + per_token_ms * prompt_tokens`` (plus, outside this module,
the wait for a batch slot; see :meth:`latgate.providers.state.EndpointState.queue_ms`).
The fit is exponentially-weighted least squares: each observation counts
``1 - alpha`` times as much as the one after it, so after a step change the prediction
is within a few percent of the new level about 20 observations later (``alpha`` 0.15:
0.85**20 ~ 4% of the weight is older). The slope is shrunk towards a prior
(``prior_per_token_ms``) with the weight of ``SLOPE_PRIOR_TOKENS`` tokens of spread,
so requests of one size (no spread to fit a slope on) still give a sensible slope;
neither the slope nor the intercept is ever negative. Before any observation the prior line is the prediction:
no warm-up period.

``spread_ms`` is the recency-weighted mean absolute error of recent predictions; the
90th percentile is taken as ``predict + P90_SPREADS * spread`` (for a normal error,
p90 = mean + 1.28 sigma and the mean absolute deviation is 0.8 sigma).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ALPHA = 0.15
SLOPE_PRIOR_TOKENS = 512.0
P90_SPREADS = 1.6


@dataclass(slots=True)
class TtftPredictor:
    """Online fit of TTFT (ms) against prompt tokens for one endpoint.

    Args:
        prior_base_ms: the prediction's intercept before any observation.
        prior_per_token_ms: the slope before observations, and the value the fitted
            slope is shrunk towards (ms per prompt token).
        alpha: weight of the newest observation (0 < alpha <= 1).

    Example::

        p = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
        p.observe(prompt_tokens=1000, ttft_ms=120.0)
        p.predict_ms(1000)   # 120.0
    """

    prior_base_ms: float
    prior_per_token_ms: float
    alpha: float = DEFAULT_ALPHA
    observations: int = 0
    base_ms: float = 0.0
    per_token_ms: float = 0.0
    spread_ms: float = 0.0
    _w: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def __post_init__(self) -> None:
        self.base_ms = self.prior_base_ms
        self.per_token_ms = self.prior_per_token_ms
        self.spread_ms = self.prior_base_ms / 4

    def predict_ms(self, prompt_tokens: int) -> float:
        """Predicted TTFT in ms for a prompt of ``prompt_tokens``, without queueing."""
        value = self.base_ms + self.per_token_ms * prompt_tokens
        return max(0.0, value)

    def p90_ms(self, prompt_tokens: int) -> float:
        """A 90th-percentile estimate in ms (see the module docstring)."""
        return self.predict_ms(prompt_tokens) + P90_SPREADS * self.spread_ms

    def observe(self, *, prompt_tokens: int, ttft_ms: float) -> None:
        """Add one measured TTFT (ms, queueing already taken out) and refit."""
        x = float(prompt_tokens)
        y = max(0.0, ttft_ms)
        error = abs(y - self.predict_ms(prompt_tokens))
        keep = 1.0 - self.alpha
        if self.observations:
            self.spread_ms = keep * self.spread_ms + self.alpha * error
        else:
            self.spread_ms = error / 2
        self.observations += 1
        self._w = self._w * keep + 1.0
        self._sx = self._sx * keep + x
        self._sy = self._sy * keep + y
        self._sxx = self._sxx * keep + x * x
        self._sxy = self._sxy * keep + x * y
        self._refit()

    def observe_at_least(self, *, prompt_tokens: int, ttft_ms: float) -> None:
        """A censored observation: the first token had not come after ``ttft_ms``
        (a cancelled or timed-out attempt). Counts only when it exceeds the current
        prediction, as that observation."""
        if ttft_ms > self.predict_ms(prompt_tokens):
            self.observe(prompt_tokens=prompt_tokens, ttft_ms=ttft_ms)

    def reset_to(self, *, base_ms: float, per_token_ms: float) -> None:
        """Forget every observation and start again from this line (an endpoint back
        from ejection is judged on what it does next, not on what ejected it)."""
        self.observations = 0
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.base_ms = base_ms
        self.per_token_ms = max(0.0, per_token_ms)
        self.spread_ms = base_ms / 4

    def _refit(self) -> None:
        w = self._w
        mean_x = self._sx / w
        mean_y = self._sy / w
        var_x = self._sxx / w - mean_x * mean_x
        cov_xy = self._sxy / w - mean_x * mean_y
        shrink = SLOPE_PRIOR_TOKENS * SLOPE_PRIOR_TOKENS
        slope = (cov_xy + shrink * self.prior_per_token_ms) / ((max(0.0, var_x)) + shrink)
        if slope < 0.0:
            slope = 0.0
        elif mean_x > 0.0 and slope * mean_x > mean_y:
            slope = mean_y / mean_x  # never a negative intercept: short prompts are not free
        self.per_token_ms = slope
        self.base_ms = mean_y - slope * mean_x
