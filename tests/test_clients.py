"""``latgate clients``: each client's printed settings, used as that client would use
them against a running gateway; and ``settings.example.json`` against ``config.toml``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import anthropic
import openai
import pytest
import yaml
from stack import DEMO_TEMPLATE, Stack

from latgate.commands.cli import main as cli
from latgate.commands.clients import upstream_timeout_seconds
from latgate.foundation.config import load_config
from latgate.routing.decision import Router

ROOT = Path(__file__).resolve().parent.parent
ASK = [{"role": "user", "content": "hello"}]


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "gw.toml"
    path.write_text(
        DEMO_TEMPLATE.format(
            tile="http://127.0.0.1:9", vllm="http://127.0.0.1:9", tao="http://127.0.0.1:9", max_retries=1
        )
    )
    return str(path)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli(["clients", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def printed(capsys, *args: str) -> str:
    code, out, err = run(capsys, *args)
    assert code == 0, err
    return out


def test_claude_code_settings_drive_the_anthropic_sdk_to_the_policy_route(
    capsys, config_file: str, demo: Stack
) -> None:
    out = printed(
        capsys,
        "claude-code",
        "--config",
        config_file,
        "--base-url",
        demo.url + "/",
        "--policy",
        "interactive",
    )
    env = json.loads(out)["env"]
    assert env["ANTHROPIC_BASE_URL"] == demo.url  # no /v1: Claude Code appends /v1/messages
    headers = dict(line.split(": ", 1) for line in env["ANTHROPIC_CUSTOM_HEADERS"].split("\n"))
    client = anthropic.Anthropic(
        base_url=env["ANTHROPIC_BASE_URL"],
        auth_token=env["ANTHROPIC_AUTH_TOKEN"],
        default_headers=headers,
        max_retries=0,
    )
    main = client.messages.with_raw_response.create(model=env["ANTHROPIC_MODEL"], max_tokens=4, messages=ASK)
    assert (main.headers["x-latgate-provider"], main.parse().model) == ("tile-rt", "glm-5.1")
    plain = anthropic.Anthropic(
        base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"], max_retries=0
    )
    haiku = plain.messages.with_raw_response.create(
        model=env["ANTHROPIC_DEFAULT_HAIKU_MODEL"], max_tokens=4, messages=ASK
    )
    assert (env["ANTHROPIC_DEFAULT_HAIKU_MODEL"], haiku.headers["x-latgate-provider"]) == (
        "glm-5.1-highspeed",
        "tile-rt",
    )


#: ~/.cline/data/settings/providers.json as ``cline auth -p openai -b URL -k KEY -m MODEL``
#: writes it (Cline CLI 3.0.65, the version tests/agents pins)
CLINE_AUTH_WRITES = {
    "version": 1,
    "lastUsedProvider": "openai-compatible",
    "modes": {},
    "providers": {
        "openai-compatible": {
            "settings": {"provider": "openai-compatible", "apiKey": "KEY", "model": "MODEL", "baseUrl": "URL"},
            "updatedAt": "2026-12-01T00:00:00.000Z",
            "tokenSource": "manual",
        }
    },
}


def test_cline_commands_configure_the_cli_with_the_v1_base_url_and_the_custom_header(
    capsys, config_file: str, demo: Stack, tmp_path: Path
) -> None:
    code, out, err = run(capsys, "cline", "--config", config_file, "--base-url", demo.url, "--policy", "interactive")
    assert code == 0, err
    commands = [shlex.split(line) for line in out.splitlines() if line and not line.startswith("#")]
    auth, edit = commands
    assert auth[:2] == ["cline", "auth"] and auth[auth.index("-p") + 1] == "openai"
    assert auth[auth.index("-b") + 1] == demo.v1
    assert "# then: cline -P openai -m glm-5.1 'your task'" in out
    assert "reads no settings.json keys" in err and 'API Provider "OpenAI Compatible"' in err

    # the header edit, run on the file cline auth writes: the CLI sends settings.headers
    written = tmp_path / ".cline" / "data" / "settings" / "providers.json"
    written.parent.mkdir(parents=True)
    written.write_text(json.dumps(CLINE_AUTH_WRITES))
    assert edit[:2] == ["python3", "-c"]
    subprocess.run([sys.executable, "-c", edit[2]], check=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
    settings = json.loads(written.read_text())["providers"]["openai-compatible"]["settings"]
    assert settings["headers"] == {"X-Route-Policy": "interactive"}

    client = openai.OpenAI(
        base_url=auth[auth.index("-b") + 1],
        api_key=auth[auth.index("-k") + 1],
        default_headers=settings["headers"],
        max_retries=0,
    )
    raw = client.chat.completions.with_raw_response.create(model=auth[auth.index("-m") + 1], messages=ASK)
    assert (raw.headers["x-latgate-provider"], raw.headers["x-latgate-route-reason"]) == (
        "tile-rt",
        "latency_sensitive",
    )


def test_continue_config_has_a_chat_model_and_a_latency_sensitive_autocomplete_model(
    capsys, config_file: str, demo: Stack
) -> None:
    models = yaml.safe_load(printed(capsys, "continue", "--config", config_file, "--base-url", demo.url))[
        "models"
    ]
    chat, autocomplete = models
    assert (chat["roles"], autocomplete["roles"]) == (["chat", "edit", "apply"], ["autocomplete"])
    providers = []
    for entry in models:
        assert entry["provider"] == "openai" and entry["apiBase"] == demo.v1
        headers = entry.get("requestOptions", {}).get("headers", {})
        client = openai.OpenAI(
            base_url=entry["apiBase"], api_key=entry["apiKey"], default_headers=headers, max_retries=0
        )
        raw = client.chat.completions.with_raw_response.create(
            model=entry["model"], messages=ASK, stream=True
        )
        list(raw.parse())
        providers.append(raw.headers["x-latgate-provider"])
    assert providers == ["vllm", "tile-rt"]


def test_cursor_is_marked_latency_sensitive_by_its_model_name_alone(
    capsys, config_file: str, demo: Stack
) -> None:
    code, out, err = run(
        capsys, "cursor", "--config", config_file, "--base-url", demo.url, "--latency-sensitive"
    )
    assert code == 0
    fields = dict(line.strip().split(":  ", 1) for line in out.splitlines()[1:])
    fields = {name.rstrip(":"): value.strip() for name, value in fields.items()}
    assert fields["Override OpenAI Base URL"] == demo.v1
    assert fields["Add model"] == "glm-5.1-highspeed"
    assert "public HTTPS" in err  # a loopback URL cannot be reached from Cursor's servers
    client = openai.OpenAI(
        base_url=fields["Override OpenAI Base URL"], api_key=fields["OpenAI API Key"], max_retries=0
    )
    raw = client.chat.completions.with_raw_response.create(model=fields["Add model"], messages=ASK)
    assert raw.headers["x-latgate-provider"] == "tile-rt"


def test_cursor_with_a_public_https_url_gets_no_reachability_warning(capsys, config_file: str) -> None:
    code, out, err = run(capsys, "cursor", "--config", config_file, "--base-url", "https://gw.example.com/v1")
    assert code == 0 and "https://gw.example.com/v1" in out
    assert "public HTTPS" not in err


def test_openai_exports_reach_the_gateway(capsys, config_file: str, demo: Stack) -> None:
    code, _, err = run(capsys, "openai", "--config", config_file, "--base-url", demo.v1)
    assert code == 0, err
    (note,) = [line for line in err.splitlines() if " export " in line]
    env = dict(word.partition("=")[::2] for word in shlex.split(note.partition(" export ")[2]))
    assert env["OPENAI_BASE_URL"] == demo.v1
    client = openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0)
    assert client.chat.completions.create(model="glm-5.1", messages=ASK).choices[0].message.content


def test_codex_config_drives_the_responses_api_with_its_headers(capsys, config_file: str, demo: Stack) -> None:
    code, out, err = run(
        capsys, "codex", "--config", config_file, "--base-url", demo.url, "--key", "sk-team", "--latency-sensitive"
    )
    assert code == 0, err
    config = tomllib.loads(out)
    provider = config["model_providers"][config["model_provider"]]
    assert (provider["base_url"], provider["wire_api"]) == (demo.v1, "responses")
    assert f"{provider['env_key']}=sk-team codex exec" in err  # where the key goes
    client = openai.OpenAI(
        base_url=provider["base_url"], api_key="sk-team", default_headers=provider["http_headers"], max_retries=0
    )
    raw = client.responses.with_raw_response.create(model=config["model"], input="hello", max_output_tokens=4)
    assert raw.headers["x-latgate-provider"] == "tile-rt"  # X-Latency-Sensitive reached the router
    assert raw.parse().output_text


def test_default_base_url_comes_from_the_config_and_the_key_from_the_flag(capsys, config_file: str) -> None:
    env = json.loads(printed(capsys, "claude-code", "--config", config_file, "--key", "sk-team"))["env"]
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"]) == ("http://127.0.0.1:8000", "sk-team")
    assert "ANTHROPIC_CUSTOM_HEADERS" not in env


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cline", "--policy", "nope"], "--policy 'nope' is not in [routing.policies] (known: interactive)"),
        (["cursor", "--policy", "interactive"], "Cursor cannot send X-Route-Policy"),
        (["openai", "--base-url", "gw.example.com"], "--base-url 'gw.example.com' is not an http(s) URL"),
    ],
)
def test_mistakes_are_one_error_line_and_exit_1(
    capsys, config_file: str, args: list[str], message: str
) -> None:
    code, out, err = run(capsys, *args, "--config", config_file)
    assert code == 1 and out == ""
    assert err.startswith("latgate: error: " + message) and err.count("\n") == 1


def test_unknown_model_and_cursor_without_a_fast_alias_are_errors(capsys, tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["a", "b"]\n')
    code, _, err = run(capsys, "cline", "--config", str(path), "--model", "gpt-nope")
    assert code == 1 and "model 'gpt-nope' is not served here; available models: a, b" in err
    code, _, err = run(capsys, "cursor", "--config", str(path), "--latency-sensitive")
    assert code == 1 and "latency_sensitive = true" in err


def test_missing_config_is_one_error_line(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "cline", "--config", str(tmp_path / "none.toml"))
    assert code == 1 and err.startswith("latgate: error: ") and err.count("\n") == 1


def test_unknown_client_is_rejected_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(["clients", "vim"])
    assert exited.value.code == 2
    assert "invalid choice: 'vim'" in capsys.readouterr().err


# -- settings.example.json ------------------------------------------------------------


def test_settings_example_matches_the_bundled_config() -> None:
    settings = json.loads((ROOT / "settings.example.json").read_text())
    config = load_config(ROOT / "config.toml")
    api, models = settings["api"], settings["models"]
    assert api["base_url"] == f"http://{config.server.host}:{config.server.port}/v1"
    assert api["timeout_ms"] == upstream_timeout_seconds(config) * 1000  # the client never gives up first
    assert (api["max_retries"], settings["routing"]["stream"]) == (2, True)
    assert {models["default"], models["fallback"]} <= set(config.public_models())
    assert config.models[models["default"]].fallback_model == models["fallback"]
    decision = Router(config).decide({"model": models["default"], "messages": ASK}, {})
    assert (decision.provider, decision.reason) == ("tile-rt", "latency_sensitive")
    with_header = Router(config).decide(
        {"model": models["fallback"], "messages": ASK}, {k.lower(): v for k, v in api["headers"].items()}
    )
    assert with_header.provider == "tile-rt"


# -- the real CLI, as a user runs it ------------------------------------------------


def latgate_clients(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "latgate", "clients", *args], check=False, capture_output=True, text=True, timeout=60
    )


def test_openai_program_runs_as_printed(config_file: str, demo: Stack) -> None:
    printed_ = latgate_clients("openai", "--config", config_file, "--base-url", demo.v1, "--latency-sensitive")
    assert printed_.returncode == 0, printed_.stderr
    assert '"X-Latency-Sensitive": "1"' in printed_.stdout and "#" not in printed_.stdout
    ran = subprocess.run(
        [sys.executable, "-c", printed_.stdout], check=False, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},  # nothing from the environment
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    plain = latgate_clients("openai", "--config", config_file, "--base-url", demo.v1)
    assert "default_headers" not in plain.stdout  # no headers to send: none printed


def test_anthropic_program_runs_as_printed(config_file: str, demo: Stack) -> None:
    printed_ = latgate_clients("anthropic", "--config", config_file, "--base-url", demo.url, "--latency-sensitive")
    assert printed_.returncode == 0, printed_.stderr
    assert '"X-Latency-Sensitive": "1"' in printed_.stdout and "/v1" not in printed_.stdout
    ran = subprocess.run(
        [sys.executable, "-c", printed_.stdout], check=False, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr


def test_qwen_code_exports_reach_the_gateway(config_file: str, demo: Stack) -> None:
    printed_ = latgate_clients("qwen-code", "--config", config_file, "--base-url", demo.url)
    assert printed_.returncode == 0, printed_.stderr
    env = {}
    for line in printed_.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    assert set(env) == {"OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"}
    client = openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0)
    assert client.chat.completions.create(model=env["OPENAI_MODEL"], messages=ASK).choices[0].message.content
    refused = latgate_clients("qwen-code", "--config", config_file, "--policy", "interactive")
    assert refused.returncode == 1 and "Qwen Code cannot send X-Route-Policy" in refused.stderr


OWN_VLLM = """
[providers.vllm]
endpoints = ["http://127.0.0.1:9/v1"]
models = ["meta-llama/Meta-Llama-3-8B-Instruct"]
{timeout}
[aliases]
"llama-3-8b" = "meta-llama/Meta-Llama-3-8B-Instruct"   # the name clients may use

[routing]
default_route = "vllm"
"""


def test_settings_name_the_alias_clients_use_and_the_longest_upstream_timeout(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text(OWN_VLLM.format(timeout="timeout_sec = 900"))
    printed_ = latgate_clients("claude-code", "--config", str(path))
    assert printed_.returncode == 0, printed_.stderr
    env = json.loads(printed_.stdout)["env"]
    assert {env[name] for name in env if name.endswith("_MODEL")} == {"llama-3-8b"}
    assert env["API_TIMEOUT_MS"] == "900000"  # the provider's own timeout_sec, over the 600 s default
    path.write_text(OWN_VLLM.format(timeout=""))
    assert json.loads(latgate_clients("claude-code", "--config", str(path)).stdout)["env"]["API_TIMEOUT_MS"] == "600000"
