"""The decode rate on plain data: tokens over the first-to-last span, bursts bounded."""

from __future__ import annotations

import pytest

from latgate.foundation.decode_rate import MIN_SECONDS_PER_TOKEN, decode_tokens_per_second


def test_a_paced_stream_is_tokens_over_its_span() -> None:
    assert decode_tokens_per_second(40, 1.0) == pytest.approx(40.0)


@pytest.mark.parametrize("tokens", [2, 16, 900])
def test_a_burst_never_exceeds_the_per_token_floor(tokens: int) -> None:
    """The whole stream arriving in two reads a microsecond apart (seen from vLLM with a
    tiny model): the rate is bounded, not ~10^6 tokens/s."""
    assert decode_tokens_per_second(tokens, 1e-6) == pytest.approx(1 / MIN_SECONDS_PER_TOKEN)


@pytest.mark.parametrize(("tokens", "seconds"), [(1, 1.0), (0, 1.0), (10, 0.0), (10, None)])
def test_no_rate_without_two_tokens_and_a_span(tokens: int, seconds: float | None) -> None:
    assert decode_tokens_per_second(tokens, seconds) is None
