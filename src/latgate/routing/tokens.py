"""Prompt-token estimation (stub; replaced by the routing work)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens in ``text``."""
    ascii_chars = sum(1 for c in text if ord(c) < 128)
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of an OpenAI request body."""
    import json

    return estimate_text_tokens(json.dumps(body.get("messages") or body.get("prompt") or "", ensure_ascii=False))
