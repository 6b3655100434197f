"""Which model name a provider is sent for the name a client asked for, when no
``[aliases]`` entry says (see :mod:`latgate.routing.decision` for the whole rule).

Names match exactly: a provider serves the names it lists (or any name when it lists
none). A configured rule that sends a request to a provider listing exactly one model
(long context, latency-sensitive, a policy's ``route_to``, a fallback, an override) may
send it that model instead only when both name the same model: equal after
lower-casing, dropping an ``org/`` prefix and then a leading vendor word
(``llama-3-8b-instruct`` and ``meta-llama/Meta-Llama-3-8B-Instruct``). A name that adds
words (``-instruct``, ``-mini``) or changes a number is another model.
"""

from __future__ import annotations

import difflib

from latgate.foundation.config.schema import ProviderConfig

#: organisation words that lead some served names without naming the model
#: (``meta-llama/Meta-Llama-3-8B``, ``google/Google-Gemma``); model families
#: (``qwen``, ``mistral``, ``deepseek``) are not in it: they are part of the name
VENDOR_WORDS = ("meta", "google", "microsoft", "nvidia", "ibm", "openai", "anthropic", "alibaba", "amazon", "apple")


def upstream_model(provider: ProviderConfig, public: str) -> str | None:
    """``public`` when ``provider`` serves that exact name (lists it, or lists none), else None."""
    return public if provider.serves(public) else None


def rule_model(provider: ProviderConfig, public: str) -> str | None:
    """The model ``provider`` is sent for ``public`` when a configured rule sends it the
    request and no alias says: the exact name when it serves it, else its single
    model when that is the same model (:func:`same_model`), else None (the rule is
    skipped)."""
    if provider.serves(public):
        return public
    if len(provider.models) == 1 and same_model(public, provider.models[0]):
        return provider.models[0]
    return None


def model_key(name: str) -> str:
    """``name`` lower-cased, without an ``org/`` prefix and a leading vendor word
    (``meta-llama/Meta-Llama-3-8B-Instruct`` -> ``llama-3-8b-instruct``)."""
    key = name.rsplit("/", 1)[-1].lower()
    for vendor in VENDOR_WORDS:
        if key.startswith(vendor) and key[len(vendor) : len(vendor) + 1] in ("-", "_") and len(key) > len(vendor) + 1:
            return key[len(vendor) + 1 :]
    return key


def same_model(public: str, served: str) -> bool:
    """True when ``public`` and ``served`` name the same model (equal :func:`model_key`)."""
    return model_key(public) == model_key(served)


def near_model(public: str, served: list[str]) -> str | None:
    """The served name a 404 suggests for ``public``: one naming the same model
    (:func:`same_model`), else the closest spelling (``difflib``, ratio >= 0.6, on the
    :func:`model_key` forms: ``glm-5`` -> ``glm-5.1``), else None. For the message
    only: a near name is never routed to."""
    same = [name for name in served if same_model(public, name)]
    if same:
        return same[0]
    keys = {model_key(name): name for name in reversed(served)}
    close = difflib.get_close_matches(model_key(public), list(keys), n=1, cutoff=0.6)
    return keys[close[0]] if close else None


def skipped_note(provider: ProviderConfig, public: str) -> str:
    """Why a rule could not send ``public`` to ``provider``, for ``notes``: it serves
    other names (its single model, when it has one, is another model)."""
    if len(provider.models) == 1:
        return f"provider {provider.name} does not serve model {public!r} ({provider.models[0]!r} is another model)"
    return f"provider {provider.name} does not serve model {public!r}"
