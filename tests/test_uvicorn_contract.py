"""The parts of uvicorn's private httptools protocol that ``latgate.app.httplimits`` relies on
are the ones it was written against.

``BoundedHttpToolsProtocol`` subclasses ``uvicorn.protocols.http.httptools_impl
.HttpToolsProtocol``, replaces ``data_received`` and ``send_400_response`` wholesale,
extends several parser callbacks, reads about ten private members and swaps the class of
a live ``RequestResponseCycle`` for HTTP/1.0 clients (``app/http10.py``). None of that is uvicorn's public
API, so ``pyproject.toml`` pins uvicorn to the range these checks were audited on, and
this module fails loudly, naming what moved, when an installed uvicorn differs:

- every member latgate calls or reads still exists;
- the methods latgate replaces or whose internals it depends on have the source they
  had when ``app/httplimits.py`` was last checked against them (a SHA-256 of each method's
  dedented source). A mismatch means: read the new uvicorn method, port its change into
  ``app/httplimits.py`` if latgate's override must follow it, run ``tests/test_client_limits.py``
  and ``tests/test_http10_clients.py``, then record the new digest here and widen the pin.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import textwrap
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from latgate.app import httplimits

ROOT = Path(__file__).resolve().parents[1]

#: (class, method) -> SHA-256 prefix of its dedented source in uvicorn 0.54.0
AUDITED_SOURCES = {
    ("HttpToolsProtocol", "data_received"): "02c2572f1df55907",  # replaced wholesale
    ("HttpToolsProtocol", "send_400_response"): "0b0d3ace8d263788",  # replaced wholesale
    ("HttpToolsProtocol", "on_headers_complete"): "7e259152e5aade71",  # builds self.cycle, swapped for HTTP/1.0
    ("HttpToolsProtocol", "on_message_complete"): "377f9122ee6f3ab8",
    ("HttpToolsProtocol", "connection_made"): "ba1915817ccf6c1b",  # sets self.connections, self.flow
    ("HttpToolsProtocol", "_unset_keepalive_if_required"): "58f4ffce604d92dd",
    ("RequestResponseCycle", "send"): "cfc84491029529db",  # app/http10.py Http10Cycle.send frames around it
}

#: members of the protocol latgate's code reads or calls (besides the methods above)
PROTOCOL_MEMBERS = (
    "_should_upgrade",
    "handle_websocket_upgrade",
    "_unsupported_upgrade_warning",
    "on_message_begin",
    "on_url",
    "on_header",
    "pause_writing",
    "resume_writing",
    "connection_lost",
)
#: attributes ``HttpToolsProtocol`` must set for latgate (``self.X = `` in its code)
PROTOCOL_ATTRIBUTES = ("connections", "loop", "cycle", "flow", "scope", "url", "parser", "transport")
#: attributes of a ``RequestResponseCycle`` latgate reads or writes
CYCLE_ATTRIBUTES = (
    "more_body",
    "scope",
    "response_started",
    "disconnected",
    "message_event",
    "chunked_encoding",
    "expected_content_length",
)

_CLASSES = {"HttpToolsProtocol": HttpToolsProtocol, "RequestResponseCycle": RequestResponseCycle}


def _digest(cls_name: str, method: str) -> str:
    source = textwrap.dedent(inspect.getsource(getattr(_CLASSES[cls_name], method)))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _assigned_attributes(cls: type) -> set[str]:
    source = inspect.getsource(cls)
    return set(re.findall(r"self\.([a-z_]+)(?:\s*:[^=\n]+)?\s*=[^=]", source))


@pytest.mark.parametrize(("cls_name", "method"), sorted(AUDITED_SOURCES))
def test_the_uvicorn_methods_latgate_overrides_are_the_audited_ones(cls_name: str, method: str) -> None:
    found = _digest(cls_name, method)
    assert found == AUDITED_SOURCES[(cls_name, method)], (
        f"uvicorn {version('uvicorn')} changed {cls_name}.{method} (source digest {found}): "
        "latgate.app.httplimits overrides or depends on it; read the new method, port the change, "
        "then update AUDITED_SOURCES and the uvicorn pin in pyproject.toml"
    )


def test_every_protocol_member_latgate_calls_still_exists() -> None:
    missing = [name for name in PROTOCOL_MEMBERS if not callable(getattr(HttpToolsProtocol, name, None))]
    assert not missing, f"uvicorn {version('uvicorn')} HttpToolsProtocol lost {missing} (latgate.app.httplimits calls them)"


def test_the_protocol_and_cycle_still_set_the_attributes_latgate_reads() -> None:
    protocol_missing = set(PROTOCOL_ATTRIBUTES) - _assigned_attributes(HttpToolsProtocol)
    cycle_missing = set(CYCLE_ATTRIBUTES) - _assigned_attributes(RequestResponseCycle)
    assert not protocol_missing and not cycle_missing, (
        f"uvicorn {version('uvicorn')} no longer sets HttpToolsProtocol.{sorted(protocol_missing)} "
        f"/ RequestResponseCycle.{sorted(cycle_missing)}, which latgate.app.httplimits reads"
    )


def test_latgate_overrides_only_the_methods_audited_here() -> None:
    """A new override in app/httplimits.py must be audited (and listed) too."""
    overridden = {
        name
        for name, value in vars(httplimits.BoundedHttpToolsProtocol).items()
        if callable(value) and hasattr(HttpToolsProtocol, name) and not name.startswith("__")
    }
    audited = {method for cls_name, method in AUDITED_SOURCES if cls_name == "HttpToolsProtocol"}
    assert overridden - audited - set(PROTOCOL_MEMBERS) == set()


def test_pyproject_pins_uvicorn_to_the_audited_minor_release() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [dep for dep in dependencies if dep.startswith("uvicorn")]
    assert pin == "uvicorn>=0.54,<0.55"
    assert version("uvicorn").startswith("0.54.")
