"""Decode rate: a stream's output tokens per second, as a client measures it.

``tokens / (last token time - first token time)``, with the span floored at
:data:`MIN_SECONDS_PER_TOKEN` per token: an engine's tokens can arrive in bursts (vLLM
under load puts several tokens in one chunk; a small model's whole stream can arrive
in one or two reads), and a burst's span says nothing about how fast the engine
decoded, so no observation exceeds ``1 / MIN_SECONDS_PER_TOKEN`` tokens/s. A stream
whose tokens all arrived at once (no span) has no rate.

Used by ``latgate_output_tokens_per_second`` and ``latgate bench``'s ``tokens_per_second``.
"""

from __future__ import annotations

#: the shortest decode time one token of one stream is credited with (2000 tokens/s,
#: above any single-stream decode speed engines report)
MIN_SECONDS_PER_TOKEN = 0.0005


def decode_tokens_per_second(tokens: int, seconds: float | None) -> float | None:
    """Tokens per second over a stream's decode span.

    Args:
        tokens: completion tokens (the upstream's usage, else counted chunks).
        seconds: last token time minus first token time, or ``None`` when unknown.

    Returns:
        the rate, or ``None`` for fewer than two tokens or no positive span.
    """
    if seconds is None or seconds <= 0 or tokens < 2:
        return None
    return tokens / max(seconds, tokens * MIN_SECONDS_PER_TOKEN)
