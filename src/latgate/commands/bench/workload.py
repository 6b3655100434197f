"""The request bodies a bench run sends: one chat completion per request.

Each body asks for ``max_tokens`` of output from a user message of about
``prompt_tokens`` tokens, sized with latgate's own estimator
(``latgate.routing.tokens.estimate_text_tokens``, the one routing uses). The message
is an instruction, a tag naming the run and the request, and filler text. By default
the tag comes first, so every request differs from its first token and a prefix
cache cannot serve any of it; with ``shared_prefix`` it comes last, so all requests
share everything but the tag (the agent case: one long system prompt, many turns).

The filler and the JSON around it are serialised once; ``body(index)`` only splices
the tag into pre-encoded bytes, so building a body costs microseconds even for
100k-token prompts and is done before the request's clock starts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson

from latgate.routing.tokens import estimate_text_tokens

_INSTRUCTION = "Write a long, detailed story inspired by the notes below. Notes:"
_TAG_SLOT = "\x00TAG\x00"
_WORDS = (
    "river", "lantern", "copper", "meadow", "signal", "harbor", "quartz", "ember", "violet", "canyon",
    "orbit", "thistle", "falcon", "marble", "cedar", "drift", "static", "prism", "willow", "beacon",
    "tundra", "saffron", "glacier", "relay", "cobalt", "orchard", "ripple", "summit", "pylon", "fern",
    "vector", "cinder", "lagoon", "mosaic", "quill", "basalt", "meridian", "lattice", "harvest", "nimbus",
    "ochre", "pepper", "rampart", "sable", "timber", "umber", "vessel",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """What every request body of a run asks for.

    Attributes:
        model: the ``model`` field sent.
        prompt_tokens: target size of the user message, in estimated tokens (>= 1).
        max_tokens: the ``max_tokens`` field sent.
        stream: send ``stream: true`` with ``stream_options.include_usage``.
        shared_prefix: put the per-request tag at the end instead of the start.
        run_id: distinguishes this run's prompts from an earlier run's, so a server's
            prefix cache warmed by a previous run does not serve this one (ASCII letters
            and digits).
    """

    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    shared_prefix: bool
    run_id: str


class Workload:
    """Pre-encoded chat completion bodies for one run, as ``spec`` describes them.

    Raises:
        ValueError: ``spec.prompt_tokens`` below 1, or ``spec.run_id`` not ASCII
            letters and digits.

    Example::

        workload = Workload(WorkloadSpec(model="m", prompt_tokens=500, max_tokens=64,
                                         stream=True, shared_prefix=False, run_id="a1b2"))
        body = workload.body(0)  # bytes, ready to POST
    """

    def __init__(self, spec: WorkloadSpec) -> None:
        run_id = spec.run_id
        if spec.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be at least 1")
        if not run_id.isalnum() or not run_id.isascii():
            raise ValueError(f"run_id must be ASCII letters and digits, got {run_id!r}")
        self._run_id = run_id
        tag_tokens = estimate_text_tokens(self._tag(0))
        fixed_tokens = estimate_text_tokens(_INSTRUCTION) + tag_tokens
        filler = _filler_text(max(spec.prompt_tokens - fixed_tokens, 0))
        if spec.shared_prefix:
            content = f"{_INSTRUCTION} {filler} {_TAG_SLOT}" if filler else f"{_INSTRUCTION} {_TAG_SLOT}"
        else:
            content = f"{_TAG_SLOT} {_INSTRUCTION} {filler}" if filler else f"{_TAG_SLOT} {_INSTRUCTION}"
        body: dict[str, object] = {
            "model": spec.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": spec.max_tokens,
            "stream": spec.stream,
        }
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        encoded = orjson.dumps(body)
        slot = orjson.dumps(_TAG_SLOT)[1:-1]  # the slot as it appears inside a JSON string
        self._head, self._tail = encoded.split(slot)
        self.prompt_tokens_estimate = estimate_text_tokens(content.replace(_TAG_SLOT, self._tag(0)))

    def body(self, index: int) -> bytes:
        """The JSON body of request ``index``."""
        return b"".join((self._head, self._tag(index).encode(), self._tail))

    def _tag(self, index: int) -> str:
        # ASCII letters, digits and spaces only: needs no JSON escaping when spliced in.
        return f"[bench {self._run_id} request {index}]"


def _filler_text(target_tokens: int) -> str:
    """Deterministic word salad of about ``target_tokens`` estimated tokens."""
    if target_tokens <= 0:
        return ""
    rng = random.Random(target_tokens)
    words: list[str] = []
    text = ""
    # Grow geometrically until the estimate is reached, then binary-search the word count.
    while estimate_text_tokens(text) < target_tokens:
        words.extend(rng.choice(_WORDS) for _ in range(max(len(words), 64)))
        text = " ".join(words)
    low, high = 1, len(words)
    while low < high:
        middle = (low + high) // 2
        if estimate_text_tokens(" ".join(words[:middle])) >= target_tokens:
            high = middle
        else:
            low = middle + 1
    return " ".join(words[:low])
