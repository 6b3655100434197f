"""Prompt-token estimation for routing, fast enough to run on every request.

Routing compares a request's prompt size with ``routing.long_context_threshold`` before
anything is sent upstream, so the count has to be cheap and has to be right about the
prompts that matter: long ones, in any script. :func:`estimate_text_tokens` gives every
UTF-8 byte a weight, what BPE tokenizers of the cl100k/o200k family spend on it, and
sums them with C-speed calls (``bytes.translate`` to the weight in tenths of a token,
then ``zlib.adler32``, whose low half is one plus the byte sum modulo 65521, over
slices too short for the sum to wrap); no Python loop runs per character.

============================================  ===========  ==========================
class                                         tokens each  fitted on
============================================  ===========  ==========================
ASCII letter                                  0.2          English prose, code
ASCII digit                                   0.8          code, JSON
ASCII punctuation, symbol, control            0.6          code, JSON
space, tab                                    0.1          (mostly merged into words)
newline (a CR just before it is free)         0.8          code
2-byte UTF-8 char (accented Latin, Cyrillic)  0.5          Russian
3-byte UTF-8 char (CJK, kana, hangul, ...)    1.0          Chinese, Japanese, Korean
4-byte UTF-8 char (emoji, CJK ext. B)         2.0          (byte-level fallback)
============================================  ===========  ==========================

Calibration: exact counts with the cl100k_base and o200k_base vocabularies (a
tiktoken-compatible BPE package, offline) of ~1.6 M characters of local text: licence
texts and docstrings, Python/C/JS sources, JSON, and zh/ja/ko/ru/de message
catalogues. Mean relative error of the estimate per ~2,000-character sample:

===================  ========  ========
text                 cl100k    o200k
===================  ========  ========
English prose        -4..0 %   -3..0 %
Python / C / JS      -1..+4 %  -2..+3 %
JSON                 -16 %     -13 %  (median -6 %; base64 strings pull it down)
Chinese (simpl.)     -8 %      +12 %
Japanese             -6 %      +24 %
Korean               -13 %     +19 %
Russian              +3 %      +46 %
German               -28 %     -18 %
Chinese text + code  -3 %      +6 %
===================  ========  ========

Single samples stray further: base64 blobs (-60 %), column-aligned tables (-45 %),
rare traditional Han characters (cl100k spends two tokens on many). CJK is
deliberately ~1 token per character, the conservative end: o200k-style vocabularies
spend 0.6-0.8 per character, cl100k 0.8-1.2, and an over-estimate only sends a
borderline prompt to the long-context pool. A repeated common word is the extreme:
``'测试' * 20000`` is 40,000 characters but 20,000 cl100k tokens; it is estimated at
40,000.

What an estimate costs (a short chat, a 40,000-character CJK prompt, 100 KB of source)
is measured in docs/performance.md.

Chat bodies add a fixed overhead per message (:data:`MESSAGE_OVERHEAD_TOKENS`), per
reply (:data:`REPLY_PRIMER_TOKENS`) and per image part (:data:`IMAGE_TOKENS`), as the
OpenAI chat format does. :class:`ExactTokenizer` counts exactly with a Hugging Face
``tokenizer.json`` (the optional ``tokenizers`` package) for a provider whose config
names one.
"""

from __future__ import annotations

import os
import string
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat message costs besides its content: role and separators."""

REPLY_PRIMER_TOKENS = 3
"""Tokens the chat template adds once to start the assistant's reply."""

IMAGE_TOKENS = 765
"""An image part of unknown size: OpenAI's high-detail price of a 1024x1024 image."""

LOW_DETAIL_IMAGE_TOKENS = 85
"""An image part with ``detail: "low"`` (OpenAI's fixed low-detail price)."""

_IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})
_TEXT_FIELDS = ("text", "thinking", "refusal", "arguments", "output")


def _weight_table() -> bytes:
    """Maps each UTF-8 byte to its weight in tenths of a token.

    A multi-byte character's weight is spread over its lead byte and its continuation
    bytes (0.4 each): 2-byte chars 0.1 + 0.4 = 0.5, 3-byte 0.2 + 0.8 = 1.0, 4-byte
    0.8 + 1.2 = 2.0.
    """
    tenths = [6] * 128  # ASCII punctuation, symbols and control characters
    for letter in string.ascii_letters:
        tenths[ord(letter)] = 2
    for digit in string.digits:
        tenths[ord(digit)] = 8
    for blank in " \t\v\f":
        tenths[ord(blank)] = 1
    tenths[ord("\r")] = 0  # "\r\n" is one token, charged to the "\n"
    tenths[ord("\n")] = 8
    tenths += [4] * 0x40 + [1] * 0x20 + [2] * 0x10 + [8] * 0x10  # 80-BF, C0-DF, E0-EF, F0-FF
    return bytes(tenths)


_WEIGHTS = _weight_table()
#: Bytes summed per ``adler32`` call: at most 8 tenths each, the sum stays under 65521.
_SUM_SLICE = 8000


def _tenths(data: bytes) -> int:
    """The weights of ``data`` summed, in tenths of a token."""
    weights = data.translate(_WEIGHTS)
    if len(weights) <= _SUM_SLICE:
        return (zlib.adler32(weights) & 0xFFFF) - 1
    view = memoryview(weights)
    return sum((zlib.adler32(view[i : i + _SUM_SLICE]) & 0xFFFF) - 1 for i in range(0, len(view), _SUM_SLICE))


#: Texts at least this long have their estimate remembered (:class:`_Memo`).
MEMO_MIN_CHARS = 512
#: The remembered texts hold at most this many characters (bytes for encoded tools).
MEMO_MAX_CHARS = 4 << 20


class _Memo:
    """The estimates of the last long texts seen, least recently used forgotten first.

    Why: a coding agent sends its system prompt, its tool schemas and the whole history
    again on every turn, so almost every long text of a request was counted before;
    finding it again costs a hash and a compare of its characters, a fraction of
    encoding and weighing them (docs/performance.md). The estimate of a text does not
    depend on anything else, so a remembered one is the same number."""

    def __init__(self, max_chars: int) -> None:
        self._max_chars = max_chars
        self._chars = 0
        self._tokens: dict[str | bytes, float] = {}
        self._lock = threading.Lock()  # the simulators estimate from their own threads

    def tokens(self, text: str | bytes) -> float:
        """The estimate of ``text`` (:func:`_count_text`), remembered."""
        with self._lock:
            known = self._tokens.pop(text, None)
            if known is not None:
                self._tokens[text] = known  # now the most recently used
                return known
        counted = _count_text(text)
        if len(text) <= self._max_chars:
            with self._lock:
                if self._tokens.setdefault(text, counted) is counted:
                    self._chars += len(text)
                while self._chars > self._max_chars:
                    oldest = next(iter(self._tokens))
                    del self._tokens[oldest]
                    self._chars -= len(oldest)
        return counted


_memo = _Memo(MEMO_MAX_CHARS)


_last_encoded: tuple[object, bytes] | None = None


def encoded_json(value: object) -> bytes:
    """``value``'s JSON (``orjson.dumps``, ``default=str``), the last one remembered by
    identity: the estimate encodes a body's tools, and the prefix index
    (:mod:`latgate.routing.prefix_index`) hashes the same bytes object again, whose hash
    Python keeps on it. ``value`` must not change in between (a parsed body does not).

    Raises:
        orjson.JSONEncodeError: nested past orjson's depth.
    """
    global _last_encoded
    last = _last_encoded
    if last is not None and last[0] is value:
        return last[1]
    encoded = orjson.dumps(value, default=str)
    _last_encoded = (value, encoded)
    return encoded


def _text_tokens(text: str | bytes) -> float:
    """Estimated tokens in ``text`` (or its UTF-8 bytes), unrounded; any non-empty text is at least one."""
    if len(text) >= MEMO_MIN_CHARS:
        return _memo.tokens(text)
    return _count_text(text)


def _count_text(text: str | bytes) -> float:
    if isinstance(text, bytes):
        data = text
    else:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON "\ud83d": count it, don't fail
            data = text.encode("utf-8", "surrogatepass")
    tenths = _tenths(data)
    return tenths / 10 if tenths >= 10 else float(bool(data))


def estimate_text_tokens(text: str) -> int:
    """Estimated number of tokens in ``text`` (0 for ``""``, else at least 1).

    About one token per CJK ideograph, kana or hangul syllable; about four characters
    per token for English prose; more tokens per character for punctuation-dense text
    such as code or JSON. See the module docstring for the calibration and accuracy.

    Example::

        estimate_text_tokens("Hello, world")         # 3
        estimate_text_tokens("测试" * 100)            # 200
    """
    return round(_text_tokens(text))


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of an OpenAI or Anthropic request body.

    Understands, and ignores anything malformed (validation is not its job; nested
    objects count as parsed JSON gives them, ``dict``):

    - chat completions ``messages`` (OpenAI API reference, "Create chat completion"):
      string content or a list of parts (``text`` counted, ``image_url`` a fixed
      :data:`IMAGE_TOKENS`), ``name``, ``tool_calls`` names and arguments, plus
      :data:`MESSAGE_OVERHEAD_TOKENS` per message and :data:`REPLY_PRIMER_TOKENS`;
    - ``tools`` / ``functions`` definitions, counted as their JSON text;
    - completions ``prompt`` and embeddings ``input``: a string, a list of strings, or
      token ids (counted as given);
    - Responses API ``instructions`` and ``input`` items;
    - Anthropic Messages ``system`` (string or text blocks) and content blocks
      (``text``, ``image``, ``tool_use`` input, ``tool_result`` content).

    Returns:
        The estimate, an integer >= 0.
    """
    return round(_prompt_tokens(body, _text_tokens))


#: Beyond this many messages the estimate counts an evenly spaced sample of this many
#: and scales it: walking every message of a huge body would hold the event loop for
#: most of a second, and routing needs the size, not the last token.
MAX_COUNTED_MESSAGES = 1024


def _prompt_tokens(body: Mapping[str, Any], count: Callable[[str], float], *, messages_tokens: float | None = None) -> float:
    """The estimate, unrounded; ``messages_tokens``: the messages' part counted already
    (:func:`latgate.routing.prefix_index.estimate_and_sample`)."""
    total = 0.0
    messages = body.get("messages")
    if messages_tokens is not None:
        total += messages_tokens
    elif isinstance(messages, list):
        total += REPLY_PRIMER_TOKENS
        if len(messages) <= MAX_COUNTED_MESSAGES:
            for message in messages:
                total += _message_tokens(message, count)
        else:
            stride = len(messages) / MAX_COUNTED_MESSAGES
            sample = sum(_message_tokens(messages[int(i * stride)], count) for i in range(MAX_COUNTED_MESSAGES))
            total += sample * len(messages) / MAX_COUNTED_MESSAGES
    for key in ("system", "instructions"):
        if key in body:
            total += _content_tokens(body[key], count)
    for key in ("prompt", "input"):
        if key in body:
            total += _input_tokens(body[key], count)
    for key in ("tools", "functions"):
        definitions = body.get(key)
        if definitions:
            encoded = encoded_json(definitions)
            total += _text_tokens(encoded) if count is _text_tokens else count(encoded.decode())
    return total


def _message_tokens(message: object, count: Callable[[str], float]) -> float:
    if not isinstance(message, dict):
        return 0.0
    total = MESSAGE_OVERHEAD_TOKENS + _content_tokens(message.get("content"), count)
    name = message.get("name")
    if isinstance(name, str):
        total += 1 + count(name)
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                total += MESSAGE_OVERHEAD_TOKENS + _content_tokens(function.get("name"), count)
                total += _content_tokens(function.get("arguments"), count)
    return total


def _content_tokens(content: object, count: Callable[[str], float]) -> float:
    if isinstance(content, str):
        return count(content) if content else 0.0
    if isinstance(content, list):
        return sum(_part_tokens(part, count) for part in content)
    return 0.0


def _part_tokens(part: object, count: Callable[[str], float]) -> float:
    if isinstance(part, str):
        return count(part)
    if not isinstance(part, dict):
        return 0.0
    kind = part.get("type")
    if isinstance(kind, str) and kind in _IMAGE_PART_TYPES:
        image = part.get("image_url")
        detail = image.get("detail") if isinstance(image, dict) else part.get("detail")
        return LOW_DETAIL_IMAGE_TOKENS if detail == "low" else IMAGE_TOKENS
    if "role" in part or kind == "message":  # a Responses API input item
        return _message_tokens(part, count)
    for field in _TEXT_FIELDS:
        value = part.get(field)
        if isinstance(value, str):
            return count(value) + _content_tokens(part.get("name"), count)
    if kind == "tool_use":
        encoded = orjson.dumps(part.get("input"), default=str)
        return _content_tokens(part.get("name"), count) + (
            _text_tokens(encoded) if count is _text_tokens else count(encoded.decode())
        )
    if kind == "tool_result":
        return _content_tokens(part.get("content"), count)
    return 0.0


def _input_tokens(value: object, count: Callable[[str], float]) -> float:
    if isinstance(value, str):
        return count(value) if value else 0.0
    if not isinstance(value, list) or not value:
        return 0.0
    first = value[0]
    if isinstance(first, int):  # one prompt as token ids
        return float(len(value))
    if isinstance(first, list):  # several prompts as token ids
        return float(sum(len(ids) for ids in value if isinstance(ids, list)))
    return sum(_part_tokens(item, count) for item in value)


class TokenizerError(Exception):
    """An exact tokenizer cannot be used: package missing or file unreadable."""


class ExactTokenizer:
    """Exact token counts with a Hugging Face ``tokenizer.json``.

    Needs the optional ``tokenizers`` package (``pip install 'latgate[tokenizers]'``).
    Used for the long-context comparison when a provider's config sets
    ``tokenizer = "path/to/tokenizer.json"``. Counts exclude special tokens; the chat
    overheads are the same as :func:`estimate_prompt_tokens`. Encoding costs
    milliseconds for long prompts, unlike the estimate.

    Args:
        path: the ``tokenizer.json`` file.

    Raises:
        TokenizerError: ``tokenizers`` is not installed, or the file cannot be loaded
            (the message names the path).

    Example::

        exact = ExactTokenizer("models/llama3/tokenizer.json")
        exact.count_text("hello world")                  # 2
        exact.count_prompt({"messages": [...]})
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(
                f"exact token counting with {self.path} needs the 'tokenizers' package: "
                "pip install 'latgate[tokenizers]'"
            ) from None
        try:
            self._tokenizer = Tokenizer.from_file(self.path)
        except Exception as exc:  # noqa: BLE001 - the Rust binding raises plain Exception
            raise TokenizerError(f"cannot load tokenizer {self.path}: {exc}") from None

    def count_text(self, text: str) -> int:
        """Exact number of tokens in ``text``, without special tokens."""
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_prompt(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a request body, as :func:`estimate_prompt_tokens` walks it."""
        return round(_prompt_tokens(body, self.count_text))
