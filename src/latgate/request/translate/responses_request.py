"""OpenAI Responses API request -> chat completions request.

Source: the OpenAI API reference, "Responses" (``POST /v1/responses``, schema
``CreateResponse``) and "Chat Completions" (``CreateChatCompletionRequest``).

What is translated:

- ``instructions`` -> a leading ``system`` message; ``input`` (a string, or a list of
  items) -> ``messages``: ``message`` items by role (``developer`` becomes ``system``),
  ``function_call`` items -> an assistant message's ``tool_calls`` (consecutive calls
  share one message, as parallel calls do), ``function_call_output`` -> a ``tool``
  message; ``reasoning`` items are dropped (their content is the provider's own and
  often encrypted).
- Content parts: ``input_text`` / ``output_text`` -> text, ``refusal`` -> text,
  ``input_image`` -> ``image_url``, ``input_file`` -> ``file``.
- ``tools`` of type ``function`` -> chat ``tools``; a ``namespace`` tool's functions are
  flattened to ``NAMESPACE__NAME`` (and ``function_call`` items naming a ``namespace``
  with them), mapped back on the way out; hosted tools (web search, file search,
  computer use...) have no chat counterpart and are dropped; ``tool_choice``,
  ``parallel_tool_calls``, ``max_output_tokens`` -> ``max_completion_tokens``,
  ``reasoning.effort`` -> ``reasoning_effort``, ``text.format`` -> ``response_format``,
  ``text.verbosity`` -> ``verbosity``; ``temperature``, ``top_p``, ``user``,
  ``prompt_cache_key``, ``safety_identifier`` and ``stream`` as they are. Streams ask for
  usage (``stream_options.include_usage``) since ``response.completed`` carries it.

latgate keeps no responses: ``store: true``, ``previous_response_id``, ``conversation``,
``background: true``, ``prompt`` templates and ``item_reference`` items need server-side
state and are refused with a 400 naming the field. ``include``, ``truncation``,
``metadata``, ``service_tier``, ``context_management`` and ``max_tool_calls`` are
accepted and have no effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from latgate.foundation.errors import InvalidRequest

#: Fields a stored-state server would need; refused, since latgate keeps no responses.
_STATEFUL = {
    "previous_response_id": "latgate keeps no responses: send the whole conversation in 'input' instead",
    "conversation": "latgate keeps no conversations: send the whole conversation in 'input' instead",
    "prompt": "latgate keeps no prompt templates: send 'instructions' and 'input' instead",
}
#: Copied to the chat body unchanged when present.
_COPIED = (
    "model",
    "temperature",
    "top_p",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "parallel_tool_calls",
)
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
#: Joins a namespace and a function name into one chat function name.
NAMESPACE_SEPARATOR = "__"


@dataclass(frozen=True)
class ChatTranslation:
    """One Responses request as chat completions.

    Attributes:
        chat_body: the chat completions request body (``messages``, ``tools``...).
        stream: the client asked for a stream.
        echo: the request fields a Response object repeats back (``instructions``,
            ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``temperature``,
            ``top_p``, ``max_output_tokens``, ``reasoning``, ``text``, ``metadata``,
            ``user``, ``prompt_cache_key``), with the Responses API defaults filled in.
        namespaced: chat function name -> (namespace, function name), for the
            functions of ``namespace`` tools.
    """

    chat_body: dict[str, Any]
    stream: bool
    echo: dict[str, Any]
    namespaced: dict[str, tuple[str, str]]


def responses_to_chat(body: dict[str, Any]) -> ChatTranslation:
    """Translate a ``POST /v1/responses`` body into a chat completions body.

    Args:
        body: the client's JSON object (``CreateResponse``).

    Returns:
        a :class:`ChatTranslation`.

    Raises:
        InvalidRequest: a field needing server-side state (``store: true``,
            ``previous_response_id``...), a missing or malformed ``input``, an input item
            or content part with no chat counterpart; ``param`` names the field.

    Example::

        responses_to_chat({"model": "m", "input": "hi", "instructions": "be brief"})
        # chat_body: {"model": "m", "messages": [{"role": "system", ...}, {"role": "user", "content": "hi"}]}
    """
    _refuse_stateful(body)
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream", code="invalid_type")
    chat: dict[str, Any] = {key: body[key] for key in _COPIED if body.get(key) is not None}
    messages = _instructions(body.get("instructions"))
    messages.extend(input_messages(body.get("input")))
    if not messages:
        raise InvalidRequest("'input' must hold at least one item", param="input", code="empty_array")
    chat["messages"] = messages
    namespaced: dict[str, tuple[str, str]] = {}
    tools = _tools(body.get("tools"), namespaced)
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    _options(body, chat)
    chat["stream"] = stream
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return ChatTranslation(chat_body=chat, stream=stream, echo=_echo(body), namespaced=namespaced)


def _refuse_stateful(body: dict[str, Any]) -> None:
    if body.get("store") is True:
        raise InvalidRequest(
            "'store: true' is not supported: latgate keeps no responses; send 'store: false'",
            param="store",
            code="unsupported_parameter",
        )
    if body.get("background") is True:
        raise InvalidRequest(
            "'background: true' is not supported: latgate keeps no responses to poll",
            param="background",
            code="unsupported_parameter",
        )
    for field, hint in _STATEFUL.items():
        if body.get(field) is not None:
            raise InvalidRequest(
                f"'{field}' is not supported: {hint}", param=field, code="unsupported_parameter"
            )


def _instructions(value: Any) -> list[dict[str, Any]]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}]
    if isinstance(value, list):
        return input_messages(value, param="instructions")
    raise InvalidRequest("'instructions' must be a string", param="instructions", code="invalid_type")


def input_messages(value: Any, *, param: str = "input") -> list[dict[str, Any]]:
    """Chat ``messages`` for a Responses ``input`` (a string or a list of items).

    Raises:
        InvalidRequest: ``input`` missing, of the wrong type, or holding an item with no
            chat counterpart (``param`` is ``input[i]...``).
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        raise InvalidRequest(f"'{param}' is required", param=param, code="missing_required_parameter")
    if not isinstance(value, list):
        raise InvalidRequest(
            f"'{param}' must be a string or an array of items", param=param, code="invalid_type"
        )
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where, code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where=where))
        elif kind == "function_call":
            _append_tool_call(messages, item, where=where)
        elif kind == "function_call_output":
            messages.append(_tool_result(item, where=where))
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise InvalidRequest(
                f"'{where}': item references are not supported: latgate keeps no items; send the item itself",
                param=where,
                code="unsupported_parameter",
            )
        else:
            raise InvalidRequest(
                f"'{where}': input items of type {kind!r} are not supported (supported: message, "
                "function_call, function_call_output, reasoning)",
                param=where,
                code="unsupported_value",
            )
    return messages


def _message(item: dict[str, Any], *, where: str) -> dict[str, Any]:
    role = item.get("role")
    role = _ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise InvalidRequest(
            f"'{where}.role' must be one of user, assistant, system, developer",
            param=f"{where}.role",
            code="invalid_value",
        )
    return {"role": role, "content": _content(item.get("content"), role=role, where=f"{where}.content")}


def _content(value: Any, *, role: str, where: str) -> Any:
    """Chat message content: a plain string when every part is text, else a parts list."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(
            f"'{where}' must be a string or an array of content parts", param=where, code="invalid_type"
        )
    parts = [_part(part, where=f"{where}[{i}]") for i, part in enumerate(value)]
    if role != "user" or all(part["type"] == "text" for part in parts):
        texts = [part.get("text", "") for part in parts if part["type"] == "text"]
        return "".join(texts) if len(texts) == 1 else "\n".join(texts)
    return parts


def _part(part: Any, *, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where, code="invalid_type")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": str(part.get("text") or "")}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal") or "")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise InvalidRequest(
                f"'{where}': images by file_id are not supported; send 'image_url'",
                param=where,
                code="unsupported_value",
            )
        image = {"url": url}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        file = {key: part[key] for key in ("file_data", "file_id", "filename") if part.get(key)}
        return {"type": "file", "file": file}
    raise InvalidRequest(
        f"'{where}': content parts of type {kind!r} are not supported", param=where, code="unsupported_value"
    )


def _append_tool_call(messages: list[dict[str, Any]], item: dict[str, Any], *, where: str) -> None:
    """Add a ``function_call`` item to the trailing assistant message (or a new one)."""
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise InvalidRequest(
            f"'{where}' needs 'name' and 'call_id' strings", param=where, code="invalid_value"
        )
    if isinstance(item.get("namespace"), str) and item["namespace"]:
        name = item["namespace"] + NAMESPACE_SEPARATOR + name
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if (
        last is not None
        and last["role"] == "assistant"
        and isinstance(last.get("content"), (str, type(None)))
    ):
        last.setdefault("tool_calls", []).append(call)
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tool_result(item: dict[str, Any], *, where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(
            f"'{where}.call_id' must be a string", param=f"{where}.call_id", code="invalid_value"
        )
    output = item.get("output", "")
    if isinstance(output, list):
        output = "\n".join(
            str(p.get("text", "")) for p in output if isinstance(p, dict) and p.get("type") in _TEXT_PARTS
        )
    elif not isinstance(output, str):
        output = orjson.dumps(output).decode()
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _tools(
    value: Any, namespaced: dict[str, tuple[str, str]], *, param: str = "tools"
) -> list[dict[str, Any]]:
    """Chat tools for Responses ``tools``; fills ``namespaced`` for namespace tools."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be an array", param=param, code="invalid_type")
    out = []
    for index, tool in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where, code="invalid_type")
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str) and param == "tools":
            for inner in _tools(tool.get("tools"), namespaced, param=f"{where}.tools"):
                name = inner["function"]["name"]
                flat = tool["name"] + NAMESPACE_SEPARATOR + name
                namespaced[flat] = (tool["name"], name)
                out.append({"type": "function", "function": {**inner["function"], "name": flat}})
            continue
        if tool.get("type") != "function":
            continue  # hosted tools (web_search, file_search...) run on OpenAI's side only
        if not isinstance(tool.get("name"), str):
            raise InvalidRequest(
                f"'{where}.name' must be a string", param=f"{where}.name", code="invalid_type"
            )
        function = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    if (
        isinstance(value, dict)
        and value.get("type") == "allowed_tools"
        and value.get("mode") in ("auto", "required")
    ):
        return value["mode"]
    raise InvalidRequest(
        "'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', name}",
        param="tool_choice",
        code="unsupported_value",
    )


def _options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Generation options that have a chat counterpart under another name."""
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    if isinstance(body.get("top_logprobs"), int):
        chat["logprobs"] = True
        chat["top_logprobs"] = body["top_logprobs"]
    text = body.get("text")
    if not isinstance(text, dict):
        return
    if text.get("verbosity"):
        chat["verbosity"] = text["verbosity"]
    fmt = text.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return
    if fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise InvalidRequest(
            "'text.format.type' must be text, json_object or json_schema", param="text.format"
        )


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields a Response object repeats, with the API's defaults."""
    return {
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") if isinstance(body.get("tools"), list) else [],
        "top_p": body.get("top_p", 1.0),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "user": body.get("user"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
