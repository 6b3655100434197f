"""Time to first token as a function of prompt length, fitted online per endpoint.

Model: ``ttft = base_ms + per_token_ms * prompt_tokens`` (plus, outside this module,
the wait for a batch slot; see :meth:`latgate.live.providers.endpoint.EndpointRuntime.queue_ms`).
The fit is exponentially-weighted least squares: each observation counts
``1 - alpha`` times as much as the one after it, so after a step change the prediction
is within a few percent of the new level about 20 observations later (``alpha`` 0.15:
0.85**20 ~ 4% of the weight is older). Both coefficients are shrunk a little towards
the prior line (ridge regression, with weights that are a fixed share of the data's):
where the data pins them down (prompts of several sizes) the priors change nothing;
where it cannot (every prompt about the same size: only the line's height there is
known), the priors choose the split between intercept and slope. So an upstream that
has seen only 20 000-token prompts still predicts a short prompt from its prior
intercept, not from a line through the origin. Neither coefficient is ever negative.
Before any observation the prior line is the prediction: no warm-up period.

``spread_ms`` is the recency-weighted mean absolute error of recent predictions; the
90th percentile is taken as ``predict + P90_SPREADS * spread`` (for a normal error,
p90 = mean + 1.28 sigma and the mean absolute deviation is 0.8 sigma).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ALPHA = 0.15
INTERCEPT_PRIOR_WEIGHT = 0.001
SLOPE_PRIOR_WEIGHT = 0.001 * 512.0**2
"""Ridge weights per unit of data weight: the intercept prior counts like a thousandth
of the data; the slope prior like a thousandth of data spread over 512 tokens."""
P90_SPREADS = 1.6
CENSORED_FACTOR = 1.5


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

    @property
    def weight(self) -> float:
        """The observations' recency-weighted count (0 before any; at most ``1 / alpha``)."""
        return self._w

    def prior_ms(self, prompt_tokens: int) -> float:
        """The prior line's TTFT in ms for a prompt of ``prompt_tokens``."""
        return self.prior_base_ms + self.prior_per_token_ms * prompt_tokens

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
        prediction, as ``CENSORED_FACTOR`` times itself: the true time is longer, and an
        endpoint that always loses hedge races must not look merely as slow as the
        moment it was given up on."""
        if ttft_ms > self.predict_ms(prompt_tokens):
            self.observe(prompt_tokens=prompt_tokens, ttft_ms=CENSORED_FACTOR * ttft_ms)

    def restart(self, *, prompt_tokens: int, ttft_ms: float) -> None:
        """Forget every observation and start again from this one (an endpoint back
        from ejection is judged on what it does next, not on what ejected it)."""
        self.observations = 0
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.base_ms, self.per_token_ms = ttft_ms, 0.0  # so the old fit's error is not its spread
        self.observe(prompt_tokens=prompt_tokens, ttft_ms=ttft_ms)

    def _refit(self) -> None:
        ridge_a = INTERCEPT_PRIOR_WEIGHT * self._w
        ridge_b = SLOPE_PRIOR_WEIGHT * self._w
        m11, m12, m22 = self._w + ridge_a, self._sx, self._sxx + ridge_b
        r1 = self._sy + ridge_a * self.prior_base_ms
        r2 = self._sxy + ridge_b * self.prior_per_token_ms
        slope = (m11 * r2 - m12 * r1) / (m11 * m22 - m12 * m12)
        slope = max(slope, 0.0)
        base = (r1 - m12 * slope) / m11
        if base < 0.0:  # short prompts are not free: the best line with a zero intercept
            base = 0.0
            slope = max(0.0, r2 / m22)
        self.per_token_ms = slope
        self.base_ms = base


@dataclass(slots=True)
class ItlEstimate:
    """Time per output token (ms) of one endpoint, learned from its streams.

    A recency-weighted mean of each finished stream's mean gap between output tokens
    (``alpha`` the newest stream's weight), with ``weight`` the streams' recency-weighted
    count for the confidence blend with a prior (:func:`latgate.routing.policies.evidence.confidence`).
    Before any stream, ``ms`` is None and the prior is the estimate.

    Args:
        prior_ms: the role's time per output token before any stream (ms).
        alpha: weight of the newest stream (0 < alpha <= 1).

    Example::

        itl = ItlEstimate(prior_ms=25.0)
        itl.observe(4.0)
        itl.ms, itl.observations   # (4.0, 1)
    """

    prior_ms: float
    alpha: float = DEFAULT_ALPHA
    ms: float | None = None
    observations: int = 0
    weight: float = 0.0

    def restart(self, ms: float) -> None:
        """Forget every stream and start again from this one (a refresh that disagrees
        with a stale estimate: a recovered endpoint is judged on what it does now)."""
        self.ms, self.observations, self.weight = max(0.0, ms), 1, 1.0

    def observe(self, ms: float) -> None:
        """Add one stream's mean time per output token (ms, >= 0)."""
        value = max(0.0, ms)
        self.ms = value if self.ms is None else self.ms + self.alpha * (value - self.ms)
        self.observations += 1
        self.weight = self.weight * (1.0 - self.alpha) + 1.0
