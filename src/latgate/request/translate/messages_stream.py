"""Chat completions stream -> Anthropic Messages stream: a :class:`ResponseTransform`.

Source: the Anthropic API reference ("Streaming Messages"). A stream is SSE events,
each ``event: TYPE`` + ``data: {"type": TYPE, ...}``, in this order:

    message_start          the message with empty ``content`` and the input usage
    ping
    per content block:     content_block_start (index, empty block)
                           content_block_delta (text_delta | thinking_delta |
                                                input_json_delta) ...
                           content_block_stop
    message_delta          ``stop_reason``, ``stop_sequence``, ``usage.output_tokens``
    message_stop

A failure after the stream began is one ``event: error`` (no ``message_stop``), which
the Anthropic SDKs raise as an API error.

Upstream chunks (OpenAI "The chat completion chunk object", as engines really send
them) are read leniently: ``finish_reason`` of ``""`` or ``null`` on intermediate
chunks means "not finished"; ``tool_calls: []`` next to ``content`` is ignored;
tool-call fragments are matched to their call by ``index``, else by ``id``, else taken
as the continuation of the latest call (engines omit both on continuation fragments);
a call whose ``name`` arrives after its first arguments is held until the name is
known; ``reasoning_content`` / ``reasoning`` deltas become ``thinking`` blocks. Only
choice 0 is translated (the Messages API has no ``n``). Blocks are emitted one after
another, as Anthropic does; an upstream that interleaves fragments of parallel calls
gets its late fragments sent as deltas of their call's block index, which the
Anthropic SDKs assemble by index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from latgate.forwarding.exchange import Exchange
from latgate.request.translate.chat_events import chat_chunks
from latgate.request.translate.errors import anthropic_error_event
from latgate.request.translate.messages_response import (
    anthropic_usage,
    chat_to_message,
    message_id,
    new_tool_use_id,
    reasoning_text,
    stop_reason,
)

_TEXT = "text"
_THINKING = "thinking"


@dataclass
class _ToolCall:
    """One upstream tool call being streamed; ``block`` is its content block index once started."""

    id: str | None
    name: str | None = None
    block: int | None = None
    pending: list[str] = field(default_factory=list)


class MessagesStream:
    """Translates one upstream chat completions answer into the Anthropic Messages API.

    Implements :class:`latgate.forwarding.transform.ResponseTransform` (``feed``,
    ``finish``, ``complete``); one instance per request.

    Args:
        exchange: the request's record: ``public_model`` (the name the client asked
            for) and ``prompt_tokens`` (latgate's estimate, reported as the input
            usage in ``message_start`` before the upstream's count is known) are read
            when the answer starts, after routing filled them in.
        stop_sequences: the request's ``stop_sequences``, to report ``stop_sequence``.

    Example::

        transform = MessagesStream(exchange=exchange, stop_sequences=())
        await gateway.proxy(exchange, body=chat_body, headers=request.headers,
                            path="/chat/completions", transform=transform)
    """

    stream_content_type = "text/event-stream; charset=utf-8"
    #: Anthropic's keep-alive (API reference, "Streaming Messages": ``ping`` events)
    keepalive_event = b'event: ping\ndata: {"type": "ping"}\n\n'

    def __init__(self, *, exchange: Exchange, stop_sequences: Sequence[str]) -> None:
        self._exchange = exchange
        self._stop_sequences = tuple(stop_sequences)
        self._started = False
        self._ended = False
        self._next_block = 0
        self._open: str | _ToolCall | None = None
        self._open_block = 0
        self._calls: list[_ToolCall] = []
        self._call_by_index: dict[int, _ToolCall] = {}
        self._call_by_id: dict[str, _ToolCall] = {}
        self._finish_reason: object = None
        self._matched_stop: object = None
        self._usage: Any = None
        self._output_units = 0

    # -- ResponseTransform ----------------------------------------------------------

    def feed(self, events: bytes) -> bytes:
        """Anthropic events for complete upstream SSE events (possibly ``b""``)."""
        out: list[bytes] = []
        for chunk in chat_chunks(events):
            if self._ended:
                break
            self._chunk(chunk, out)
        return b"".join(out)

    def finish(self, *, error: str | None) -> bytes:
        """The closing events: an ``error`` event when ``error`` is set, else the open
        block's stop, ``message_delta`` and ``message_stop``."""
        if self._ended:
            return b""
        self._ended = True
        if error is not None:
            return anthropic_error_event(status=502, message=error)
        out: list[bytes] = []
        self._start({}, out)
        for call in self._calls:
            if call.block is None:  # arguments without a name ever: still the client's data
                call.name = call.name or ""
                self._start_call(call, out)
        self._close(out)
        reason, sequence = stop_reason(
            self._finish_reason,
            matched=self._matched_stop,
            stop_sequences=self._stop_sequences,
            has_tool_use=bool(self._calls),
        )
        usage = anthropic_usage(
            self._usage, estimated_input_tokens=self._exchange.prompt_tokens, output_tokens=self._output_units
        )
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage,
                },
            )
        )
        out.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def complete(self, body: bytes) -> bytes:
        """The Anthropic ``Message`` for a whole (non-streamed) chat completion body."""
        return chat_to_message(
            body,
            model=self._exchange.public_model,
            stop_sequences=self._stop_sequences,
            estimated_input_tokens=self._exchange.prompt_tokens,
            estimated_output_tokens=self._exchange.completion_tokens,
        )

    # -- one upstream chunk ---------------------------------------------------------

    def _chunk(self, chunk: dict[str, Any], out: list[bytes]) -> None:
        error = chunk.get("error")
        if error is not None:  # the stream ends failed (an event latgate could not read: chat_chunks)
            message = error.get("message") if isinstance(error, dict) else str(error)
            out.append(anthropic_error_event(status=502, message=f"upstream error: {message or 'unknown'}"))
            self._ended = True
            self._exchange.status, self._exchange.error_kind = 502, "stream_bad_event"
            return
        self._start(chunk, out)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index") not in (0, None):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                reasoning = reasoning_text(delta)
                if reasoning:
                    self._text_delta(_THINKING, reasoning, out)
                content = delta.get("content")
                if isinstance(content, str) and content:
                    self._text_delta(_TEXT, content, out)
                calls = delta.get("tool_calls")
                for fragment in calls if isinstance(calls, list) else ():
                    if isinstance(fragment, dict):
                        self._tool_fragment(fragment, out)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self._finish_reason = finish
                self._matched_stop = choice.get("stop_reason") or choice.get("matched_stop")

    def _start(self, chunk: dict[str, Any], out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._exchange.public_model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage(None, estimated_input_tokens=self._exchange.prompt_tokens),
        }
        out.append(_event("message_start", {"type": "message_start", "message": message}))
        out.append(_event("ping", {"type": "ping"}))

    def _text_delta(self, kind: str, text: str, out: list[bytes]) -> None:
        if self._open != kind:
            self._close(out)
            block = (
                {"type": "text", "text": ""}
                if kind == _TEXT
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            self._open_block = self._begin(block, out)
            self._open = kind
        delta = (
            {"type": "text_delta", "text": text}
            if kind == _TEXT
            else {"type": "thinking_delta", "thinking": text}
        )
        out.append(_delta(self._open_block, delta))
        self._output_units += 1

    def _tool_fragment(self, fragment: dict[str, Any], out: list[bytes]) -> None:
        index = fragment.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        call_id = fragment.get("id") if isinstance(fragment.get("id"), str) and fragment.get("id") else None
        function = given if isinstance(given := fragment.get("function"), dict) else {}
        name = (
            function.get("name") if isinstance(function.get("name"), str) and function.get("name") else None
        )
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a few upstreams send the object itself
            arguments = orjson.dumps(arguments).decode()
        elif not isinstance(arguments, str):
            arguments = ""
        call = self._call_for(index, call_id)
        if call.id is None and call_id is not None:
            call.id = call_id
            self._call_by_id[call_id] = call
        if call.name is None and name is not None:
            call.name = name
        self._output_units += 1
        if call.block is None:
            if arguments:
                call.pending.append(arguments)
            if call.name is not None:
                self._start_call(call, out)
        elif arguments:
            out.append(_delta(call.block, {"type": "input_json_delta", "partial_json": arguments}))

    def _call_for(self, index: int | None, call_id: str | None) -> _ToolCall:
        """The call a fragment belongs to: by id, else by index, else the latest; or a new one."""
        if call_id is not None and call_id in self._call_by_id:
            return self._call_by_id[call_id]
        if index is not None:
            known = self._call_by_index.get(index)
            if known is not None and (call_id is None or known.id is None):
                return known
        elif call_id is None and self._calls:
            return self._calls[-1]
        call = _ToolCall(id=call_id)
        self._calls.append(call)
        if index is not None:
            self._call_by_index[index] = call
        if call_id is not None:
            self._call_by_id[call_id] = call
        return call

    def _start_call(self, call: _ToolCall, out: list[bytes]) -> None:
        self._close(out)
        if call.id is None:
            call.id = new_tool_use_id()
        call.block = self._begin({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}, out)
        self._open = call
        self._open_block = call.block
        if call.pending:
            out.append(
                _delta(call.block, {"type": "input_json_delta", "partial_json": "".join(call.pending)})
            )
            call.pending.clear()

    def _begin(self, block: dict[str, Any], out: list[bytes]) -> int:
        index = self._next_block
        self._next_block += 1
        out.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
            )
        )
        return index

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(
                _event("content_block_stop", {"type": "content_block_stop", "index": self._open_block})
            )
            self._open = None


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
