"""``latgate route``: the routing dry run, as a subprocess and in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from route_command import run_route

FIXTURES = Path(__file__).parent / "fixtures"
POOL_SECTIONS = FIXTURES / "pool-sections.with-addresses.config.toml"
PROVIDER_TABLE = FIXTURES / "acceptance" / "provider-table.config.toml"
PROVIDER_TABLE_LONG_PROMPT = "请总结以下内容：" + "测试" * 20000


def _write_body(tmp_path: Path, body: object, name: str = "request.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")
    return path


def test_route_command_sends_provider_table_long_cjk_prompt_to_sglang_tilelang(tmp_path: Path) -> None:
    body = _write_body(
        tmp_path,
        {"model": "llama-3-8b-instruct", "messages": [{"role": "user", "content": PROVIDER_TABLE_LONG_PROMPT}]},
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "latgate",
            "route",
            "--config",
            str(PROVIDER_TABLE),
            "-H",
            "X-Route-Policy: long-context-prefer-tilelang",
            str(body),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert decision["provider"] == "sglang_tilelang"
    assert decision["endpoint"] == "sglang_tilelang-0"
    assert decision["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert decision["reason"] == "long_context"
    assert decision["prompt_tokens"] > 16384
    assert decision["latency_sensitive"] is False
    assert decision["candidates"][0] == {
        "provider": "sglang_tilelang",
        "endpoint": "sglang_tilelang-0",
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "reason": "long_context",
    }
    assert "long-context-prefer-tilelang" in decision["notes"][0]
    assert decision["notes"][1:] == ["sglang_tilelang is sent model 'meta-llama/Meta-Llama-3-8B-Instruct' for 'llama-3-8b-instruct'"]


def test_route_command_reports_an_unknown_model_in_one_line_and_exits_1(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[providers.hosted]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["llama-3-8b-instruct", "qwen2.5-72b-instruct"]\n',
        encoding="utf-8",
    )
    body = _write_body(tmp_path, {"model": "gpt-4o", "messages": []})
    result = subprocess.run(
        [sys.executable, "-m", "latgate", "route", "--config", str(config), str(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "gpt-4o" in result.stderr and "llama-3-8b-instruct, qwen2.5-72b-instruct" in result.stderr


@pytest.mark.parametrize(
    ("headers", "provider", "reason"),
    [
        (["X-Latency-Sensitive: 1"], "tile-rt", "latency_sensitive"),
        (["x-latency-budget-ms:150"], "tile-rt", "latency_sensitive"),
        (["X-Latency-Budget-Ms: 500"], "vllm", "default"),
    ],
)
def test_route_headers_mark_latency_on_pool_sections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], headers: list[str], provider: str, reason: str
) -> None:
    body = _write_body(
        tmp_path, {"model": "glm-5.1-highspeed", "messages": [{"role": "user", "content": "hi"}]}
    )
    args = [arg for header in headers for arg in ("-H", header)]
    code, out, _ = run_route("--config", str(POOL_SECTIONS), *args, str(body), capsys=capsys)
    decision = json.loads(out)
    assert code == 0
    assert (decision["provider"], decision["reason"], decision["endpoint"]) == (
        provider,
        reason,
        f"{provider}-0",
    )
    assert decision["candidates"][1] == {
        "provider": provider,
        "endpoint": f"{provider}-0",
        "model": "glm-5.1",
        "reason": f"fallback:{provider}",
    }


def test_route_reads_the_body_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr(
        sys, "stdin", io.StringIO(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    )
    code, out, _ = run_route("--config", str(PROVIDER_TABLE), "-", capsys=capsys)
    assert code == 0
    assert json.loads(out)["model"] == "llama-3-8b-instruct"  # provider_table's default_model


def test_route_uses_latgate_config_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LATGATE_CONFIG", str(PROVIDER_TABLE))
    code, out, _ = run_route(str(_write_body(tmp_path, {"model": "qwen2.5-72b-instruct"})), capsys=capsys)
    assert code == 0 and json.loads(out)["provider"] == "taotoken"


@pytest.mark.parametrize(
    ("argv_tail", "body", "message"),
    [
        ([], "{not json", "not valid JSON"),
        ([], "[1, 2]", "must be a JSON object"),
        (["-H", "X-Latency-Budget-Ms: soon"], '{"model": "llama-3-8b-instruct"}', "X-Latency-Budget-Ms"),
        (["-H", "no colon here"], '{"model": "llama-3-8b-instruct"}', "'Name: value'"),
    ],
)
def test_route_bad_input_is_one_error_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv_tail: list[str], body: str, message: str
) -> None:
    path = tmp_path / "request.json"
    path.write_text(body, encoding="utf-8")
    code, out, err = run_route("--config", str(PROVIDER_TABLE), *argv_tail, str(path), capsys=capsys)
    assert code == 1 and out == ""
    assert err.startswith("latgate: error: ") and err.count("\n") == 1
    assert message in err


def test_route_missing_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_route("--config", str(PROVIDER_TABLE), str(tmp_path / "absent.json"), capsys=capsys)
    assert code == 1 and "absent.json: no such file" in err
    body = _write_body(tmp_path, {"model": "m"})
    code, _, err = run_route("--config", str(tmp_path / "absent.toml"), str(body), capsys=capsys)
    assert code == 1 and "absent.toml" in err and err.count("\n") == 1


def test_route_config_error_is_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verbatim_pool_sections = FIXTURES / "acceptance" / "pool-sections.config.toml"  # two sections without an address
    code, out, err = run_route(
        "--config", str(verbatim_pool_sections), str(_write_body(tmp_path, {"model": "m"})), capsys=capsys
    )
    assert code == 1 and out == "" and err.count("\n") == 3
    *problems, count = err.splitlines()
    assert all(line.startswith(f"latgate: error: {verbatim_pool_sections}:") for line in problems)
    assert count == f"latgate: error: 2 errors in {verbatim_pool_sections}"


def test_route_into_a_reader_that_left_exits_quietly(tmp_path: Path) -> None:
    """`latgate route X.json | head`: the pipe is gone before the decision is printed."""
    body = _write_body(tmp_path, {"messages": [{"role": "user", "content": "hi"}]})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "latgate", "route", "--config", str(PROVIDER_TABLE), str(body)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_route_example_request_routes_on_the_demo_config_as_printed() -> None:
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "LATGATE_CONFIG"}  # ./config.toml: the demo's
    result = subprocess.run(
        [sys.executable, "-m", "latgate", "route", "examples/REQUEST.json"],
        capture_output=True, text=True, timeout=60, check=False, cwd=root, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert (decision["provider"], decision["reason"], decision["public_model"]) == (
        "tile-rt",
        "latency_sensitive",
        "glm-5.1-highspeed",
    )


def test_route_example_request_with_another_config_names_the_models_it_serves() -> None:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "latgate", "route", "examples/REQUEST.json",
         "--config", "tests/fixtures/acceptance/provider-table.config.toml"],
        capture_output=True, text=True, timeout=60, check=False, cwd=root,
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("latgate: error: 404: model 'glm-5.1-highspeed' is not served here; available models: ")
    assert "llama-3-8b-instruct, qwen2.5-72b-instruct" in line
    assert line.endswith('set "model" in examples/REQUEST.json to one of them (it is written for the bundled config.toml)')
    help_text = subprocess.run(
        [sys.executable, "-m", "latgate", "route", "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    assert "bundled" in help_text and "config.toml" in help_text
    assert "contacting nothing" not in help_text and "--url asks a running gateway" in help_text
