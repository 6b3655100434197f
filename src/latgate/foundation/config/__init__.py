"""Configuration: config.toml (a provider table or pool sections) -> one frozen :class:`Config`.

Public API:

- :func:`load_config` / :func:`load_config_text`: parse, expand ``${VAR}``, validate;
  raise :class:`ConfigError` holding every mistake of the file (each: file:line, key, fix).
- :func:`config_warnings`: problems that do not stop start-up (unset key variables,
  no auth on a public address).
- :func:`resolve_config_path`: ``--config``, else ``$LATGATE_CONFIG``, else
  ``./config.toml``.
"""

from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.loader import load_config, load_config_text, resolve_config_path
from latgate.foundation.config.schema import Config
from latgate.foundation.config.warnings import config_warnings

__all__ = [
    "Config",
    "ConfigError",
    "config_warnings",
    "load_config",
    "load_config_text",
    "resolve_config_path",
]
