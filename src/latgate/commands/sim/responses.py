"""The simulator's ``POST /v1/responses``: an engine that serves the OpenAI Responses API
itself (as OpenAI's API and recent vLLM and SGLang servers do), so latgate's
pass-through to such providers can be tested end to end.

A Responses request is translated to chat completions
(:func:`~latgate.request.translate.responses_request.responses_to_chat`), generated like any
chat request (same engine, same timing, same faults), and each piece of the answer is
rewritten as it is sent by :class:`ResponsesSend`, which wraps the ASGI ``send``:
streams become the Responses event sequence (``response.created`` ...
``response.output_text.delta`` ... ``response.completed``), a non-streamed answer
becomes one Response object. Error answers pass through unchanged.
"""

from __future__ import annotations

from typing import Any

from latgate.commands.sim.asgi import Send
from latgate.request.translate.responses_stream import ResponsesStreamTransform


class ResponsesSend:
    """An ASGI ``send`` turning a chat completions answer into a Responses API answer.

    Args:
        send: the server's ``send``.
        transform: the request's :class:`ResponsesStreamTransform` (built from its
            :class:`~latgate.request.translate.responses_request.ChatTranslation`).
    """

    def __init__(self, send: Send, transform: ResponsesStreamTransform) -> None:
        self._send = send
        self._transform = transform
        self._mode = ""  # "stream", "body" (buffered, translated whole) or "as_is"
        self._start: dict[str, Any] | None = None
        self._body: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] != 200:
                self._mode = "as_is"
            elif content_type.startswith(b"text/event-stream"):
                self._mode = "stream"
            else:
                self._mode, self._start = "body", message
                return
            await self._send(message)
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        if self._mode == "stream":
            body = self._transform.feed(body) if body else b""
            if not more:
                body += self._transform.finish(error=None)
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        elif self._mode == "body":
            self._body.append(body)
            if not more:
                await self._send_whole()
        else:
            await self._send(message)

    async def _send_whole(self) -> None:
        assert self._start is not None
        data = self._transform.complete(b"".join(self._body))
        headers = [(k, v) for k, v in self._start.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": data, "more_body": False})
