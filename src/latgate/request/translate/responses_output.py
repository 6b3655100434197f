"""Chat completions answer -> OpenAI Responses API ``Response`` object (non-streamed).

Source: the OpenAI API reference, "Responses" (schemas ``Response``, ``OutputMessage``,
``FunctionToolCall``, ``ReasoningItem``, ``ResponseUsage``) and "Chat Completions"
(``CreateChatCompletionResponse``).

The first choice becomes the response's ``output``, in the order a Responses model
emits its items: a ``reasoning`` item (from ``reasoning_content`` / ``reasoning``), a
``message`` item (text and refusal parts), then one ``function_call`` item per tool
call. ``finish_reason`` ``length`` and ``content_filter`` make the response
``incomplete`` with that reason, as the Responses API reports them, and the items the
cut interrupted ``status: "incomplete"`` (``OutputMessage.status``: ``in_progress``,
``completed`` or ``incomplete``); the others are ``completed``. The shared helpers
here also build the streamed events' response snapshots (:mod:`.responses_stream`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from latgate.forwarding.usage import detail_tokens, usage_counts
from latgate.request.translate.chat_events import content_text, read_chat_completion, tool_calls

#: chat ``finish_reason`` -> Responses ``incomplete_details.reason``.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """A fresh item id such as ``resp_9f...`` (prefixes as the Responses API uses them)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def response_object(
    *,
    response_id: str,
    created_at: int,
    echo: dict[str, Any],
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``Response`` object.

    Args:
        response_id: ``resp_...``.
        created_at: Unix seconds.
        echo: the request fields repeated back (:attr:`ChatTranslation.echo`).
        model: the model name the client asked for.
        status: ``in_progress``, ``completed``, ``incomplete`` or ``failed``.
        output: the output items so far.
        usage: a Responses ``usage`` object, or ``None`` until known (then left out,
            as the OpenAPI description has no null usage; likewise ``user``).
        incomplete_reason: ``max_output_tokens`` or ``content_filter`` when incomplete.
        error: ``{"code", "message"}`` when failed.
    """
    response = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": echo["instructions"],
        "max_output_tokens": echo["max_output_tokens"],
        "model": model,
        "output": output,
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "previous_response_id": None,
        "reasoning": echo["reasoning"],
        "store": False,
        "temperature": echo["temperature"],
        "text": echo["text"],
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "top_p": echo["top_p"],
        "truncation": "disabled",
        "metadata": echo["metadata"],
        "prompt_cache_key": echo["prompt_cache_key"],
    }
    if usage is not None:
        response["usage"] = usage
    if echo["user"] is not None:
        response["user"] = echo["user"]
    return response


def response_usage(usage: object, *, estimate: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """A Responses ``usage`` object from a chat ``usage``.

    ``prompt_tokens`` -> ``input_tokens`` (``prompt_tokens_details.cached_tokens`` ->
    ``input_tokens_details.cached_tokens``), ``completion_tokens`` -> ``output_tokens``
    (``completion_tokens_details.reasoning_tokens`` -> ``output_tokens_details``). A
    usage absent or malformed (:func:`~latgate.forwarding.usage.usage_counts`; a malformed
    details member counts as 0) gives ``estimate`` (latgate's own ``(input, output)``
    tokens), or None without one.
    """
    counts = usage_counts(usage)
    if counts is None:
        if estimate is None:
            return None
        prompt, completion = estimate
        cached = reasoning = 0
    else:
        assert isinstance(usage, dict)
        prompt, completion = counts
        cached = detail_tokens(usage, "prompt_tokens_details", "cached_tokens")
        reasoning = detail_tokens(usage, "completion_tokens_details", "reasoning_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def message_item(*, item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant ``message`` output item."""
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": parts}


def text_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def refusal_part(text: str) -> dict[str, Any]:
    """A ``refusal`` content part."""
    return {"type": "refusal", "refusal": text}


def function_call_item(
    *,
    item_id: str,
    status: str,
    call_id: str,
    name: str,
    arguments: str,
    namespaced: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """A ``function_call`` output item; a flattened namespace function (``namespaced``)
    gets its ``namespace`` and own name back."""
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if name in namespaced:
        item["namespace"], item["name"] = namespaced[name]
    return item


def reasoning_item(*, item_id: str, status: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item carrying the provider's reasoning text."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def chat_to_response(
    body: bytes,
    *,
    echo: dict[str, Any],
    namespaced: dict[str, tuple[str, str]],
    estimate: tuple[int, int] | None = None,
) -> bytes:
    """Translate a whole chat completions answer into a Responses ``Response`` (JSON bytes).

    ``namespaced`` maps flattened namespace functions back (see ``ChatTranslation``);
    ``estimate``: latgate's own ``(input, output)`` tokens, the usage when the
    upstream's is absent or malformed. Assistant ``content`` given as a list of parts
    (Mistral-style) is read as the text of its text parts.

    Raises:
        UntranslatableAnswer: the body is not a chat completion (not a JSON object,
            ``choices`` not a non-empty list, no ``message`` object in the first).
    """
    chat, choice, message = read_chat_completion(body)
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(item_id=new_id("rs"), status="completed", text=reasoning))
    parts = []
    text = content_text(message.get("content"))
    if text:
        parts.append(text_part(text))
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append(refusal_part(message["refusal"]))
    if parts:
        output.append(message_item(item_id=new_id("msg"), status="completed", parts=parts))
    for call, function in tool_calls(message):
        output.append(
            function_call_item(
                item_id=new_id("fc"),
                status="completed",
                call_id=str(call.get("id") or new_id("call")),
                name=str(function.get("name") or ""),
                arguments=str(function.get("arguments") or ""),
                namespaced=namespaced,
            )
        )
    incomplete = _incomplete_reason(choice, output)
    response = response_object(
        response_id=new_id("resp"),
        created_at=_int(chat.get("created")) or int(time.time()),
        echo=echo,
        model=str(chat.get("model") or echo["model"] or ""),
        status="incomplete" if incomplete else "completed",
        output=output,
        usage=response_usage(chat.get("usage"), estimate=estimate),
        incomplete_reason=incomplete,
    )
    return orjson.dumps(response)


def _incomplete_reason(choice: dict[str, Any], output: list[dict[str, Any]]) -> str | None:
    """The ``incomplete_details.reason`` of a cut answer (None when whole), after setting
    ``status: "incomplete"`` on the items it was still generating, the same ones the
    streamed translation closes incomplete: every function call when there are any
    (they stay open to the end), else the last item (the message, or the reasoning when
    no text came)."""
    finish_reason = choice.get("finish_reason")  # a JSON value: a list would not hash
    incomplete = INCOMPLETE_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    if incomplete:
        calls = [item for item in output if item["type"] == "function_call"]
        for item in calls or output[-1:]:
            item["status"] = "incomplete"
    return incomplete


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
