"""``latgate serve`` as a real process for lifecycle tests, and an upstream the test
holds mid-stream.

:class:`GatewayProcess` reads the process's stderr on a thread into a queue, so a test
waits for a log line (with a deadline) instead of sleeping. :class:`GatedUpstream` is
an OpenAI-compatible upstream that streams the first token of every chat completion,
then holds the rest until the test opens its gate: a stream provably in flight.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from completions import DONE, ROLE, chat_chunk, content, event

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on http://([^ ]+):(\d+)")


class GatewayProcess:
    """A ``latgate serve`` process with stderr followed line by line.

    Args:
        args: arguments after ``serve``; ``--port 0`` lets the kernel choose (see
            :meth:`wait_listening`).
        env: extra environment variables.
        command: what runs before ``args`` (default: this interpreter's ``latgate serve``).
        cwd: the working directory (default: the repository root).
    """

    def __init__(
        self,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "latgate", "serve"]), *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, *, timeout: float = 30.0) -> re.Match[str]:
        """The first line from now on matching ``pattern``; fails on timeout or exit."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} in {timeout}s:\n" + "\n".join(self.lines)
                ) from None
            if line is None:
                self._queue.put(None)
                raise AssertionError(
                    f"process ended without a line matching {pattern!r}:\n" + "\n".join(self.lines)
                )
            self.lines.append(line)
            match = regex.search(line)
            if match:
                return match

    def wait_listening(self) -> str:
        """The base URL once the process says it listens."""
        match = self.wait_for(LISTENING.pattern)
        return f"http://{match.group(1)}:{match.group(2)}"

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, *, timeout: float) -> int:
        """The exit status; the rest of stderr is kept in :attr:`lines`."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        while True:
            line = self._queue.get_nowait() if not self._queue.empty() else None
            if line is None:
                break
            self.lines.append(line)
        return code

    def stop(self) -> None:
        """Kill the process if it still runs (test cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class GatedUpstream:
    """An ASGI chat-completions upstream: streams a role chunk and the token ``"one"``,
    waits for :attr:`gate`, then sends ``" two"``, a stop chunk and ``[DONE]``.

    ``started`` is set once a stream's first token has been sent. Non-streamed requests
    get an immediate JSON completion.
    """

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = orjson.loads(body or b"{}")
        if not request.get("stream"):
            answer = {
                "id": "chatcmpl-gated",
                "object": "chat.completion",
                "created": 0,
                "model": request.get("model", "m"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": orjson.dumps(answer)})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send(
            {
                "type": "http.response.body",
                "body": ROLE + content("one"),
                "more_body": True,
            }
        )
        self.started.set()
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        tail = content(" two") + event(chat_chunk({}, finish_reason="stop")) + DONE
        await send({"type": "http.response.body", "body": tail, "more_body": False})
