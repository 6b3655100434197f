"""``latgate check`` run as a user runs it: a subprocess, exit codes, stdout/stderr."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from servers import serve_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tls_upstreams import private_ca

ACCEPTANCE = Path(__file__).parent / "fixtures" / "acceptance"
KEY_VARS = ("TAOTOKEN_API_KEY", "SGLANG_LOCAL_KEY", "SGLANG_TILELANG_KEY", "LATGATE_CONFIG", "POOL_KEY")


def run_check(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    base_env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    return subprocess.run(
        [sys.executable, "-m", "latgate", "check", *args],
        check=False,  # callers assert the exit code
        capture_output=True,
        text=True,
        env={**base_env, **(env or {})},
        cwd=cwd,
        timeout=60,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_on_provider_table_shows_providers_routes_and_warns_for_unset_key_variables():
    result = run_check("--config", str(ACCEPTANCE / "provider-table.config.toml"), env={"SGLANG_LOCAL_KEY": "k"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in (
        "taotoken",
        "sglang_local",
        "sglang_tilelang",
        "https://taotoken.net/api",
        "top_k, repetition_penalty",
        "prompt > 16384 tokens -> sglang_tilelang",
    ):
        assert text in out
    assert re.search(r"default +-> taotoken", out)
    aliases = out.split("\naliases\n", 1)[1].split("\n\n", 1)[0]  # the name mapping is where users look
    assert re.fullmatch(
        r"  llama-3-8b-instruct +sglang_local: meta-llama/Meta-Llama-3-8B-Instruct, "
        r"sglang_tilelang: meta-llama/Meta-Llama-3-8B-Instruct \(its own name for the same model, .*\)",
        aliases,
    ), aliases
    assert "rules map" not in out and "names of the same model" not in out
    assert 'provider "taotoken": api_key_env TAOTOKEN_API_KEY is not set' in out
    assert 'provider "sglang_tilelang": api_key_env SGLANG_TILELANG_KEY is not set' in out
    assert 'provider "sglang_local": api_key_env' not in out


def test_check_says_where_a_failed_request_goes_when_no_fallbacks_are_set():
    result = run_check("--config", str(ACCEPTANCE.parent / "pool-sections.with-addresses.config.toml"))
    assert result.returncode == 0, result.stderr
    (fallbacks,) = [line for line in result.stdout.splitlines() if line.lstrip().startswith("fallbacks ")]
    assert "retried on its own provider (max_retries 1), then with its [models] fallback_model" in fallbacks
    assert "no other provider is tried ([routing] fallbacks unset)" in fallbacks
    assert 'fallbacks = { "vllm" = ["upstream"] }' in result.stdout
    bundled = run_check("--config", str(Path(__file__).parent.parent / "config.toml"))
    assert "then: tile-rt -> vllm -> taotoken; vllm -> taotoken" in bundled.stdout


def test_check_of_the_bundled_config_says_its_loopback_upstream_may_need_no_key():
    bundled = run_check("--config", str(Path(__file__).parent.parent / "config.toml"))
    assert bundled.returncode == 0, bundled.stderr
    (warning,) = [line for line in bundled.stdout.splitlines() if "TAOTOKEN_API_KEY is not set" in line]
    assert "its endpoints are on this machine, so fine for latgate demo's simulators" in warning
    assert "expect 401" not in warning
    remote = run_check("--config", str(Path(__file__).parent.parent / "config.toml"), env={"TAOTOKEN_API_BASE": "https://taotoken.net/api"})
    assert 'provider "taotoken": api_key_env TAOTOKEN_API_KEY is not set; requests to it will be sent without a key (expect 401' in remote.stdout


def test_check_on_pool_sections_verbatim_names_both_missing_addresses_in_one_run():
    result = run_check("--config", str(ACCEPTANCE / "pool-sections.config.toml"))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith("latgate: error: ") for line in lines)
    assert 'pool-sections.config.toml:13: decode.api_base: section [decode] (engine "tile-rt") gives no address' in lines[0]
    assert 'pool-sections.config.toml:19: prefill.api_base: section [prefill] (engine "vllm") gives no address' in lines[1]
    assert lines[2].endswith("2 errors in " + str(ACCEPTANCE / "pool-sections.config.toml"))
    assert "Traceback" not in result.stderr


def test_route_clients_serve_and_demo_also_name_every_missing_address(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[providers.a]\nmodels = ["m"]\n[providers.b]\napi_base = "http://127.0.0.1:9/v1"\n[providers.c]\n')
    body = tmp_path / "request.json"
    body.write_text('{"model": "m", "messages": []}')
    for command in (
        ["route", "--config", str(config), str(body)],
        ["clients", "cline", "--config", str(config)],
        ["serve", "--config", str(config)],
        ["demo", "--config", str(config)],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "latgate", *command], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 1
        lines = result.stderr.splitlines()
        assert all(line.startswith("latgate: error: ") for line in lines), (command[0], lines)
        assert [line.split(": ")[3] for line in lines[:-1]] == ["providers.a.api_base", "providers.c.api_base"], lines
        assert lines[-1] == f"latgate: error: 2 errors in {config}", lines


@pytest.mark.parametrize(
    ("section", "line", "fix"),
    [
        ("server", 'port = "http"', "e.g. port = 8000"),
        ("server", "port = 70000", "e.g. port = 8000"),
        ("defaults", 'max_retries = "twice"', "e.g. max_retries = 1"),
        ("defaults", "timeout_sec = true", "e.g. timeout_sec = 600"),
        ("defaults", "connect_timeout_sec = 0", "e.g. connect_timeout_sec = 5"),
        ("health", "latency_factor = 0.5", "e.g. latency_factor = 3"),
        ("routing", 'latency_threshold_ms = "fast"', "e.g. latency_threshold_ms = 200"),
        ("providers.p", "max_batch_size = 0", "e.g. max_batch_size = 8"),
        ("providers.p", 'timeout_sec = "long"', "e.g. timeout_sec = 600"),
        ("providers.p", "prefix_cache_tokens = 0", "e.g. prefix_cache_tokens = 262144"),
    ],
)
def test_number_errors_suggest_a_value_that_fits_the_key(tmp_path, section, line, fix):
    provider = "" if section == "providers.p" else '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n'
    address = 'api_base = "http://127.0.0.1:9/v1"\n' if section == "providers.p" else ""
    config = tmp_path / "config.toml"
    config.write_text(f"{provider}[{section}]\n{address}{line}\n")
    result = run_check("--config", str(config))
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith(fix), result.stderr


KEY = "sk-proj-4eC39HqLyjWDarjtT1zdp7dcXk29"
ENV_NAME_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
_UP = '[providers.up]\napi_base = "http://127.0.0.1:9/v1"\n'


@pytest.mark.parametrize(
    ("text", "env", "code"),
    [
        (f'[providers.up]\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = "{KEY}"\n', {}, 1),
        (f'[providers.up]\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = "{ENV_NAME_KEY}"\n', {}, 1),
        (f'{_UP}timeout_sec = "{KEY}"\n', {}, 1),
        (f'{_UP}"{KEY}" = 1\n', {}, 1),
        (f'{_UP}[[auth.keys]]\nname = "team"\nkey = "k"\nrpm = "{KEY}"\n', {}, 1),
        (f'{_UP}models = ["{KEY}"]\nhints = {{ token = "{KEY}" }}\n', {}, 0),
        (_UP, {"HTTPS_PROXY": f"socks5://{KEY}"}, 0),
    ],
    ids=["api_key_env", "api_key_env-valid-name", "wrong-type", "key-name", "auth", "check-report", "warning"],
)
def test_values_that_look_like_keys_are_masked_in_every_message(tmp_path, text, env, code):
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = run_check("--config", str(config), env=env)
    assert result.returncode == code, result.stdout + result.stderr
    shown = result.stdout + result.stderr
    assert KEY not in shown and ENV_NAME_KEY not in shown and KEY[8:20] not in shown
    assert "sk-***" in shown or "sk_***" in shown, shown


def test_serve_masks_a_key_in_its_config_error(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[providers.up]\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = "{KEY}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "latgate", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert KEY not in result.stdout + result.stderr and '"sk-***" is not an environment variable name' in result.stderr


def test_check_reads_latgate_config_when_no_flag_is_given(tmp_path):
    result = run_check(env={"LATGATE_CONFIG": str(ACCEPTANCE / "provider-table.config.toml")}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sglang_tilelang" in result.stdout


def test_check_without_any_config_file_is_a_one_line_error(tmp_path):
    result = run_check(cwd=tmp_path)
    assert result.returncode == 1
    assert (
        result.stderr == "latgate: error: config.toml: file: no such file; "
        "create it, pass --config PATH or set $LATGATE_CONFIG\n"
    )


def test_probe_reports_ok_and_sends_the_provider_key_without_printing_it(tmp_path):
    seen_auth: list[str | None] = []

    async def models(request: Request) -> JSONResponse:
        seen_auth.append(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": []})

    app = Starlette(routes=[Route("/v1/models", models)])
    with serve_app(app) as base_url, serve_app(app) as other_url:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[providers.pool]\nendpoints = ["{base_url}", "{other_url}/v1/"]\napi_key_env = "POOL_KEY"\n'
        )
        result = run_check("--config", str(config), "--probe", env={"POOL_KEY": "sk-secret-123"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert seen_auth == ["Bearer sk-secret-123", "Bearer sk-secret-123"]
    probe_lines = result.stdout.split("\nprobe\n")[1].splitlines()
    assert [line.split()[:2] for line in probe_lines] == [["ok", "pool-0"], ["ok", "pool-1"]]
    assert "sk-secret-123" not in result.stdout + result.stderr


def test_probe_of_a_closed_port_fails_with_exit_code_2(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[providers.gone]\napi_base = "http://127.0.0.1:{closed_port()}/v1"\n')
    result = run_check("--config", str(config), "--probe")
    assert result.returncode == 2
    assert "failed  gone-0" in result.stdout
    assert "Traceback" not in result.stderr


def test_a_latency_threshold_without_a_provider_to_route_to_is_a_warning_in_check_and_serve(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[providers.bulk]\napi_base = "http://127.0.0.1:9/v1"\n[providers.fast]\napi_base = "http://127.0.0.1:9/v1"\n'
        'role = "decode"\n'
        "[routing]\ndefault_route = \"bulk\"\nlatency_threshold_ms = 200\n[health]\nprobe_interval_sec = 0\n"
    )
    expected = (
        "routing.latency_threshold_ms = 200 is set without routing.route_latency_sensitive_to: requests it marks "
        'latency-sensitive (X-Latency-Budget-Ms <= 200) stay on default_route "bulk"; add '
        'route_latency_sensitive_to = "fast" under [routing] to send them to the low-latency decode pool (role = "decode")'
    )
    result = run_check("--config", str(config))
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout.split("\nwarnings\n", 1)[1], result.stdout

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:  # serve warns at start, then stops at the taken port: no server left behind
        serve = subprocess.run(
            [sys.executable, "-m", "latgate", "serve", "--config", str(config), "--port", str(taken.getsockname()[1])],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        taken.close()
    assert serve.returncode == 1 and expected in serve.stderr, serve.stderr

    config.write_text(config.read_text().replace("[routing]\n", '[routing]\nroute_latency_sensitive_to = "fast"\n'))
    assert "latency_threshold_ms" not in run_check("--config", str(config)).stdout.split("\nwarnings\n", 1)[1]


def test_check_shows_tls_only_for_https_endpoints_and_each_replica_s_batch_slots_and_weight(tmp_path):
    ca_file = str(private_ca(tmp_path).ca_file)
    config = tmp_path / "config.toml"
    config.write_text(
        "[providers.local]\nendpoints = [\n"
        '  { url = "http://127.0.0.1:9/v1", max_batch_size = 2, weight = 3 },\n'
        '  "http://127.0.0.1:10/v1",\n]\n'
        '[providers.hosted]\napi_base = "https://api.example.test/v1"\n'
        f'[providers.pinned]\napi_base = "http://127.0.0.1:11/v1"\nca_file = "{ca_file}"\n'
    )
    result = run_check("--config", str(config), env={"SSL_CERT_FILE": ca_file})
    assert result.returncode == 0, result.stderr
    sections = {block.split("   ", 1)[0].strip(): block for block in result.stdout.split("\n\n")}
    local, hosted, pinned = sections["local"], sections["hosted"], sections["pinned"]
    assert "tls" not in local and "SSL_CERT_FILE" not in local, local
    assert re.search(r"endpoint +local-0 .*\n +replica +max_batch_size 2, weight 3\n +endpoint +local-1 ", local), local
    assert local.count("replica") == 1, local
    assert re.search(r"\n +tls +SSL_CERT_FILE\n", hosted), hosted
    assert re.search(rf"\n +tls +ca_file {re.escape(ca_file)} \(unused: every endpoint is http://\)\n", pinned), pinned


def test_every_subcommand_with_a_config_option_calls_its_value_path():
    from latgate.commands.cli import COMMANDS

    shown = {}
    for command in COMMANDS:
        help_text = subprocess.run(
            [sys.executable, "-m", "latgate", command, "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        if "--config" in help_text:
            shown[command] = re.findall(r"--config ([A-Z]+)", help_text)
    assert {"serve", "check", "route", "demo", "clients"} <= set(shown)
    assert all(set(values) == {"PATH"} for values in shown.values()), shown


def test_an_empty_models_list_is_refused_with_the_way_to_serve_any_model(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'{_UP}models = []\n[[auth.keys]]\nname = "ci"\nkey = "k"\nmodels = []\n')
    result = run_check("--config", str(config))
    assert result.returncode == 1 and result.stdout == ""
    providers_line, auth_line, count = result.stderr.splitlines()
    assert providers_line == (
        f"latgate: error: {config}:3: providers.up.models: an empty list names no model, yet a provider without "
        'models serves any model name; list the names it serves, e.g. models = ["Qwen/Qwen2.5-7B-Instruct"], or '
        "remove the key to serve any model"
    )
    assert auth_line == (
        f"latgate: error: {config}:7: auth.keys[0].models: an empty list allows no model, yet a key without models "
        'may use every model; list the models this key may use, e.g. models = ["glm-5.1"], or remove the key to '
        "allow every model"
    )
    assert count == f"latgate: error: 2 errors in {config}"
    config.write_text(_UP)  # no models key: any model
    assert re.search(r"\n    models +any\n", run_check("--config", str(config)).stdout)


@pytest.mark.parametrize("value", ["abc", "99999", "8000.5", ""])
def test_a_variable_number_is_the_number_and_a_non_number_gets_the_range(tmp_path, value):
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nport = "${{GW_PORT}}"\n[defaults]\nmax_retries = "${{RETRIES:-3}}"\n{_UP}')
    accepted = run_check("--config", str(config), env={"GW_PORT": "18791"})
    assert accepted.returncode == 0, accepted.stderr
    assert "server   127.0.0.1:18791   auth: none" in accepted.stdout
    assert "(max_retries 3)" in accepted.stdout
    # a number written in quotes is not one (only a variable's value, always a string, is converted)
    config.write_text(f'[defaults]\nmax_retries = "3"\n{_UP}')
    (line,) = run_check("--config", str(config)).stderr.splitlines()
    assert line.endswith('2: defaults.max_retries: expected a whole number, not a quoted string (got "3"); '
                         "write a whole number from 0 to 10, e.g. max_retries = 1"), line
    config.write_text(f'[server]\nport = "${{GW_PORT}}"\n{_UP}')
    refused = run_check("--config", str(config), env={"GW_PORT": value})
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"latgate: error: {config}:2: server.port: input should be "), line
    assert line.endswith(f'(got "{value}"); write a {"" if value == "99999" else "whole "}number from 0 to 65535, e.g. port = 8000')


# -- rules and fallbacks that can never apply (what check and serve say, per model) -----

#: the README's pairing: two vLLM replicas, an alias, and a hosted provider beside them
README_PAIRING = """
[providers.vllm]
connector = "vllm"
endpoints = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
models = ["meta-llama/Meta-Llama-3-8B-Instruct"]

[aliases]
"llama-3-8b" = "meta-llama/Meta-Llama-3-8B-Instruct"

[providers.openai]
api_base = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4o-mini"]

[health]
probe_interval_sec = 0

[routing]
default_route = "vllm"
"""


def test_each_sub_second_timeout_warning_says_what_that_timeout_does(tmp_path):
    """``timeout_sec`` bounds upstream silence and a non-streamed answer, not the first
    token: its warning says so, and only ``first_token_timeout_sec``'s speaks of first tokens."""
    config = tmp_path / "config.toml"
    config.write_text(
        "[defaults]\ntimeout_sec = 0.5\nfirst_token_timeout_sec = 0.25\n"
        '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\ntimeout_sec = 0.75\n'
    )
    result = run_check("--config", str(config))
    assert result.returncode == 0, result.stderr
    warnings = _section(result.stdout, "warnings").splitlines()
    for key, seconds in (("defaults.timeout_sec", "0.5"), ("providers.p.timeout_sec", "0.75")):
        (line,) = [w for w in warnings if f"{key} = {seconds} s" in w]
        assert "between two reads" in line and "non-streamed answer" in line, line
        assert "first token" not in line, line
    (line,) = [w for w in warnings if "defaults.first_token_timeout_sec = 0.25 s" in w]
    assert "slow first tokens will time out and be retried" in line, line


def _section(out: str, title: str) -> str:
    return out.split(f"\n{title}", 1)[1].split("\n\n", 1)[0]


def _serve_startup(config: Path) -> str:
    """``latgate serve``'s start-up log for ``config`` (it then stops at a taken port)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        serve = subprocess.run(
            [sys.executable, "-m", "latgate", "serve", "--config", str(config), "--port", str(taken.getsockname()[1])],
            capture_output=True, text=True, timeout=60, check=False,
            env={k: v for k, v in os.environ.items() if k not in KEY_VARS},
        )  # fmt: skip
    finally:
        taken.close()
    assert serve.returncode == 1, serve.stderr
    return serve.stderr


def test_check_suggests_only_a_fallback_that_applies_and_warns_about_one_that_cannot(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(README_PAIRING)
    hint = _section(run_check("--config", str(config)).stdout, "routing")
    meta = "meta-llama/Meta-Llama-3-8B-Instruct"
    aliased = f'{{ vllm = "{meta}", openai = "gpt-4o-mini" }}'
    # openai lists another model (gpt-4o-mini): no alias to it is suggested, so no fallback
    assert "to fail over" not in hint and "gpt-4o-mini" not in hint, hint
    acceptance = Path(__file__).parent / "fixtures" / "acceptance" / "provider-table.config.toml"
    hint = _section(run_check("--config", str(acceptance)).stdout, "routing")
    assert "then fails: no other provider is tried" in hint and '"qwen2.5-72b-instruct" = {' not in hint, hint
    # another provider listing the same models under its own spellings: aliased to those
    config.write_text(
        '[providers.a]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["llama-3-8b-instruct", "qwen2.5-72b-instruct"]\n'
        '[providers.b]\napi_base = "http://127.0.0.1:10/v1"\n'
        'models = ["meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen2.5-72B-Instruct"]\n[routing]\ndefault_route = "a"\n'
    )
    hint = _section(run_check("--config", str(config)).stdout, "routing")
    assert '"qwen2.5-72b-instruct" = { a = "qwen2.5-72b-instruct", b = "Qwen/Qwen2.5-72B-Instruct" }' in hint, hint
    config.write_text(README_PAIRING)

    # as the hint used to say: the fallback alone, which openai can never take
    config.write_text(README_PAIRING.replace('default_route = "vllm"', 'default_route = "vllm"\nfallbacks = { "vllm" = ["openai"] }'))
    out = run_check("--config", str(config)).stdout
    assert re.search(r"\n +vllm -> openai: never to meta-llama/Meta-Llama-3-8B-Instruct \(provider openai does not serve", out), out
    (warning,) = [w for w in _section(out, "warnings").splitlines() if "routing.fallbacks.vllm" in w]
    assert "openai can never take over from vllm" in warning and "with vllm down these requests fail" in warning
    assert f'"llama-3-8b" = {aliased}' in warning
    started = _serve_startup(config)
    assert "routing.fallbacks.vllm: openai can never take over from vllm" in started
    assert "fallback vllm -> openai: never to meta-llama/Meta-Llama-3-8B-Instruct" in started

    # with the alias tables the hint named, the fallback applies to every model reaching vllm
    config.write_text(
        README_PAIRING.replace('"llama-3-8b" = "meta-llama/Meta-Llama-3-8B-Instruct"', f'"llama-3-8b" = {aliased}\n"{meta}" = {aliased}')
        .replace('default_route = "vllm"', 'default_route = "vllm"\nfallbacks = { "vllm" = ["openai"] }')
    )
    out = run_check("--config", str(config)).stdout
    assert (
        f"vllm -> openai: applies to {meta} (sent as gpt-4o-mini), llama-3-8b (sent as gpt-4o-mini)"
    ) in _section(out, "routing"), out
    assert "routing.fallbacks" not in _section(out, "warnings")


def test_check_warns_that_a_long_context_rule_to_a_provider_of_another_model_never_applies(tmp_path):
    text = """
[providers.p]
api_base = "http://127.0.0.1:9/v1"
models = ["m"]
[providers.p_long]
api_base = "http://127.0.0.1:10/v1"
models = ["m-long"]
[health]
probe_interval_sec = 0
[routing]
default_route = "p"
long_context_threshold = 8000
long_context_provider = "p_long"
"""
    config = tmp_path / "config.toml"
    config.write_text(text)
    out = run_check("--config", str(config)).stdout
    rules = _section(out, "routing")
    assert re.search(
        r"2\. long context +prompt > 8000 tokens -> p_long\n +applies to m-long; never to m "
        r"\(provider p_long does not serve model 'm' \('m-long' is another model\)\)\n",
        rules,
    ), rules
    (warning,) = [w for w in _section(out, "warnings").splitlines() if "long_context_provider" in w]
    assert warning.startswith(
        '  routing.long_context_provider = "p_long": the long context rule never changes where a request goes '
        "(it applies only to m-long, which p_long alone serves): never for m"
    ), warning
    assert warning.endswith('to make it apply, map the names under [aliases]: "m" = { p = "m", p_long = "m-long" }')
    assert "long context -> p_long: applies to m-long; never to m" in _serve_startup(config)

    config.write_text(text + '[aliases]\n"m" = { p = "m", p_long = "m-long" }\n')  # as the warning says
    out = run_check("--config", str(config)).stdout
    assert "applies to m (sent as m-long on p_long" not in out  # the row names what is sent
    assert re.search(r"prompt > 8000 tokens -> p_long\n +applies to m \(sent as m-long\), m-long\n", out), out
    assert "long_context_provider" not in _section(out, "warnings")


def test_check_warns_when_a_default_route_without_models_takes_a_model_another_provider_lists(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(README_PAIRING.replace('models = ["meta-llama/Meta-Llama-3-8B-Instruct"]\n', "", 1))
    out = run_check("--config", str(config)).stdout
    (warning,) = [w for w in _section(out, "warnings").splitlines() if "default_route" in w]
    assert warning == (
        '  routing.default_route = "vllm" lists no models, so it serves every name: requests for gpt-4o-mini '
        "(listed by openai) go to vllm, not to the provider listing them (the model rule applies only to names "
        "the default route does not serve); list in providers.vllm.models the names vllm serves"
    )
    config.write_text(README_PAIRING)  # the README's own config: vllm lists its model
    assert "default_route" not in _section(run_check("--config", str(config)).stdout, "warnings")


def test_the_latency_threshold_warning_names_a_decode_pool_never_a_hosted_api(tmp_path):
    config = tmp_path / "config.toml"
    threshold = 'default_route = "vllm"\nlatency_threshold_ms = 200'
    config.write_text(README_PAIRING.replace('default_route = "vllm"', threshold))
    (warning,) = [w for w in _section(run_check("--config", str(config)).stdout, "warnings").splitlines() if "latency_threshold_ms" in w]
    assert '"openai"' not in warning and "low-latency provider" not in warning
    assert warning.endswith(
        'no provider is a low-latency decode pool (role = "decode") serving their models: add one '
        '(TileRT: connector = "tile_rt_connector") and name it in route_latency_sensitive_to under [routing]'
    ), warning

    decode = '[providers.tile-rt]\nconnector = "tile_rt_connector"\napi_base = "http://127.0.0.1:11/v1"\n'
    config.write_text(README_PAIRING.replace('default_route = "vllm"', threshold) + decode)
    out = run_check("--config", str(config)).stdout
    assert "tile-rt   (connector tile_rt_connector, role decode," in out  # inferred from the connector
    (warning,) = [w for w in _section(out, "warnings").splitlines() if "latency_threshold_ms" in w]
    assert warning.endswith(
        'add route_latency_sensitive_to = "tile-rt" under [routing] to send them to the low-latency decode pool '
        '(role = "decode")'
    ), warning


def test_a_queue_section_under_a_strategy_without_the_queue_is_a_warning(tmp_path):
    config = tmp_path / "config.toml"
    base = '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n[health]\nprobe_interval_sec = 0\n'
    config.write_text(base + '[routing]\nstrategy = "round_robin"\n[routing.queue]\nenabled = true\npreempt = true\n')
    result = run_check("--config", str(config))
    assert result.returncode == 0, result.stderr
    warnings = result.stdout.split("\nwarnings\n", 1)[1]
    assert "[routing.queue] (enabled, preempt) does nothing with strategy = 'round_robin'" in warnings
    config.write_text(base + '[routing.queue]\nenabled = true\npreempt = true\n')  # the default strategy has it
    assert "[routing.queue]" not in run_check("--config", str(config)).stdout.partition("\nwarnings\n")[2]


def test_an_unknown_key_in_a_nested_table_gets_the_nearest_name(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n[routing.queue]\npremept = true\nmax_waitng = 4\n')
    result = run_check("--config", str(config))
    assert result.returncode == 1
    assert 'routing.queue.premept: unknown key; did you mean "preempt"?' in result.stderr
    assert 'routing.queue.max_waitng: unknown key; did you mean "max_waiting"?' in result.stderr
