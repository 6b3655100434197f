"""Config mistakes that must be one clear start-up error (or a warning), never a crash,
a traceback or a 500 on every request.

Found by adversarial testing of the loader and the CLI; each test names the mistake.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from replay import ReplayScript, replay_server
from stack import gateway
from tokenizer_file import whitespace_tokenizer

from latgate.commands import cli
from latgate.commands.check import report_lines
from latgate.foundation.config import (
    ConfigError,
    config_warnings,
    load_config,
    load_config_text,
    resolve_config_path,
)
from latgate.foundation.config.masking import mask_secrets
from latgate.foundation.config.schema import Config, EndpointConfig, ProviderConfig, RoutingConfig
from latgate.process import server

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
LATGATE = [sys.executable, "-m", "latgate"]
PROVIDER = '[providers.a]\napi_base = "http://127.0.0.1:9/v1"\n'
TWO_PROVIDERS = PROVIDER + '[providers.b]\napi_base = "http://127.0.0.1:8/v1"\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(text: str, env: dict[str, str] | None = None) -> Config:
    return load_config_text(text, source="t.toml", env=env or {})


def _error(text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        _load(text, env)
    return caught.value


# --- tokenizer: `check` and `serve` agree ------------------------------------------------


def test_check_rejects_a_tokenizer_that_cannot_be_loaded(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(PROVIDER + 'tokenizer = "/nonexistent/tokenizer.json"\n')
    r = subprocess.run([*LATGATE, "check", "--config", str(cfg)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stdout[-500:]
    assert r.stderr.startswith("latgate: error: ") and "providers.a.tokenizer" in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_serve_reports_an_unloadable_tokenizer_in_one_line_without_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(PROVIDER + 'tokenizer = "/nonexistent/tokenizer.json"\n')
    try:
        r = subprocess.run(
            [*LATGATE, "serve", "--config", str(cfg), "--port", str(_free_port())],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("serve kept running with a config whose tokenizer cannot be loaded")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr, r.stderr[-800:]
    assert "latgate: error:" in r.stderr and "tokenizer" in r.stderr


def test_a_relative_tokenizer_path_is_loaded_from_the_config_files_folder(tmp_path: Path, monkeypatch) -> None:
    whitespace_tokenizer(tmp_path / "tok.json")
    cfg = tmp_path / "c.toml"
    cfg.write_text(PROVIDER + 'tokenizer = "tok.json"\n')
    monkeypatch.chdir(tmp_path.parent)
    assert load_config(cfg, env={}).providers["a"].tokenizer == "tok.json"


def test_serve_turns_a_config_error_found_while_building_the_app_into_one_line(capsys) -> None:
    """The loader catches a bad tokenizer; a Config built in code reaches create_app."""
    endpoint = EndpointConfig(id="a-0", api_base="http://127.0.0.1:9/v1")
    config = Config(
        providers={"a": ProviderConfig(name="a", endpoints=(endpoint,), tokenizer="/nonexistent/tokenizer.json")},
        routing=RoutingConfig(default_route="a"),
    )
    assert server.run(config, host="127.0.0.1", port=0) == 1
    err = capsys.readouterr().err
    assert err.startswith("latgate: error: ") and "providers.a.tokenizer" in err and len(err.splitlines()) == 1


# --- command-line values -------------------------------------------------------------------


def test_serve_rejects_a_port_argument_out_of_range(tmp_path: Path) -> None:
    """`--port 99999` silently bound 99999 % 65536 = 34463."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(PROVIDER)
    try:
        r = subprocess.run([*LATGATE, "serve", "--config", str(cfg), "--port", "99999"], capture_output=True, text=True, timeout=8, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("latgate serve --port 99999 started a server instead of refusing the port")
    assert r.returncode == 2
    assert r.stderr == "latgate: error: --port 99999 is not a port number (0..65535)\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--port", "-1"], "--port -1 is not a port number (0..65535)"),
        (["serve", "--workers", "0"], "--workers must be at least 1"),
        (["demo", "--port", "70000"], "--port 70000 is not a port number (0..65535)"),
    ],
)
def test_port_and_workers_out_of_range_are_one_error_line(argv: list[str], expected: str, capsys) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"latgate: error: {expected}\n"


def test_an_empty_config_path_is_an_error_not_a_fallback(capsys) -> None:
    with pytest.raises(ConfigError, match="--config: empty path"):
        resolve_config_path("", env={})
    assert cli.main(["check", "--config", ""]) == 1
    err = capsys.readouterr().err
    assert err.startswith("latgate: error: command line: --config: empty path") and len(err.splitlines()) == 1


def test_an_empty_config_variable_counts_as_unset() -> None:
    assert resolve_config_path(None, env={"LATGATE_CONFIG": ""}) == Path("config.toml")


def test_a_file_starting_with_a_byte_order_mark_gets_a_hint(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + PROVIDER.encode())
    with pytest.raises(ConfigError, match="byte order mark"):
        load_config(cfg, env={})


# --- values accepted that broke every request ------------------------------------------


@pytest.mark.parametrize("suffix", ["?", "#", "?x=1", "#frag"])
def test_api_base_with_a_query_or_fragment_is_rejected(suffix: str) -> None:
    """A base URL with a query or fragment (`http://h/v1?`, `http://h/v1#`) is a config
    error naming the key: no request is sent to a mangled path."""
    err = _error(f'[providers.a]\napi_base = "http://127.0.0.1:9/v1{suffix}"\n')
    assert err.key == "providers.a.api_base" and "query or fragment" in err.message


@pytest.mark.parametrize("url", ["http://my host:9/v1", "http://h:9/v 1", "http://h:9/v1\\tx"])
def test_api_base_with_a_space_or_control_character_is_rejected(url: str) -> None:
    err = _error(f'[providers.a]\napi_base = "{url}"\n')
    assert err.key == "providers.a.api_base" and "space or control character" in err.message


def test_api_base_with_userinfo_beside_api_key_env_is_rejected_without_showing_the_password() -> None:
    """Userinfo and api_key_env both name a credential: the config is refused, its password not shown."""
    err = _error('[providers.up]\napi_base = "http://user:s3cret@127.0.0.1:9/v1"\napi_key_env = "UP_KEY"\n')
    assert err.key == "providers.up.api_base" and "api_key_env" in err.message
    assert "s3cret" not in str(err) and "user:***@" in str(err)


def test_api_base_with_userinfo_alone_is_sent_as_basic_auth() -> None:
    with replay_server(ReplayScript.json_response(200, {"ok": 1})) as up:
        base = up.base_url.replace("http://", "http://user:pw@")
        with gateway(f'[providers.up]\napi_base = "{base}"\n') as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200, r.text
        assert up.requests[0].header("authorization") == "Basic dXNlcjpwdw=="  # user:pw


def test_check_never_prints_the_password_of_a_url() -> None:
    config = _load('[providers.a]\nendpoints = ["http://user:s3cret@127.0.0.1:9/v1", "http://127.0.0.1:8"]\n')
    text = "\n".join(report_lines(config, warnings=[]))
    assert "s3cret" not in text and "http://user:***@127.0.0.1:9/v1" in text


def test_an_error_about_a_url_never_shows_a_key_in_its_query() -> None:
    """Some providers take their key as ``?key=...``: the value is masked, its name kept."""
    err = _error('[providers.a]\napi_base = "http://127.0.0.1:9399/v1?key=AIzaSECRETKEY123"\n')
    assert "AIzaSECRETKEY123" not in str(err) and "?key=***" in str(err)


def test_an_error_about_a_url_never_shows_its_password() -> None:
    err = _error('[providers.a]\napi_base = "http://user:s3cret@127.0.0.1:99999/v1"\n')
    assert "s3cret" not in str(err)


@pytest.mark.parametrize(
    "text",
    [
        "[defaults]\nconnect_timeout_sec = inf\n",
        "[defaults]\ntimeout_sec = nan\n",
        "[defaults]\nfirst_token_timeout_sec = inf\n",
        "[health]\nopen_sec = inf\n",
    ],
)
def test_a_timeout_that_is_not_finite_is_rejected(text: str) -> None:
    """An infinite timeout (`connect_timeout_sec = inf`) is a config error, so no request
    can fail on it at run time."""
    assert "finite" in _error(text + PROVIDER).message


def test_a_provider_timeout_that_is_not_finite_is_rejected() -> None:
    assert _error(PROVIDER + "timeout_sec = -inf\n").key == "providers.a.timeout_sec"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = true\n" + PROVIDER, "server.port"),
        ("[defaults]\nmax_retries = true\n" + PROVIDER, "defaults.max_retries"),
        ("[defaults]\ntimeout_sec = true\n" + PROVIDER, "defaults.timeout_sec"),
        (PROVIDER + "max_batch_size = true\n", "providers.a.max_batch_size"),
        (PROVIDER + "[routing.policies.p]\nlatency_budget_ms = false\n", "routing.policies.p.latency_budget_ms"),
        (PROVIDER + '[auth]\n[[auth.keys]]\nname = "k"\nkey = "x"\nrpm = true\n', "auth.keys[0].rpm"),
    ],
)
def test_a_boolean_is_not_taken_for_a_number(text: str, key: str) -> None:
    """A number key given `true`/`false` (`port = true`) is a config error naming the key,
    never a number taken from the boolean."""
    err = _error(text)
    assert err.key == key and "not true/false" in err.message


def test_booleans_still_set_boolean_keys() -> None:
    config = _load(PROVIDER + "enable_prefix_cache = true\n[routing]\nallow_route_override = true\n")
    assert config.providers["a"].enable_prefix_cache and config.routing.allow_route_override


def test_extra_body_with_an_integer_json_cannot_encode_is_rejected() -> None:
    """TOML allows 99999999999999999999; orjson cannot encode it: 500 on every request."""
    err = _error(PROVIDER + "extra_body = { seed = 99999999999999999999 }\n")
    assert err.key == "providers.a.extra_body" and "64-bit" in err.message


def test_extra_body_nested_too_deep_for_json_is_rejected() -> None:
    deep = "[" * 300 + "]" * 300
    assert _error(PROVIDER + f"extra_body = {{ a = {deep} }}\n").key == "providers.a.extra_body"


@pytest.mark.parametrize("field", ["stream", "stream_options", "model", "messages", "prompt", "input"])
def test_extra_body_cannot_set_what_the_request_decides(field: str) -> None:
    """extra_body = { stream = true } turned a non-streamed request into SSE bytes."""
    err = _error(PROVIDER + f"extra_body = {{ {field} = true }}\n")
    assert err.key == f"providers.a.extra_body.{field}" and f"may not set {field}" in err.message


def test_extra_body_with_ordinary_sampling_fields_still_loads() -> None:
    config = _load(PROVIDER + "extra_body = { top_k = 20, chat_template_kwargs = { enable_thinking = false } }\n")
    assert config.providers["a"].extra_body == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}


# --- provider names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\\nb", "", "a b"])
def test_provider_table_default_provider_name_is_validated_like_any_provider_name(name: str) -> None:
    """[default] provider = "..." with api_base defined a provider without the name
    check; "a\\nb" then made every response fail (illegal header value)."""
    err = _error(f'[default]\nprovider = "{name}"\napi_base = "http://127.0.0.1:9/v1"\n')
    assert err.key == "default.provider"


@pytest.mark.parametrize("name", ["none", "other"])
def test_provider_names_that_metrics_use_as_label_values_are_reserved(name: str) -> None:
    err = _error(f'[providers.{name}]\napi_base = "http://127.0.0.1:9/v1"\n')
    assert err.key == f"providers.{name}" and "reserved" in err.message


@pytest.mark.parametrize("name", ["a:b", "a/b", "-a", "é", "x" * 65])
def test_provider_names_are_letters_digits_and_dot_dash_underscore(name: str) -> None:
    assert "not usable" in _error(f'[providers."{name}"]\napi_base = "http://127.0.0.1:9/v1"\n').message


def test_a_64_character_provider_name_with_dots_and_dashes_is_fine() -> None:
    name = "pool-1.a_" + "x" * 55
    assert list(_load(f'[providers."{name}"]\napi_base = "http://127.0.0.1:9/v1"\n').providers) == [name]


# --- duplicates and pairs ------------------------------------------------------------------


def test_the_same_replica_written_with_and_without_v1_is_a_duplicate() -> None:
    """Both URLs call http://127.0.0.1:9/v1/...: two endpoints, one server."""
    err = _error('[providers.a]\nendpoints = ["http://127.0.0.1:9", "http://127.0.0.1:9/v1"]\n')
    assert err.key == "providers.a.endpoints[1]" and "duplicate" in err.message


def test_provider_table_default_api_base_without_v1_matches_its_provider_with_v1() -> None:
    text = '[default]\nprovider = "a"\napi_base = "http://127.0.0.1:9"\n' + PROVIDER
    assert _load(text).providers["a"].endpoints[0].base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("models", "key"),
    [('[""]', "providers.a.models[0]"), ('["m", " "]', "providers.a.models[1]"), ('["m", "n", "m"]', "providers.a.models[2]")],
)
def test_empty_or_repeated_model_names_are_rejected(models: str, key: str) -> None:
    assert _error(PROVIDER + f"models = {models}\n").key == key


@pytest.mark.parametrize(
    ("routing", "key"),
    [
        ("[routing]\nlong_context_threshold = 1000\n", "routing.long_context_threshold"),
        ('[routing]\nlong_context_provider = "b"\n', "routing.long_context_provider"),
        ('[routing.policies.p]\nlong_context_provider = "b"\n', "routing.policies.p.long_context_provider"),
    ],
)
def test_half_a_long_context_rule_is_an_error(routing: str, key: str) -> None:
    assert _error(TWO_PROVIDERS + routing).key == key


def test_a_long_context_threshold_with_only_a_policys_provider_is_a_rule() -> None:
    config = _load(TWO_PROVIDERS + '[routing]\nlong_context_threshold = 1000\n[routing.policies.p]\nlong_context_provider = "b"\n')
    assert config.routing.policies["p"].long_context_provider == "b"


def test_an_empty_server_host_is_rejected() -> None:
    assert _error('[server]\nhost = ""\n' + PROVIDER).key == "server.host"


# --- provider keys -------------------------------------------------------------------------

KEYED = '[providers.up]\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = "UP_KEY"\n'


def test_a_key_variable_that_is_set_but_empty_gets_a_warning() -> None:
    warnings = config_warnings(_load(KEYED), {"UP_KEY": ""})
    expected = (
        'provider "up": api_key_env UP_KEY is set but empty; requests to it will be sent without a key '
        "(expect 401 from the upstream)"
    )
    assert warnings == [expected]


@pytest.mark.parametrize("key", ["sk-abc123\n", "sk-abc\r\nX-Injected: 1", "sk-é", "sk abc"])
def test_a_malformed_key_gets_a_warning_naming_provider_and_variable_not_the_value(key: str) -> None:
    warnings = config_warnings(_load(KEYED), {"UP_KEY": key})
    assert len(warnings) == 1 and warnings[0].startswith('provider "up": api_key_env UP_KEY is set, but its value')
    assert "sk-" not in warnings[0]


def test_a_well_formed_key_gets_no_warning() -> None:
    assert config_warnings(_load(KEYED), {"UP_KEY": "sk-abc_123.XYZ"}) == []


@pytest.mark.parametrize(
    ("key", "sent"),
    [("sk-abc123\n", "Bearer sk-abc123"), (" sk-abc123 ", "Bearer sk-abc123"), ("sk-abc\r\nX-Injected: 1", None), ("sk-é", None)],
    ids=["trailing_newline", "spaces_around", "crlf", "non_ascii"],
)
def test_a_malformed_provider_key_is_not_a_500_on_every_request(key: str, sent: str | None) -> None:
    """A provider key with surrounding whitespace (a file's trailing newline) is sent
    trimmed; a key a header cannot carry is not sent (the start-up warning says so), so
    the upstream's answer, not a 500, reaches the client."""
    with replay_server(ReplayScript.json_response(200, {"ok": 1})) as up:
        text = f'[providers.up]\napi_base = "{up.base_url}"\napi_key_env = "UP_KEY"\n'
        with gateway(text, env={"UP_KEY": key}) as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200, r.text
        assert up.requests[0].header("authorization") == sent
        assert all(q.header("x-injected") is None for q in up.requests)


@pytest.mark.parametrize(
    "name",
    [
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "DeepSeek-R1-Distill-Qwen-32B-Instruct",
        "TAOTOKEN_API_KEY",
        "http://127.0.0.1:9101/v1",
        "sglang_tilelang-0",
        "glm-5.1-highspeed",
        "sk-team",
        "providers.vllm.max_num_batched_tokens",
    ],
)
def test_names_people_write_are_not_taken_for_keys(name: str) -> None:
    assert mask_secrets(f"x {name} y") == f"x {name} y"


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("sk-proj-4eC39HqLyjWDarjtT1zdp7dc", "sk-***"),
        ("sk-ant-api03-AbCdEfGh12", "sk-***"),
        ("gsk_8f3kLmN0pQrStUvW", "gsk_***"),
        ("AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "AIza***"),
        ("Xk9fQ2mZ7pL4vR8tY1wB3nC6", "Xk9***"),
        ("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "e3b***"),
    ],
)
def test_values_that_look_like_keys_are_masked(key: str, shown: str) -> None:
    assert mask_secrets(f'api_key_env = "{key}" is wrong') == f'api_key_env = "{shown}" is wrong'
