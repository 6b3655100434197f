"""Every mistake of a config.toml in one run: ``latgate check``, ``latgate serve`` and
``POST /admin/reload`` name them all at once, each as ``FILE:LINE: KEY: what is wrong;
fix`` with secrets masked, structural mistakes first in file order, then the names one
section uses from another; a name is not reported against a section that already has
a mistake of its own. A TOML syntax error stays one error with its line and column."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from stack import default_route_config, gateway_file, simulator_urls

from latgate.foundation.config import ConfigError, load_config_text
from latgate.foundation.config.positions import KeyLines

FIXTURES = Path(__file__).parent / "fixtures"
MANY_MISTAKES = FIXTURES / "many-mistakes.config.toml"

#: (line, key) of every mistake in MANY_MISTAKES, in the order they are reported
EXPECTED = [
    (3, "server.port"),
    (4, "server.hots"),
    (5, "server.host"),
    (8, "defaults.max_retries"),
    (11, "providers.vllm.endpoints[1].url"),
    (12, "providers.vllm.conector"),
    (13, "providers.vllm.api_key_env"),
    (17, "providers.fast.connector"),
    (18, "providers.fast.models[1]"),
    (21, "providers.broken.api_base"),
    (22, "providers.broken.max_batch_size"),
    (23, "providers.broken.models"),
    (29, "routing.strategy"),
    (34, "auth.keys[0]"),
    (36, "auth.keys[0].key"),
    (43, "auth.keys[1].rpm"),
    (46, "state.redis_url"),
    (49, "auth.keys[2].name"),
    (53, "prefill.engine"),
    # the names between sections, after the structure
    (26, "routing.default_route"),
    (28, "routing.fallbacks.fast[0]"),
    # not aliases.pinned.fast (line 32): [providers.fast] has a mistake of its own
    (42, "auth.keys[1].policy"),
]


def latgate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI_KEY", "LATGATE_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "latgate", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def located(lines: list[str], source: Path) -> list[tuple[int, str]]:
    """``(line, key)`` of each ``latgate: error: SOURCE:LINE: KEY: ...`` line."""
    prefix = f"latgate: error: {source}:"
    assert all(line.startswith(prefix) for line in lines), lines
    found = []
    for line in lines:
        number, key, _ = line[len(prefix) :].split(": ", 2)
        found.append((int(number), key))
    return found


def test_check_names_every_mistake_of_every_kind_in_one_run() -> None:
    result = latgate("check", "--config", str(MANY_MISTAKES))
    assert result.returncode == 1 and result.stdout == ""
    *lines, count = result.stderr.splitlines()
    assert located(lines, MANY_MISTAKES) == EXPECTED
    assert count == f"latgate: error: {len(EXPECTED)} errors in {MANY_MISTAKES}"
    text = result.stderr
    for expected in (
        "server.port: input should be less than or equal to 65535 (got 70000); write a number from 0 to 65535, e.g. port = 8000",
        'server.hots: unknown key; did you mean "host"?',
        'server.host: "999.1.1.1" is not an IPv4 address (4 numbers from 0 to 255, separated by dots)',
        "defaults.max_retries: input should be less than or equal to 10 (got 99); write a number from 0 to 10",
        'providers.vllm.endpoints[1].url: "ftp://127.0.0.1:8002" is not an http(s) URL with a host',
        'providers.vllm.conector: unknown key; did you mean "connector"?',
        'providers.fast.connector: unknown connector "tile_rt"; did you mean "tile_rt_connector"?',
        "write a whole number above 0, e.g. max_batch_size = 8",
        "providers.broken.models: an empty list names no model, yet a provider without models serves any model",
        "auth.keys[1].rpm: input should be greater than 0 (got 0); write a number above 0, e.g. rpm = 60",
        "auth.keys[0].key: environment variable CI_KEY is not set",
        'routing.default_route: unknown provider "vlm"; did you mean "vllm"?',
        'routing.fallbacks.fast[0]: unknown provider "fsat"; did you mean "fast"?',
        'auth.keys[1].policy: unknown policy "fats"; define [routing.policies.fats]',
        'auth.keys[2].name: duplicate key name "dev"; give each key its own name',
        'prefill.engine: provider "fast" is defined twice (also at providers.fast)',
    ):
        assert expected in text, expected
    # secrets masked: a key pasted as api_key_env, a key in a URL's query
    assert '"sk-***" is not an environment variable name' in text and "sk-proj-4eC39" not in text
    assert "?key=***" in text and "key=abc" not in text
    assert "Traceback" not in text and "aliases.pinned" not in text


def test_the_same_file_gives_the_same_errors_in_the_same_order_every_run() -> None:
    first = latgate("check", "--config", str(MANY_MISTAKES)).stderr
    assert latgate("check", "--config", str(MANY_MISTAKES)).stderr == first


def test_serve_refuses_to_start_with_the_same_errors_as_check() -> None:
    check = latgate("check", "--config", str(MANY_MISTAKES))
    serve = latgate("serve", "--config", str(MANY_MISTAKES), "--port", "0")
    assert serve.returncode == 1
    assert serve.stderr.splitlines()[-len(EXPECTED) - 1 :] == check.stderr.splitlines()


def test_reload_answers_with_every_mistake_and_keeps_the_running_config(tmp_path: Path) -> None:
    with simulator_urls(("a", "b")) as sims:
        path = tmp_path / "config.toml"
        path.write_text(default_route_config(sims, default="a"))
        with gateway_file(path, env={}) as stack:
            path.write_text(MANY_MISTAKES.read_text())
            response = httpx.post(stack.url + "/admin/reload", timeout=30)
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["code"] == "invalid_config" and "still serving the previous one" in error["message"]
            assert [(e["line"], e["key"]) for e in error["errors"]] == EXPECTED
            assert all(e["file"] == str(path) and e["message"] and e["fix"] for e in error["errors"])
            assert "sk-proj-4eC39" not in response.text and "key=abc" not in response.text
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            answer = httpx.post(stack.url + "/v1/chat/completions", json=chat, timeout=30)
            assert answer.status_code == 200 and answer.headers["x-latgate-provider"] == "a"


@pytest.mark.parametrize(
    "config",
    [FIXTURES / "acceptance" / "provider-table.config.toml", FIXTURES / "pool-sections.with-addresses.config.toml"],
    ids=["provider_table", "pool-sections-with-addresses"],
)
def test_acceptance_configs_still_pass_check(config: Path) -> None:
    result = latgate("check", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr and result.stdout.startswith(f"config   {config}")


def test_a_toml_syntax_error_is_one_error_with_its_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[server]\nport = 8000\n[providers.a]\napi_base = http://127.0.0.1:1/v1\nmodels = 3\n')
    result = latgate("check", "--config", str(path))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        (
            f"latgate: error: {path}:4:12: invalid TOML: invalid value; fix the syntax there "
            "(strings need double quotes, sections are [name], key = value lines)"
        )
    ]


def check_errors(tmp_path: Path, text: str) -> list[str]:
    """``LINE: KEY: ...`` of each mistake ``latgate check`` reports in a config ``text``."""
    path = tmp_path / "config.toml"
    path.write_text(textwrap.dedent(text))
    result = latgate("check", "--config", str(path))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    prefix = f"latgate: error: {path}:"
    return [line.removeprefix(prefix) for line in result.stderr.splitlines() if line.startswith(prefix)]


def test_a_list_key_written_as_a_string_or_a_table_as_a_list_gets_the_shape_to_write(tmp_path: Path) -> None:
    errors = check_errors(
        tmp_path,
        """\
        [providers.openai]
        api_base = "http://127.0.0.1:9102/v1"
        models = "glm-5.1"
        [routing]
        fallbacks = ["openai"]
        """,
    )
    assert errors[:2] == [
        '3: providers.openai.models: input should be a list (got "glm-5.1"); write a list, e.g. models = ["glm-5.1"]',
        '5: routing.fallbacks: input should be a table (got a list); write a table, e.g. fallbacks = { PROVIDER = ["NEXT", ...] }',
    ]
    errors = check_errors(tmp_path, '[providers.a]\napi_base = "http://127.0.0.1:1/v1"\n[routing]\nfallbacks = { a = "b" }\n')
    assert errors[0] == '4: routing.fallbacks.a: input should be a list (got "b"); write a list, e.g. a = ["b"]'
    assert not any("valid tuple" in e or "valid list" in e for e in errors)


def test_a_quoted_number_or_boolean_is_a_type_error_naming_key_table_and_type(tmp_path: Path) -> None:
    errors = check_errors(
        tmp_path,
        """\
        [server]
        port = "8001"
        [providers.p]
        api_base = "http://127.0.0.1:9102/v1"
        models = [1, 2]
        timeout_sec = "30"
        [routing.queue]
        enabled = "off"
        """,
    )
    assert errors == [
        '2: server.port: expected a whole number, not a quoted string (got "8001"); write a whole number from 0 to 65535, e.g. port = 8000',
        '5: providers.p.models[0]: input should be a valid string (got 1); write each item as a quoted string, e.g. models = ["..."]',
        '5: providers.p.models[1]: input should be a valid string (got 2); write each item as a quoted string, e.g. models = ["..."]',
        '6: providers.p.timeout_sec: expected a number, not a quoted string (got "30"); write a number above 0, e.g. timeout_sec = 600',
        '8: routing.queue.enabled: expected true or false, not a quoted string (got "off"); write enabled = true or enabled = false',
    ]


@pytest.mark.parametrize(("written", "meant"), [("vllm_connector", "vllm"), ("sglang-connector", "sglang"), ("tile-rt", "tile_rt_connector")])
def test_a_connector_typo_is_pointed_to_the_connector_it_names(tmp_path: Path, written: str, meant: str) -> None:
    text = f'[providers.p]\napi_base = "http://127.0.0.1:9102/v1"\nconnector = "{written}"\n'
    (error,) = check_errors(tmp_path, text)
    assert error.startswith(f'3: providers.p.connector: unknown connector "{written}"; did you mean "{meant}"? '), error


BASE_FIX = 'write api_base = "http://127.0.0.1:9102/v1"'
URL_FIX = 'write url = "http://127.0.0.1:9103/serving"'


@pytest.mark.parametrize("operation", ["/chat/completions", "/completions", "/embeddings", "/messages", "/responses"])
def test_an_api_base_ending_in_an_operation_path_is_refused_with_the_base_to_write(tmp_path: Path, operation: str) -> None:
    errors = check_errors(
        tmp_path,
        f"""\
        [providers.openai]
        api_base = "http://127.0.0.1:9102/v1{operation}/"
        [providers.exact]
        endpoints = [{{ url = "http://127.0.0.1:9103/serving{operation}" }}]
        api_base_exact = true
        """,
    )
    twice = (
        f"ends with the operation path {operation}, but latgate appends the operation to the base URL, "
        f"even with api_base_exact (it would call ...{operation}/chat/completions)"
    )
    assert errors == [
        f'2: providers.openai.api_base: "http://127.0.0.1:9102/v1{operation}" {twice}; {BASE_FIX}',
        f'4: providers.exact.endpoints[0].url: "http://127.0.0.1:9103/serving{operation}" {twice}; {URL_FIX}',
    ]


def test_a_variable_reference_as_api_key_env_is_told_to_name_the_variable(tmp_path: Path) -> None:
    errors = check_errors(
        tmp_path,
        """\
        [providers.openai]
        api_base = "http://127.0.0.1:9102/v1"
        api_key_env = "${OPENAI_KEY_MISSING}"
        """,
    )
    said = (
        '3: providers.openai.api_key_env: "${OPENAI_KEY_MISSING}" is a ${...} reference, which stands for a '
        'variable\'s value; api_key_env names the variable: write api_key_env = "OPENAI_KEY_MISSING"'
    )
    assert errors == [said]


# --- no cascades: plain data ------------------------------------------------------------


def problems(text: str) -> list[str]:
    """``LINE: KEY`` of every mistake loading ``text``."""
    with pytest.raises(ConfigError) as caught:
        load_config_text(textwrap.dedent(text), source="gw.toml", env={})
    return [f"{e.line}: {e.key}" for e in caught.value.errors()]


def test_a_broken_provider_section_is_not_echoed_as_unknown_or_not_serving_elsewhere() -> None:
    assert problems(
        """\
        [providers.vllm]
        api_base = "http://127.0.0.1:1/v1"
        models = "m"
        [providers.fast]
        api_base = 5
        models = ["glm-fast"]
        [providers.gone]
        [routing]
        route_latency_sensitive_to = "fast"
        fallbacks = { fast = ["gone"] }
        [aliases]
        x = { vllm = "anything" }
        [models.m]
        latency_sensitive = true
        """
    ) == ["3: providers.vllm.models", "5: providers.fast.api_base", "7: providers.gone.api_base"]


def test_a_pool_section_without_engine_leaves_routing_names_unchecked() -> None:
    assert problems(
        """\
        [decode]
        api_base = "http://127.0.0.1:1/v1"
        [routing]
        route_latency_sensitive_to = "tile-rt"
        """
    ) == ["1: decode.engine"]


def test_a_value_with_a_mistake_is_not_reported_again_by_a_later_check() -> None:
    # the unset variable is the mistake; the URL check of the same value says nothing more
    assert problems('[providers.a]\napi_base = "${POOL_URL}"\n[routing]\nstrategy = 3\n') == [
        "2: providers.a.api_base",
        "4: routing.strategy",
    ]


def test_a_number_with_a_mistake_leaves_the_rest_of_its_section_checked() -> None:
    assert problems(
        """\
        [providers.a]
        api_base = "http://127.0.0.1:1/v1"
        [routing]
        long_context_threshold = -1
        long_context_provider = "b"
        latency_threshold_ms = "fast"
        """
    ) == ["4: routing.long_context_threshold", "6: routing.latency_threshold_ms", "5: routing.long_context_provider"]


def test_auth_keys_report_every_duplicate_name_and_shared_key() -> None:
    text = '[providers.a]\napi_base = "http://127.0.0.1:1/v1"\n'
    text += '[[auth.keys]]\nname = "ci"\nkey = "k1"\nrpm = -1\n'  # a mistake of its own
    text += '[[auth.keys]]\nname = "ci"\nkey = "k2"\n'
    text += '[[auth.keys]]\nname = "dev"\nkey = "k2"\n'
    assert problems(text) == ["6: auth.keys[0].rpm", "8: auth.keys[1].name", "10: auth.keys[2]"]
    with pytest.raises(ConfigError, match='auth.keys\\[2\\]: same key as "ci"'):
        load_config_text(text, source="gw.toml", env={})


def test_a_good_config_loads_as_before() -> None:
    config = load_config_text(
        '[providers.a]\napi_base = "http://127.0.0.1:1/v1"\nmodels = ["m"]\n[routing]\ndefault_model = "m"\n',
        source="gw.toml",
        env={},
    )
    assert list(config.providers) == ["a"] and config.routing.default_model == "m"


# --- positions: plain data --------------------------------------------------------------


def test_key_lines_follow_headers_arrays_inline_tables_and_quoted_keys() -> None:
    text = textwrap.dedent(
        """\
        [providers.vllm]
        endpoints = [
          "http://127.0.0.1:1/v1",  # a comment ] with a bracket
          { url = "http://127.0.0.1:2/v1", weight = 2 },
        ]
        note = \"\"\"
        [not.a.table]
        \"\"\"
        [models."org/name"]
        latency_sensitive = true
        [[auth.keys]]
        name = "a"
        [[auth.keys]]
        name = "b"
        models = ["x", "y"]
        """
    )
    lines = KeyLines(text)
    assert lines.line_of("providers.vllm.endpoints[0]") == 3
    assert lines.line_of("providers.vllm.endpoints[1].weight") == 4
    assert lines.line_of("providers.vllm.timeout_sec") == 1  # not written: its table's line
    assert lines.line_of('models."org/name".latency_sensitive') == 10
    assert lines.line_of("auth.keys[1].models[1]") == 15
    assert lines.line_of("auth.keys[1]") == 13
    assert lines.line_of("not.a.table") is None
