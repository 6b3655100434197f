"""OpenAI chat completion -> Anthropic Messages response (non-streamed), and the pieces
the stream translation shares: stop reasons, usage, ids.

Sources: the Anthropic API reference ("Messages": the ``Message`` object, its
``stop_reason`` values and ``usage``) and the OpenAI API reference ("The chat completion
object": ``finish_reason``, ``message.tool_calls``, ``usage.prompt_tokens_details``).
Engines add fields the OpenAI reference lacks, read here when present:
``message.reasoning_content`` (vLLM, SGLang, DeepSeek) or ``message.reasoning``
(OpenRouter, newer vLLM) become a ``thinking`` block; vLLM's ``choice.stop_reason`` and
SGLang's ``choice.matched_stop`` name the stop string that ended the reply.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from latgate.forwarding.usage import detail_tokens, usage_counts
from latgate.request.translate.chat_events import content_text, read_chat_completion, tool_calls

#: chat ``finish_reason`` -> Anthropic ``stop_reason`` (``stop`` is refined by :func:`stop_reason`).
FINISH_TO_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


# long: one Message built field by field from one chat completion (thinking, text, refusal, tool_use blocks,
# then stop reason and usage); the pieces are already helpers, what is left is their order
def chat_to_message(
    body: bytes,
    *,
    model: str,
    stop_sequences: Sequence[str],
    estimated_input_tokens: int,
    estimated_output_tokens: int = 0,
) -> bytes:
    """The Anthropic ``Message`` JSON for a chat completion JSON body.

    Args:
        body: the upstream's 200 chat completion body.
        model: the model name the client asked for (the message's ``model``).
        stop_sequences: the request's ``stop_sequences``.
        estimated_input_tokens / estimated_output_tokens: reported as ``input_tokens``
            / ``output_tokens`` when the upstream's usage is absent or malformed.

    Returns:
        JSON bytes of ``{"id", "type": "message", "role": "assistant", "model",
        "content": [...], "stop_reason", "stop_sequence", "usage"}``. Only the first
        choice is translated (the Messages API has no ``n``). Assistant ``content``
        given as a list of parts (Mistral-style) is read as the text of its text parts.

    Raises:
        UntranslatableAnswer: the body is not a chat completion (not a JSON object,
            ``choices`` not a non-empty list, no ``message`` object in the first).
    """
    chat, choice, message = read_chat_completion(body)
    content: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = content_text(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        content.append({"type": "text", "text": refusal})
    for call, function in tool_calls(message):
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or new_tool_use_id(),
                "name": str(function.get("name") or ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    has_tool_use = any(block["type"] == "tool_use" for block in content)
    reason, sequence = stop_reason(
        choice.get("finish_reason"),
        matched=choice.get("stop_reason") or choice.get("matched_stop"),
        stop_sequences=stop_sequences,
        has_tool_use=has_tool_use,
    )
    if isinstance(refusal, str) and refusal and reason == "end_turn":
        reason = "refusal"
    usage = anthropic_usage(
        chat.get("usage"), estimated_input_tokens=estimated_input_tokens, output_tokens=estimated_output_tokens
    )
    return orjson.dumps(
        {
            "id": message_id(chat.get("id")),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }
    )


def stop_reason(
    finish_reason: object, *, matched: object, stop_sequences: Sequence[str], has_tool_use: bool
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat ``finish_reason``.

    ``tool_calls`` -> ``tool_use``, ``length`` -> ``max_tokens``, ``content_filter`` ->
    ``refusal``; ``stop`` -> ``stop_sequence`` when the engine names the matched string
    (``matched``) and it is one of ``stop_sequences``, else ``end_turn``. A reply that
    called tools is ``tool_use`` whatever the engine said (some say ``stop``); a
    missing, empty or unknown reason is ``end_turn``.
    """
    if isinstance(finish_reason, str) and finish_reason in FINISH_TO_STOP_REASON:
        reason = FINISH_TO_STOP_REASON[finish_reason]
    else:
        reason = "end_turn"
    if has_tool_use and reason in ("end_turn", "tool_use"):
        return "tool_use", None
    if reason == "end_turn" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return reason, None


def anthropic_usage(usage: object, *, estimated_input_tokens: int, output_tokens: int = 0) -> dict[str, int]:
    """Anthropic ``usage`` for an OpenAI ``usage`` object (or the estimates when it is
    absent or malformed).

    ``input_tokens`` excludes prompt tokens served from the engine's prefix cache
    (``prompt_tokens_details.cached_tokens``), which are ``cache_read_input_tokens``,
    as Anthropic counts them; ``cache_creation_input_tokens`` is always 0.
    """
    counts = usage_counts(usage)
    # absent or malformed (:func:`~latgate.forwarding.usage.usage_counts`; counts are only
    # read from a mapping, which the isinstance says to the type checker): the estimates
    if counts is None or not isinstance(usage, Mapping):
        prompt, completion, cached = estimated_input_tokens, output_tokens, 0
    else:
        prompt, completion = counts
        cached = min(detail_tokens(usage, "prompt_tokens_details", "cached_tokens"), prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def reasoning_text(part: Mapping[str, Any]) -> str:
    """The reasoning text of a chat message or delta (``reasoning_content`` or ``reasoning``)."""
    for field in ("reasoning_content", "reasoning"):
        value = part.get(field)
        if isinstance(value, str) and value:
            return value
    return ""


def tool_input(arguments: object) -> dict[str, Any]:
    """A tool call's ``arguments`` JSON text as the ``input`` object.

    Empty arguments are ``{}``; arguments that are not a JSON object are kept, not
    lost, as ``{"arguments": <the text>}`` so the client's tool reports the problem.
    """
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def message_id(chat_id: object) -> str:
    """``msg_`` + the upstream completion id (without ``chatcmpl-``), or a new id."""
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def new_tool_use_id() -> str:
    """A ``toolu_`` id for a tool call whose upstream sent none."""
    return "toolu_" + uuid.uuid4().hex[:24]
