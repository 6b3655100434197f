"""Which model name a provider is sent for the name a client asked for, when no
``[aliases]`` entry says (see :mod:`latgate.routing.decision` for the whole rule)."""

from __future__ import annotations

import re

from latgate.config.schema import ProviderConfig

_NAME_WORDS = re.compile(r"[a-z]+|[0-9]+")


def upstream_model(provider: ProviderConfig, public: str, *, listed: bool) -> str | None:
    """The model ``provider`` is sent for ``public`` without an explicit alias, or None.

    ``listed``: some provider lists ``public`` or an alias defines it, so it names a
    known model that a single-model provider must not silently replace.
    """
    if provider.serves(public):
        return public
    if len(provider.models) == 1 and (not listed or same_model_family(public, provider.models[0])):
        return provider.models[0]
    return None


def same_model_family(public: str, served: str) -> bool:
    """True when every word of ``public`` is a word of ``served`` (org prefix, case ignored)."""
    public_words = set(_NAME_WORDS.findall(public.rsplit("/", 1)[-1].lower()))
    served_words = set(_NAME_WORDS.findall(served.rsplit("/", 1)[-1].lower()))
    return bool(public_words) and public_words <= served_words
