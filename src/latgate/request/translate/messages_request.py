"""Anthropic Messages request -> OpenAI chat completions request.

Sources: the Anthropic API reference ("Messages", "Count message tokens"; content blocks
``text``, ``image``, ``document``, ``tool_use``, ``tool_result``, ``thinking``) and the
OpenAI API reference ("Create chat completion": messages, content parts, ``tools``,
``tool_choice``, ``stop``, ``stream_options``).

What maps, and to what:

==========================  ==========================================================
Anthropic                   chat completions
==========================  ==========================================================
``system`` (text/blocks)    a leading ``system`` message (block texts joined by LF)
``text`` blocks             ``content`` (a string when only text; else content parts)
``image`` (base64 / url)    ``image_url`` part (base64 as a ``data:`` URL)
``document`` PDF / text     ``file`` part (``file_data`` data URL) / text part
``tool_use`` (assistant)    ``tool_calls`` (``input`` as JSON ``arguments``)
``tool_result`` (user)      a ``tool`` message per result, before the user's other
                            content (images in a result follow as a user message)
``tools``                   ``type: function`` tools (``input_schema`` -> ``parameters``)
``tool_choice``             ``auto``/``any``/``tool``/``none`` -> ``auto``/``required``/
                            the named function/``none``; ``disable_parallel_tool_use``
                            -> ``parallel_tool_calls: false``
``max_tokens``              ``max_tokens``
``stop_sequences``          ``stop``
``temperature``, ``top_p``  the same; ``top_k`` passed on (vLLM and SGLang take it)
``metadata.user_id``        ``user``
``stream``                  ``stream`` with ``stream_options.include_usage`` (the
                            ``message_delta`` event needs the usage)
==========================  ==========================================================

Dropped on purpose, since chat completions has no counterpart (never an error):
``thinking`` / ``redacted_thinking`` blocks of earlier turns (engines such as DeepSeek
reject reasoning sent back), the ``thinking``, ``output_config``,
``context_management``, ``container``, ``mcp_servers`` and ``service_tier`` fields,
``cache_control`` on any block (engines cache prefixes by themselves), ``citations``,
server tools (``web_search_...``, ``bash_...``: a ``type`` and no ``input_schema``),
and blocks of unknown types. A custom tool without a string ``name`` or an object
``input_schema`` is a 400, as Anthropic answers it. Unknown top-level fields are ignored too, so a newer client keeps
working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from latgate.foundation.errors import InvalidRequest

_PASSED_SAMPLING = ("temperature", "top_p", "top_k")


def _chat_messages(messages: list[Any], system: object) -> list[dict[str, Any]]:
    """The chat messages of a Messages body's ``system`` and ``messages`` (checked as
    :func:`messages_to_chat` says)."""
    chat_messages: list[dict[str, Any]] = []
    text = _system_text(system)
    if text:
        chat_messages.append({"role": "system", "content": text})
    for number, message in enumerate(messages):
        where = f"messages.{number}"
        if not isinstance(message, Mapping):
            raise InvalidRequest(f"{where}: must be an object with role and content", param=where)
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise InvalidRequest(
                f"{where}.content: must be a string or an array of content blocks", param=f"{where}.content"
            )
        if role == "user":
            chat_messages.extend(_user_messages(content, where=where))
        elif role == "assistant":
            chat_messages.append(_assistant_message(content, where=where))
        elif role == "system":  # not in the Messages API, but its meaning is plain
            chat_messages.append({"role": "system", "content": _joined_text(content)})
        else:
            raise InvalidRequest(
                f"{where}.role: must be 'user' or 'assistant', not {role!r}", param=f"{where}.role"
            )
    return chat_messages


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions body for an Anthropic Messages (or count_tokens) body.

    Args:
        body: the parsed ``POST /v1/messages`` JSON object.

    Returns:
        a new chat completions request body; ``model`` is kept as the client named it
        (routing maps it), and absent when the client sent none.

    Raises:
        InvalidRequest: ``messages`` missing or not a list of ``{role, content}``
            objects, a ``role`` other than ``user``/``assistant``, content that is
            neither a string nor a list of blocks, a ``tool_result`` without
            ``tool_use_id``. ``param`` names the field (``messages.2.content``).

    Example::

        messages_to_chat({"model": "claude-sonnet-4-5", "max_tokens": 64,
                          "system": "be brief",
                          "messages": [{"role": "user", "content": "hi"}]})
        # {"messages": [{"role": "system", "content": "be brief"},
        #               {"role": "user", "content": "hi"}],
        #  "model": "claude-sonnet-4-5", "max_tokens": 64}
    """
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("messages: Field required", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: must be an array of messages", param="messages")
    chat: dict[str, Any] = {"messages": _chat_messages(messages, body.get("system"))}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    for name in _PASSED_SAMPLING:
        if body.get(name) is not None:
            chat[name] = body[name]
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and stop:
        chat["stop"] = stop
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        if body["stream"] is True:
            chat["stream_options"] = {"include_usage": True}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        _apply_tool_choice(chat, body.get("tool_choice"))
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    return chat


def stop_sequences_of(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The request's ``stop_sequences`` (strings only), to tell ``stop_sequence`` stops apart."""
    stop = body.get("stop_sequences")
    if not isinstance(stop, list):
        return ()
    return tuple(s for s in stop if isinstance(s, str))


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return _joined_text(system)
    return ""


def _joined_text(content: object) -> str:
    """The text of a string or of the ``text`` blocks of a block list, joined by LF."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [b["text"] for b in content if isinstance(b, Mapping) and isinstance(b.get("text"), str)]
    return "\n".join(texts)


def _user_messages(content: str | list[Any], *, where: str) -> list[dict[str, Any]]:
    """One user turn: a ``tool`` message per ``tool_result``, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "tool_result":
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str) or not tool_id:
                param = f"{where}.content.{number}.tool_use_id"
                raise InvalidRequest(f"{param}: Field required", param=param)
            text, images = _tool_result_content(block.get("content"))
            tool_messages.append({"role": "tool", "tool_call_id": tool_id, "content": text})
            parts.extend(images)
        else:
            part = _content_part(block)
            if part is not None:
                parts.append(part)
    messages = tool_messages
    if parts or not tool_messages:
        messages.append({"role": "user", "content": _parts_or_text(parts)})
    return messages


def _assistant_message(content: str | list[Any], *, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str):
                param = f"{where}.content.{number}.name"
                raise InvalidRequest(f"{param}: Field required", param=param)
            arguments = orjson.dumps(block.get("input") if block.get("input") is not None else {}).decode()
            call_id = block.get("id") if isinstance(block.get("id"), str) else f"toolu_{where}_{number}"
            tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        # thinking, redacted_thinking, server tool blocks: dropped (see the module docstring)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tool_result_content(content: object) -> tuple[str, list[dict[str, Any]]]:
    """A ``tool_result``'s text (blocks joined by LF) and its images as content parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return str(content), []
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        part = _content_part(block)
        if part is None:
            continue
        if part["type"] == "text":
            texts.append(part["text"])
        else:
            images.append(part)
    return "\n".join(texts), images


def _content_part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A chat content part for a text, image or document block; ``None`` to drop it."""
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    source_type = source.get("type")
    if kind == "image":
        if source_type == "base64":
            url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
        elif source_type == "url" and isinstance(source.get("url"), str):
            url = source["url"]
        else:
            return None
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document":
        if source_type == "text" and isinstance(source.get("data"), str):
            return {"type": "text", "text": source["data"]}
        if source_type == "base64":
            media_type = source.get("media_type", "application/pdf")
            filename = block.get("title") if isinstance(block.get("title"), str) else "document.pdf"
            data_url = f"data:{media_type};base64,{source.get('data', '')}"
            return {"type": "file", "file": {"filename": filename, "file_data": data_url}}
    return None


def _parts_or_text(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string (what every engine's chat template takes), else parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


#: the ``type`` of a custom (client-defined) tool; absent means custom too
CUSTOM_TOOL_TYPES = (None, "custom")


def _tools(tools: object) -> list[dict[str, Any]]:
    """Client tools as ``function`` tools; server tools (a ``type`` such as
    ``web_search_20250305``, no ``input_schema``) are dropped.

    Raises:
        InvalidRequest: ``tools`` is not a list, a tool is not an object, or a custom
            tool has no string ``name`` or no object ``input_schema`` (as Anthropic
            answers: ``tools.0.custom.input_schema: Field required``); ``param``
            names the field (``tools.0.name``).
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: Input should be a valid list", param="tools")
    out = []
    for number, tool in enumerate(tools):
        where = f"tools.{number}"
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"{where}: Input should be an object", param=where)
        schema = tool.get("input_schema")
        if tool.get("type") not in CUSTOM_TOOL_TYPES and not isinstance(schema, Mapping):
            continue  # a server tool: no engine runs it (the module docstring)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            problem = "Field required" if name is None else "Input should be a non-empty string"
            raise InvalidRequest(f"{where}.name: {problem}", param=f"{where}.name")
        if not isinstance(schema, Mapping):
            problem = "Field required" if schema is None else "Input should be an object"
            raise InvalidRequest(f"{where}.custom.input_schema: {problem}", param=f"{where}.input_schema")
        function: dict[str, Any] = {"name": name, "parameters": dict(schema)}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _apply_tool_choice(chat: dict[str, Any], choice: object) -> None:
    if not isinstance(choice, Mapping):
        return
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        chat["parallel_tool_calls"] = False
