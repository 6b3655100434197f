"""What a message may show of a config value: URLs without their password or query
values, and no value that looks like a key.

Config errors (:class:`~latgate.foundation.config.errors.ConfigError`), config warnings and
``latgate check`` pass their text through :func:`mask_secrets`, so a key pasted where a
variable name belongs (``api_key_env = "sk-..."``) or into any other value is never
echoed whole.
"""

from __future__ import annotations

import re

_USERINFO_PASSWORD = re.compile(r"(?<=//)([^/?#@:]*):[^/?#@]*@")

#: prefixes of the keys providers and code hosts issue (OpenAI/Anthropic ``sk-``,
#: Stripe-style ``sk_``/``rk_``, Groq ``gsk_``, xAI ``xai-``, Google ``AIza``, GitHub
#: ``ghp_``/``github_pat_``..., Hugging Face ``hf_``, Slack ``xox?-``, GitLab
#: ``glpat-``, AWS ``AKIA``, a JWT's ``eyJ``)
KEY_PREFIXES = (
    "sk-", "sk_", "rk_", "pk_", "gsk_", "xai-", "AIza", "ghp_", "gho_", "ghs_", "ghu_",
    "github_pat_", "hf_", "xoxa-", "xoxb-", "xoxp-", "xoxr-", "glpat-", "AKIA", "eyJ",
)  # fmt: skip
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{7,}")
_RUN = re.compile(r"[A-Za-z0-9]{20,}")
_MIN_AFTER_PREFIX = 8


def mask_url(url: str) -> str:
    """``url`` as it may be shown in a message: the password of its ``user:password@``
    part and every query value replaced by ``***`` (some providers take their key in
    the query, as ``?key=...``).

    Works on malformed URLs too (it is used in error messages), e.g.
    ``http://u:secret@h:1/v1?key=abc`` -> ``http://u:***@h:1/v1?key=***``.
    """
    url = _USERINFO_PASSWORD.sub(r"\1:***@", url)
    head, sep, query = url.partition("?")
    if not sep:
        return url
    query, hash_sep, _ = query.partition("#")
    masked = "&".join(item.split("=", 1)[0] + "=***" if "=" in item else "***" for item in query.split("&"))
    return f"{head}?{masked}{hash_sep and '#***'}"


def looks_like_secret(token: str) -> bool:
    """True when ``token`` (one word, no spaces) looks like a key rather than a name.

    Either a known key prefix (:data:`KEY_PREFIXES`) followed by at least 8 more
    characters (``sk-proj-Ab12...``), or a run of 20+ letters and digits without a
    separator that mixes digits with upper and lower case letters, or is 32+ long and
    mixes digits and letters (``Xk9...``, a hex token). Names people write (model
    names such as ``Meta-Llama-3-8B-Instruct``, variable names such as
    ``TAOTOKEN_API_KEY``, endpoint ids, URLs) are made of short segments and pass.
    """
    for prefix in KEY_PREFIXES:
        if token.startswith(prefix) and len(token) - len(prefix) >= _MIN_AFTER_PREFIX:
            return True
    for run in _RUN.findall(token):
        digits = any(c.isdigit() for c in run)
        upper = any(c.isupper() for c in run)
        lower = any(c.islower() for c in run)
        if digits and upper and lower:
            return True
        if digits and (upper or lower) and len(run) >= 32:
            return True
    return False


def mask_secret(token: str) -> str:
    """``token`` shortened to what may be shown: its key prefix (or first 3 characters)
    and ``***``: ``sk-proj-abc123...`` -> ``sk-***``."""
    prefix = next((p for p in KEY_PREFIXES if token.startswith(p)), token[:3])
    return prefix + "***"


def mask_secrets(text: str) -> str:
    """``text`` with every word that :func:`looks_like_secret` replaced by
    :func:`mask_secret`'s form; anything else unchanged.

    Example: ``'"sk-live-4eC39HqLyjWDarjtT1zdp7dc" is not an environment variable
    name'`` -> ``'"sk-***" is not an environment variable name'``.
    """
    return _TOKEN.sub(lambda m: mask_secret(m.group()) if looks_like_secret(m.group()) else m.group(), text)
