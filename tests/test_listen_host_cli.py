"""``[server] host`` through the real CLI: a value no machine can listen on is a config
error in ``latgate check`` and ``latgate serve`` alike (not a bind failure at start);
whether this machine could listen on a valid one (a name that resolves, an address of
its own) is a ``check`` warning. The offline runs are in a network namespace of their
own (``unshare``: only a loopback, so no packet leaves and DNS fails at once)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROVIDER = '[providers.a]\napi_base = "http://127.0.0.1:9/v1"\n'
OFFLINE = ["unshare", "--user", "--map-root-user", "--net"]


def write_config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nhost = "{host}"\n' + PROVIDER)
    return config


def latgate(*args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    command = [*(OFFLINE if offline else []), sys.executable, "-m", "latgate", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _offline_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*OFFLINE, "true"], capture_output=True, check=False).returncode == 0


offline_only = pytest.mark.skipif(
    not _offline_works(), reason="needs unshare --user --net (a network namespace)"
)


@pytest.mark.parametrize(
    ("host", "message", "fix"),
    [
        ("999.1.1.1", '"999.1.1.1" is not an IPv4 address (4 numbers from 0 to 255', 'host = "127.0.0.1"'),
        ("127.1", '"127.1" is not an IPv4 address', 'host = "127.0.0.1"'),
        ("::g", '"::g" is not an IPv6 address', 'host = "::1"'),
        (
            "0.0.0.0:8000",
            '"0.0.0.0:8000" includes a port',
            'give the port its own key: host = "0.0.0.0", port = 8000',
        ),
        (
            "http://127.0.0.1:8000",
            "is a URL, not an address",
            'write only the address: host = "127.0.0.1", port = 8000',
        ),
        ("[::1]", '"[::1]" has brackets', 'write it without brackets: host = "::1"'),
        (
            "224.0.0.1",
            "is a multicast address, which no TCP client can connect to",
            '"0.0.0.0" (every interface)',
        ),
        ("gw..internal", "is neither an IP address nor a host name", "letters, digits and"),
        (" 127.0.0.1", "has spaces in it", 'write host = "127.0.0.1"'),
    ],
)
def test_check_refuses_a_host_no_machine_can_listen_on(tmp_path, host, message, fix) -> None:
    config = write_config(tmp_path, host)
    result = latgate("check", "--config", str(config))
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"latgate: error: {config}:2: server.host: "), line
    assert message in line and fix in line, line


def test_serve_refuses_an_invalid_host_as_a_config_error_before_binding(tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nhost = "999.1.1.1"\nport = 70000\n' + PROVIDER)  # and a second mistake
    check = latgate("check", "--config", str(config))
    serve = latgate("serve", "--config", str(config))
    assert serve.returncode == 1
    assert "cannot listen" not in serve.stderr and "Traceback" not in serve.stderr
    errors = [line for line in serve.stderr.splitlines() if line.startswith("latgate: error: ")]
    assert errors == check.stderr.splitlines()
    assert [line.split(": ")[3] for line in errors[:-1]] == ["server.host", "server.port"]


def test_check_warns_when_a_valid_address_is_not_one_of_this_machine(tmp_path) -> None:
    result = latgate("check", "--config", str(write_config(tmp_path, "192.0.2.1")))  # TEST-NET-1 (RFC 5737)
    assert result.returncode == 0, result.stderr
    assert (
        "  server.host 192.0.2.1 is not an address of this machine (Cannot assign requested address): "
        "latgate serve here cannot listen on it (fine if this config is for another machine"
    ) in result.stdout
    assert "reachable from other machines" not in result.stdout
    other = latgate("check", "--config", str(write_config(tmp_path, "0.0.0.0")))  # one it listens on
    assert "server.host 0.0.0.0 is reachable from other machines and [auth] is absent" in other.stdout


@offline_only
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "0.0.0.0", "::"])
def test_check_of_localhost_and_ip_literals_needs_no_dns(tmp_path, host) -> None:
    result = latgate("check", "--config", str(write_config(tmp_path, host)), offline=True)
    assert result.returncode == 0, result.stderr
    assert f"server   {host}:8000   auth: none" in result.stdout
    assert "does not resolve" not in result.stdout and "not an address of this machine" not in result.stdout


@offline_only
def test_check_says_a_host_name_that_does_not_resolve_will_not_serve_here(tmp_path) -> None:
    result = latgate("check", "--config", str(write_config(tmp_path, "gw.example.invalid")), offline=True)
    assert result.returncode == 0, result.stderr  # the name may resolve where the config is deployed
    assert "server   gw.example.invalid:8000   auth: none" in result.stdout
    assert "  server.host gw.example.invalid does not resolve on this machine (" in result.stdout
    assert (
        "latgate serve here cannot listen on it (fine if this config is for another machine)" in result.stdout
    )
    assert "reachable from other machines" not in result.stdout  # it is reachable from nowhere here


def _hosts_file_name() -> str | None:
    """A name /etc/hosts maps to 127.0.0.1, other than localhost (found without DNS)."""
    hosts = Path("/etc/hosts")
    for line in hosts.read_text().splitlines() if hosts.exists() else []:
        address, *names = line.split("#", 1)[0].split() or [""]
        if address == "127.0.0.1":
            found = [name for name in names if name != "localhost" and not name.startswith("localhost.")]
            if found:
                return found[0]
    return None


@offline_only
@pytest.mark.skipif(_hosts_file_name() is None, reason="/etc/hosts names no host for 127.0.0.1 but localhost")
def test_check_says_what_a_host_name_resolves_to(tmp_path) -> None:
    name = _hosts_file_name()
    result = latgate("check", "--config", str(write_config(tmp_path, name)), offline=True)
    assert result.returncode == 0, result.stderr
    assert f"server   {name}:8000 (resolves to 127.0.0.1)   auth: none" in result.stdout
    assert "does not resolve" not in result.stdout and "not an address of this machine" not in result.stdout
