"""Container health check for latgate and its simulators (slim images have no curl).

Usage: python healthcheck.py [URL]

GETs URL and exits 0 on HTTP 200, 1 on anything else (refused, timeout, other status,
a config it cannot read), printing one line either way. Without URL: the
``$LATGATE_HEALTHCHECK_URL``, else ``/healthz`` at the address the gateway serves, read
the way ``latgate serve`` reads it: ``--config``/``--host``/``--port`` from the
container's entrypoint command line (process 1, when it is ``latgate serve``), else the
config file (``$LATGATE_CONFIG``, else ``./config.toml``) loaded by latgate's own loader
(so ``${VAR}`` references and both config shapes mean what they mean to the gateway).
A wildcard host (``0.0.0.0``, ``::``, empty) is probed on loopback (``127.0.0.1``,
``::1``). The HTTP part is standard library only; latgate is imported only to read the
config (the image's virtualenv has it).
"""

import argparse
import os
import sys
import urllib.error
import urllib.request

TIMEOUT_SECONDS = 3.0
ENTRYPOINT_CMDLINE = "/proc/1/cmdline"
_WILDCARD_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def serve_arguments(cmdline: list[str]) -> list[str]:
    """The arguments after ``serve`` when ``cmdline`` (a process's argv) is ``latgate
    serve ...`` (``latgate`` by any path, or ``python -m latgate``), else ``[]``."""
    for i, word in enumerate(cmdline[:-1]):
        if os.path.basename(word) == "latgate" and cmdline[i + 1] == "serve":
            return cmdline[i + 2 :]
    return []


def _entrypoint_cmdline() -> list[str]:
    try:
        with open(ENTRYPOINT_CMDLINE, "rb") as cmdline:
            raw = cmdline.read()
    except OSError:
        return []
    return [word.decode("utf-8", "replace") for word in raw.split(b"\0") if word]


def served_url(arguments: list[str]) -> str:
    """``http://HOST:PORT/healthz`` for a gateway started as ``latgate serve
    ARGUMENTS``: ``--host``/``--port`` when given, else the config's ``[server]``.

    Raises:
        latgate.foundation.config.ConfigError: the config file cannot be read or has mistakes.
    """
    from latgate.foundation.config.loader import load_config, resolve_config_path

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    known, _ = parser.parse_known_args(arguments)
    host, port = known.host, known.port
    if not host or port is None:
        server = load_config(resolve_config_path(known.config)).server
        host, port = host or server.host, server.port if port is None else port
    host = _WILDCARD_HOSTS.get(host, host)
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}/healthz"


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else os.environ.get("LATGATE_HEALTHCHECK_URL")
    if not url:
        try:
            url = served_url(serve_arguments(_entrypoint_cmdline()))
        except Exception as error:  # noqa: BLE001 - a config the gateway cannot read either: unhealthy, said why
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(f"unhealthy: cannot read the gateway's address from its config: {reason}")
            return 1
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        print(f"unhealthy: {url}: {getattr(error, 'reason', error)}")
        return 1
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}")
        return 1
    print(f"healthy: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
