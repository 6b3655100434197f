"""Where a ``[state] redis_url`` points: ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]``,
``rediss://...`` (TLS) and ``unix://[[USER]:PASSWORD@]PATH[?db=DB]``, read without I/O so
the config loader can check the URL and the RESP client (:mod:`latgate.live.store.resp`)
can connect to it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisAddress:
    """Where a Redis URL (see the module docstring) points and how to log in."""

    host: str
    port: int
    db: int
    tls: bool
    unix_path: str | None
    username: str | None
    password: str | None

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """``url`` read as the module docstring says.

        Raises:
            ValueError: what is wrong with it, in words that never repeat the URL
                (it may carry a password).
        """
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError("its port is not a number from 1 to 65535")
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// URL needs the socket's path")
            db = parse_qs(parts.query).get("db", ["0"])[0]
        else:
            db = parts.path.strip("/") or "0"
        if not db.isascii() or not db.isdigit():
            raise ValueError("its database (the part after the port's /) is not a number")
        return cls(
            host=parts.hostname or "localhost",
            port=port or DEFAULT_PORT,
            db=int(db),
            tls=parts.scheme == "rediss",
            unix_path=parts.path if parts.scheme == "unix" else None,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )
