"""Other wire APIs translated to and from chat completions, which every provider speaks.

Anthropic Messages (for Claude Code and the Anthropic SDKs):

- :func:`messages_to_chat` (``messages_request``): a Messages request body -> a chat
  completions body (what maps and what is dropped on purpose is listed there).
- :class:`MessagesStream` (``messages_stream``): the
  :class:`~latgate.forwarding.transform.ResponseTransform` turning the upstream's chat
  completions answer, streamed or whole, into the Messages API's.
- :func:`anthropic_error_body` (``errors``): the Anthropic error envelope.

OpenAI Responses (for the Codex CLI): the ``responses_*`` modules.
"""

from latgate.request.translate.errors import anthropic_error_body, anthropic_error_event, anthropic_error_type
from latgate.request.translate.messages_request import messages_to_chat, stop_sequences_of
from latgate.request.translate.messages_response import chat_to_message
from latgate.request.translate.messages_stream import MessagesStream

__all__ = [
    "MessagesStream",
    "anthropic_error_body",
    "anthropic_error_event",
    "anthropic_error_type",
    "chat_to_message",
    "messages_to_chat",
    "stop_sequences_of",
]
