"""A request's session: which conversation of which agent a turn belongs to, as a
number, and where the session's last turn was served.

:func:`session_key` takes the first present of (lowercase header names):

1. the body's ``prompt_cache_key`` (OpenAI API reference, chat completions and
   Responses; Codex sends it, and OpenCode its session id where the provider sets
   ``setCacheKey``);
2. ``x-claude-code-session-id`` (Claude Code), ``x-opencode-session`` (OpenCode, to
   providers whose id starts with ``opencode``: ``packages/opencode/src/session/llm.ts``);
3. ``session-id``, ``session_id``, ``x-codex-session-id``, ``conversation_id``
   (Codex: its session and conversation ids);
4. the session part of Anthropic ``metadata.user_id`` (``user`` once translated to chat
   completions): Claude Code sends ``user_<hash>_account_<uuid>_session_<uuid>``, and
   its newer releases a JSON object string with a ``session_id`` field; else the body's
   ``metadata.sessionId`` (Qwen Code, to a DashScope-shaped endpoint:
   ``packages/core/src/core/openaiContentGenerator/provider/dashscope.ts``);
5. a generic ``x-session-id``.

Sent by none of them (the prompt prefix is their identity): Cline's OpenAI-compatible
provider (only headers the user configures), Continue (``x-continue-unique-id`` is one id
per installation, not per session, and is not used), Qwen Code to any other endpoint.

Values are hashed at once (BLAKE2b, 64 bits: the same number in every process, so a
map shared over Redis agrees) and never kept or logged raw. Where a client sends none
of these, the prompt's prefix is the identity (:mod:`latgate.routing.prefix_index`).

:class:`SessionMap` is the session -> endpoint memory, two methods; its implementations,
in process or shared by the replicas over Redis, are in :mod:`latgate.live.store.sessions`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

SESSION_HEADERS = (
    "x-claude-code-session-id",
    "x-opencode-session",
    "session-id",
    "session_id",
    "x-codex-session-id",
    "conversation_id",
)
"""Headers naming a client's session, looked up in this order after ``prompt_cache_key``."""
GENERIC_SESSION_HEADER = "x-session-id"
_HEADER_NAMES = frozenset((*SESSION_HEADERS, GENERIC_SESSION_HEADER))
MAX_CLIENT_KEY_CHARS = 1024
"""Longer values are hashed on their first this many characters."""
_USER_ID_SESSION = "_session_"


def _hash(text: str) -> int:
    digest = hashlib.blake2b(text[:MAX_CLIENT_KEY_CHARS].encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def claude_code_session(user_id: str) -> str | None:
    """The session part of Claude Code's ``metadata.user_id``, or None when it has none.

    Example::

        claude_code_session("user_ab12_account_5e0c_session_9f3d")  # '9f3d'
        claude_code_session('{"device_id": "ab12", "session_id": "9f3d"}')  # '9f3d'
    """
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id[: MAX_CLIENT_KEY_CHARS * 2])
        except orjson.JSONDecodeError:
            return None
        value = parsed.get("session_id") if isinstance(parsed, dict) else None
        return value if isinstance(value, str) and value else None
    at = user_id.rfind(_USER_ID_SESSION)
    if at < 0 or not user_id.startswith("user_"):
        return None
    return user_id[at + len(_USER_ID_SESSION) :] or None


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> int | None:
    """The request's session as a 64-bit number, or None when the client names none
    (see the module docstring for the order).

    Args:
        body: the request body (chat completions, a translated Responses or Messages
            request, or an untranslated Messages body with ``metadata``).
        headers: request headers by lowercase name (Starlette ``Headers`` or a dict
            with lowercase keys); read once by ``keys()``, and looked up only when one
            of the names above is there (a lookup in Starlette's scans every header).

    Example::

        session_key({"prompt_cache_key": "repo-1"}, {})  # the same number in every process
        session_key({}, {"x-claude-code-session-id": "5f0c..."})
    """
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return _hash(key)
    named = not _HEADER_NAMES.isdisjoint(headers.keys())
    for name in SESSION_HEADERS if named else ():
        value = headers.get(name)
        if value:
            return _hash("session:" + value)
    user_id = body.get("user")
    if not isinstance(user_id, str):
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if isinstance(user_id, str) and (session := claude_code_session(user_id)):
        return _hash("session:" + session)
    metadata = body.get("metadata")
    qwen_session = metadata.get("sessionId") if isinstance(metadata, Mapping) else None
    if isinstance(qwen_session, str) and qwen_session:
        return _hash("session:" + qwen_session)
    value = headers.get(GENERIC_SESSION_HEADER) if named else None
    return _hash("session:" + value) if value else None


class SessionMap(Protocol):
    """Where each session's last turn was served: endpoint ids by session key."""

    def get(self, session_key: int) -> str | None:
        """The endpoint id that served the session last, or None when unknown."""
        ...

    def put(self, session_key: int, endpoint_id: str) -> None:
        """The session's latest turn was served by ``endpoint_id``."""
        ...
