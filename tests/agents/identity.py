"""Which session identity an agent's request carries, in the order latgate looks for one
(issue 21, docs/clients.md "Session identity"): the body's ``prompt_cache_key``;
``x-claude-code-session-id``; ``session-id`` / ``session_id`` / ``x-codex-session-id`` /
``conversation_id``; the session part of Anthropic ``metadata.user_id``; ``x-session-id``.

Written from what the pinned CLIs were recorded sending (``tests/agents/recorder.py``),
independently of latgate's own reading, so the agents tier checks latgate's order
against the clients."""

from __future__ import annotations

import json
import re

from agents.recorder import Seen

#: headers naming a session, in order, after the body's ``prompt_cache_key``
SESSION_HEADERS = (
    "x-claude-code-session-id",
    "session-id",
    "session_id",
    "x-codex-session-id",
    "conversation_id",
)
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def user_id_session(user_id: str) -> str | None:
    """The session in Anthropic ``metadata.user_id``: Claude Code's JSON object string
    (``{"device_id": ..., "account_uuid": ..., "session_id": ...}``) or its older
    ``user_<hash>_account_<uuid>_session_<uuid>``."""
    if user_id.startswith("{"):
        try:
            value = json.loads(user_id).get("session_id")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None
    _, found, session = user_id.rpartition("_session_")
    return session if found and user_id.startswith("user_") and session else None


def session_identity(request: Seen) -> tuple[str, str] | None:
    """``(where, value)`` of the first session identity ``request`` carries, or None."""
    body = request.body if isinstance(request.body, dict) else {}
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return "body prompt_cache_key", key
    for name in SESSION_HEADERS:
        if request.headers.get(name):
            return f"header {name}", request.headers[name]
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user_id, str) and (session := user_id_session(user_id)):
        return "body metadata.user_id session", session
    if request.headers.get("x-session-id"):
        return "header x-session-id", request.headers["x-session-id"]
    return None
