"""Chat completions stream -> OpenAI Responses API event stream.

Source: the OpenAI API reference, "Responses" -> "Streaming events" (schemas
``ResponseStreamEvent`` and its members) and "Chat Completions" -> "The chat completion
chunk object"; SSE framing per the HTML Living Standard, "Server-sent events".

Each Responses event is sent as ``event: TYPE`` plus ``data: JSON`` and carries a
``sequence_number`` counting from 0. For one streamed chat completion the client sees::

    response.created, response.in_progress
    per output item, in order:
      reasoning text:  output_item.added, reasoning_text.delta..., reasoning_text.done, output_item.done
      message text:    output_item.added, content_part.added, output_text.delta...,
                       output_text.done, content_part.done, output_item.done
      each tool call:  output_item.added, function_call_arguments.delta...,
                       function_call_arguments.done, output_item.done
    response.completed (response.incomplete when the answer was cut by max tokens or a
    content filter; response.failed when the upstream broke mid-stream)

Tool calls stay open until the stream ends (chat streams may interleave parallel calls
by ``index``); a message or reasoning item closes when another item starts. An item
closes ``completed``, except those still open when the answer was cut (``status:
"incomplete"``, as the reference's ``OutputMessage.status`` allows) or broke: they close
``incomplete``, and every later snapshot of the response repeats each item's status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from latgate.forwarding.exchange import Exchange
from latgate.request.translate.chat_events import chat_chunks
from latgate.request.translate.responses_output import (
    INCOMPLETE_REASONS,
    chat_to_response,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    refusal_part,
    response_object,
    response_usage,
    text_part,
)
from latgate.routing.tokens import estimate_text_tokens


@dataclass
class _Item:
    """One output item being streamed: ``kind`` is message, reasoning or function_call."""

    kind: str
    item_id: str
    output_index: int
    parts: list[list[str]] = field(default_factory=list)  # message: [part type, text]
    text: str = ""  # reasoning text, or function-call arguments
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"  # then as its output_item.done said: completed or incomplete

    def snapshot(self, status: str, namespaced: dict[str, tuple[str, str]]) -> dict[str, Any]:
        if self.kind == "function_call":
            return function_call_item(
                item_id=self.item_id,
                status=status,
                call_id=self.call_id,
                name=self.name,
                arguments=self.text,
                namespaced=namespaced,
            )
        if self.kind == "reasoning":
            return reasoning_item(item_id=self.item_id, status=status, text=self.text)
        return message_item(
            item_id=self.item_id, status=status, parts=[_part(kind, text) for kind, text in self.parts]
        )


def _part(kind: str, text: str) -> dict[str, Any]:
    return refusal_part(text) if kind == "refusal" else text_part(text)


class ResponsesStreamTransform:
    """A :class:`~latgate.forwarding.transform.ResponseTransform` from chat completions to the
    Responses API, for one request (stream or not).

    Args:
        echo: the request fields the Response object repeats
            (:attr:`~latgate.request.translate.responses_request.ChatTranslation.echo`).
        namespaced: flattened namespace functions to map back
            (:attr:`~latgate.request.translate.responses_request.ChatTranslation.namespaced`).
        clock: Unix time in seconds (``created_at``), injectable for tests.

    ``feed`` takes complete chat-completions SSE events and returns Responses events;
    ``finish`` closes open items and sends ``response.completed`` (or ``.incomplete`` /
    ``.failed``); ``complete`` translates a non-streamed answer.
    """

    stream_content_type = "text/event-stream; charset=utf-8"
    #: the Responses API defines no keep-alive event: an SSE comment, skipped by every parser
    keepalive_event = b": keep-alive\n\n"

    def __init__(
        self,
        *,
        echo: dict[str, Any],
        namespaced: dict[str, tuple[str, str]] | None = None,
        clock: Callable[[], float] = time.time,
        exchange: Exchange | None = None,
    ) -> None:
        self._echo = echo
        self._exchange = exchange
        self._namespaced = namespaced or {}
        self._clock = clock
        self._response_id = new_id("resp")
        self._created_at = 0
        self._sequence = 0
        self._started = False
        self._ended = False
        self._model = str(echo.get("model") or "")
        self._items: list[_Item] = []
        self._open: _Item | None = None  # the open message or reasoning item
        self._calls: dict[int, _Item] = {}
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None

    # -- ResponseTransform -------------------------------------------------------------

    def feed(self, events: bytes) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        for chunk in chat_chunks(events):
            if self._ended:
                break
            self._chunk(chunk, out)
        return b"".join(out)

    def finish(self, *, error: str | None) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        if self._ended:
            return b""
        if error is not None:
            self._fail(error, out)
            return b"".join(out)
        incomplete = INCOMPLETE_REASONS.get(self._finish_reason or "")
        status = "incomplete" if incomplete else "completed"
        self._close_all(out, status=status)  # the items the cut interrupted are incomplete too
        response = self._snapshot(status, incomplete_reason=incomplete)
        self._emit(out, f"response.{status}", {"response": response})
        self._ended = True
        return b"".join(out)

    def complete(self, body: bytes) -> bytes:
        ex = self._exchange
        estimate = None if ex is None else (ex.prompt_tokens, ex.completion_tokens)
        return chat_to_response(body, echo=self._echo, namespaced=self._namespaced, estimate=estimate)

    # -- chat chunks -> events ---------------------------------------------------------

    def _start(self, out: list[bytes]) -> None:
        self._started = True
        self._created_at = int(self._clock())
        response = self._snapshot("in_progress")
        self._emit(out, "response.created", {"response": response})
        self._emit(out, "response.in_progress", {"response": response})

    def _chunk(self, chunk: dict[str, Any], out: list[bytes]) -> None:
        if isinstance(chunk.get("error"), dict):  # the stream ends failed (e.g. an unreadable event: chat_chunks)
            self._fail(str(chunk["error"].get("message") or "upstream error"), out)
            if self._exchange is not None:
                self._exchange.status, self._exchange.error_kind = 502, "stream_bad_event"
            return
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self._model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # the Responses API has one output per response
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = {}  # a malformed delta carries nothing readable
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._reasoning_delta(reasoning, out)
            if isinstance(delta.get("content"), str) and delta["content"]:
                self._message_delta("output_text", delta["content"], out)
            if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                self._message_delta("refusal", delta["refusal"], out)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._tool_call_delta(call, out)
            if isinstance(reason := choice.get("finish_reason"), str) and reason:  # a list would not hash
                self._finish_reason = reason

    def _reasoning_delta(self, text: str, out: list[bytes]) -> None:
        item = self._open
        if item is None or item.kind != "reasoning":
            item = self._add_item(_Item("reasoning", new_id("rs"), len(self._items)), out)
            self._open = item
        item.text += text
        self._emit(
            out,
            "response.reasoning_text.delta",
            {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0, "delta": text},
        )

    def _message_delta(self, kind: str, text: str, out: list[bytes]) -> None:
        item = self._open
        if item is None or item.kind != "message":
            item = self._add_item(_Item("message", new_id("msg"), len(self._items)), out)
            self._open = item
        if not item.parts or item.parts[-1][0] != kind:
            if item.parts:
                self._close_part(item, out)
            item.parts.append([kind, ""])
            self._emit(
                out, "response.content_part.added", self._part_fields(item) | {"part": _part(kind, "")}
            )
        item.parts[-1][1] += text
        fields = self._part_fields(item) | {"delta": text}
        if kind == "refusal":
            self._emit(out, "response.refusal.delta", fields)
        else:
            self._emit(out, "response.output_text.delta", fields | {"logprobs": []})

    def _tool_call_delta(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index", 0)
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        item = self._calls.get(index)
        if item is None:
            item = _Item("function_call", new_id("fc"), len(self._items))
            item.call_id = str(call.get("id") or new_id("call"))
            item.name = str(function.get("name") or "")
            self._calls[index] = item
            self._add_item(item, out)
        elif function.get("name") and not item.name:
            item.name = str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.text += arguments
            self._emit(
                out,
                "response.function_call_arguments.delta",
                {"item_id": item.item_id, "output_index": item.output_index, "delta": arguments},
            )

    # -- items ---------------------------------------------------------------------------

    def _add_item(self, item: _Item, out: list[bytes]) -> _Item:
        self._close_open(out)
        self._items.append(item)
        snapshot = item.snapshot("in_progress", self._namespaced)
        self._emit(out, "response.output_item.added", {"output_index": item.output_index, "item": snapshot})
        return item

    def _close_open(self, out: list[bytes]) -> None:
        if self._open is not None:
            self._close(self._open, out, status="completed")
            self._open = None

    def _close_all(self, out: list[bytes], *, status: str) -> None:
        self._open = None
        for item in self._items:
            if item.status == "in_progress":
                self._close(item, out, status=status)

    def _close(self, item: _Item, out: list[bytes], *, status: str) -> None:
        item.status = status
        where = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "reasoning":
            self._emit(out, "response.reasoning_text.done", where | {"content_index": 0, "text": item.text})
        elif item.kind == "function_call":
            name = self._namespaced.get(item.name, ("", item.name))[1]
            self._emit(
                out, "response.function_call_arguments.done", where | {"name": name, "arguments": item.text}
            )
        elif item.parts:
            self._close_part(item, out)
        snapshot = item.snapshot(status, self._namespaced)
        self._emit(out, "response.output_item.done", {"output_index": item.output_index, "item": snapshot})

    def _close_part(self, item: _Item, out: list[bytes]) -> None:
        kind, text = item.parts[-1]
        fields = self._part_fields(item)
        if kind == "refusal":
            self._emit(out, "response.refusal.done", fields | {"refusal": text})
        else:
            self._emit(out, "response.output_text.done", fields | {"text": text, "logprobs": []})
        self._emit(out, "response.content_part.done", fields | {"part": _part(kind, text)})

    @staticmethod
    def _part_fields(item: _Item) -> dict[str, Any]:
        return {
            "item_id": item.item_id,
            "output_index": item.output_index,
            "content_index": len(item.parts) - 1,
        }

    # -- whole-response events -----------------------------------------------------------

    def _fail(self, message: str, out: list[bytes]) -> None:
        self._close_all(out, status="incomplete")
        response = self._snapshot("failed", error={"code": "server_error", "message": message})
        self._emit(out, "response.failed", {"response": response})
        self._ended = True

    def _snapshot(
        self, status: str, *, incomplete_reason: str | None = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        output = [item.snapshot(item.status, self._namespaced) for item in self._items]
        return response_object(
            response_id=self._response_id,
            created_at=self._created_at,
            echo=self._echo,
            model=self._model,
            status=status,
            output=output,
            usage=response_usage(self._usage, estimate=self._estimate()) if status != "in_progress" else None,
            incomplete_reason=incomplete_reason,
            error=error,
        )

    def _estimate(self) -> tuple[int, int] | None:
        """latgate's own ``(input, output)`` tokens so far: the usage when the upstream's
        is absent or malformed (None without the request's exchange)."""
        if self._exchange is None:
            return None
        texts = [item.text for item in self._items] + [text for item in self._items for _, text in item.parts]
        return self._exchange.prompt_tokens, estimate_text_tokens("".join(texts))

    def _emit(self, out: list[bytes], event_type: str, fields: dict[str, Any]) -> None:
        payload = {"type": event_type, "sequence_number": self._sequence} | fields
        self._sequence += 1
        out.append(b"event: " + event_type.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")
