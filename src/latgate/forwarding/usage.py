"""Reading an upstream's ``usage`` object, which may be malformed: its token counts when
they are counts, else nothing, so the caller falls back to latgate's own estimate
(marked ``usage_estimated`` in the access log) instead of failing or taking garbage.

Names: chat completions' ``prompt_tokens`` / ``completion_tokens`` with
``prompt_tokens_details.cached_tokens`` and ``completion_tokens_details.reasoning_tokens``;
the Responses API's ``input_tokens`` / ``output_tokens`` (OpenAI API reference, "The chat
completion object" and "The response object").

Prompt tokens an engine served from its prefix cache (:func:`cached_prompt_tokens`):
``prompt_tokens_details.cached_tokens`` (OpenAI; vLLM when started with
``--enable-prompt-tokens-details``, which leaves the details out when nothing was
cached; SGLang), ``input_tokens_details.cached_tokens`` (Responses API) and Anthropic's
``cache_read_input_tokens`` (Messages API, "Prompt caching").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latgate.routing.tokens import estimate_text_tokens


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_counts(usage: object) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a usage object, or None unless both are
    non-negative integers (a string, a negative number, a bool, a missing one: the
    object is not used)."""
    if type(usage) is not dict and not isinstance(usage, Mapping):  # dict first: the ABC check costs
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is int and type(completion) is int and prompt >= 0 and completion >= 0:
        return prompt, completion  # the common case, without two calls
    if prompt is None and completion is None:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    prompt, completion = _count(prompt), _count(completion)
    if prompt is None or completion is None:
        return None
    return prompt, completion


def cached_prompt_tokens(usage: object) -> int | None:
    """Prompt tokens the upstream says it served from its prefix cache, or None when its
    ``usage`` reports none (no details, or a malformed count).

    Read once per answer, on the usage object the relay already kept (the stream's usage
    chunk, or the body of a non-streamed answer): a few dictionary lookups.

    Example::

        cached_prompt_tokens({"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 768}})  # 768
        cached_prompt_tokens({"input_tokens": 12, "cache_read_input_tokens": 4096})  # 4096 (Anthropic)
        cached_prompt_tokens({"prompt_tokens": 900})  # None
    """
    if type(usage) is not dict and not isinstance(usage, Mapping):
        return None
    for details in ("prompt_tokens_details", "input_tokens_details"):
        part = usage.get(details)
        if (type(part) is dict or isinstance(part, Mapping)) and "cached_tokens" in part:
            return _count(part["cached_tokens"])
    return _count(usage.get("cache_read_input_tokens"))


def detail_tokens(usage: Mapping[str, Any], details: str, name: str) -> int:
    """``usage[details][name]`` (``prompt_tokens_details.cached_tokens``...) when it is a
    non-negative integer, else 0 (a details member that is not an object included)."""
    part = usage.get(details)
    value = _count(part.get(name)) if isinstance(part, Mapping) else None
    return value or 0


def answer_tokens(answer: Mapping[str, Any]) -> int:
    """latgate's estimate of a whole answer's completion tokens (its text, reasoning and
    tool-call arguments, every choice; chat ``message`` or completions ``text``), for an
    answer whose usage is missing or malformed."""
    texts: list[str] = []
    choices = answer.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, Mapping):
            continue
        if isinstance(choice.get("text"), str):
            texts.append(choice["text"])
        message = choice.get("message")
        if not isinstance(message, Mapping):
            continue
        for field in ("content", "reasoning_content", "reasoning", "refusal"):
            value = message.get(field)
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list):  # content parts
                texts += [p["text"] for p in value if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                texts += [v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str)]
    return estimate_text_tokens("\n".join(texts)) if texts else 0
