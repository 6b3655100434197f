"""The two acceptance configs, end to end: their files (the provider table verbatim, the pool
sections with the engine addresses they lack) with every address pointed at a simulator on loopback, and
the official openai SDK as the client, routing as tests/fixtures/acceptance/README.md says."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from stack import FAST, gateway, simulators

from latgate.commands.sim import SimOptions

FIXTURES = Path(__file__).parent / "fixtures"
LONG_CJK_PROMPT = "请总结以下内容：" + "测试" * 20000


def provider_table_text(urls: dict[str, str]) -> str:
    text = (FIXTURES / "acceptance" / "provider-table.config.toml").read_text(encoding="utf-8")
    return (
        text.replace("http://127.0.0.1:30000/v1", urls["sglang_local"] + "/v1")
        .replace("http://127.0.0.1:30001/v1", urls["sglang_tilelang"] + "/v1")
        .replace("https://taotoken.net/api", urls["taotoken"] + "/api")
    )


def provider_table_sims():
    served = ("meta-llama/Meta-Llama-3-8B-Instruct",)
    return simulators(
        {
            "taotoken": SimOptions(name="taotoken", models=("llama-3-8b-instruct", "qwen2.5-72b-instruct"), **FAST),
            "sglang_local": SimOptions(name="sglang_local", models=served, **FAST),
            "sglang_tilelang": SimOptions(name="sglang_tilelang", models=served, prefill_tokens_per_second=1e6, **FAST),
        }
    )


def test_provider_table_short_chat_goes_to_the_default_channel_with_text_and_usage() -> None:
    with provider_table_sims() as sims, gateway(provider_table_text({k: v[0] for k, v in sims.items()})) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3-8b-instruct", messages=[{"role": "user", "content": "hello"}]
        )
        completion = raw.parse()
        assert raw.headers["x-latgate-provider"] == "taotoken"
        assert raw.headers["x-latgate-route-reason"] == "default"
        assert completion.choices[0].message.content
        assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
        assert sims["taotoken"][1].stats.last_request.path.endswith("/api/v1/chat/completions")


def test_provider_table_long_chinese_prompt_goes_to_sglang_tilelang_with_the_served_model_and_extra_body() -> None:
    with provider_table_sims() as sims, gateway(provider_table_text({k: v[0] for k, v in sims.items()})) as gw:
        # as provider-table.cline-settings.json configures Cline: a custom X-Route-Policy header
        client = openai.OpenAI(
            base_url=gw.url + "/v1",
            api_key="k",
            max_retries=0,
            default_headers={"X-Route-Policy": "long-context-prefer-tilelang"},
        )
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3-8b-instruct",
            messages=[{"role": "user", "content": LONG_CJK_PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=8,
        )
        chunks = list(raw.parse())
        assert raw.headers["x-latgate-provider"] == "sglang_tilelang"
        assert raw.headers["x-latgate-route-reason"] == "long_context"
        assert raw.headers["x-latgate-upstream-model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
        assert int(raw.headers["x-latgate-prompt-tokens"]) > 16384
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens > 16384
        assert {c.model for c in chunks} == {"llama-3-8b-instruct"}  # the name the client asked for
        sent = sims["sglang_tilelang"][1].stats.last_request.body
        assert sent["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
        assert sent["top_k"] == 1 and sent["custom_op"] == "flash_attn_fwd"
        assert sims["taotoken"][1].stats.requests_total == 0


def pool_sections_text(urls: dict[str, str]) -> str:
    text = (FIXTURES / "pool-sections.with-addresses.config.toml").read_text(encoding="utf-8")
    return (
        text.replace("http://127.0.0.1:18101/v1", urls["tile-rt"] + "/v1")
        .replace("http://127.0.0.1:18102/v1", urls["vllm"] + "/v1")
        .replace("https://taotoken.net/api", urls["upstream"] + "/api")
    )


def pool_sections_sims():
    return simulators(
        {
            "tile-rt": SimOptions(name="tile-rt", max_batch_size=8, prefix_cache=True, **FAST),
            "vllm": SimOptions(name="vllm", **FAST),
            "upstream": SimOptions(name="upstream", **FAST),
        }
    )


def test_pool_sections_latency_sensitive_request_streams_from_the_tile_rt_decode_pool() -> None:
    with pool_sections_sims() as sims, gateway(pool_sections_text({k: v[0] for k, v in sims.items()})) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        for headers in ({"X-Latency-Sensitive": "1"}, {"X-Latency-Budget-Ms": "200"}):
            raw = client.chat.completions.with_raw_response.create(
                model="glm-5.1-highspeed",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers=headers,
            )
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            assert raw.headers["x-latgate-provider"] == "tile-rt"
            assert raw.headers["x-latgate-route-reason"] == "latency_sensitive"
            assert text
        assert sims["tile-rt"][1].stats.requests_total == 2
        assert sims["vllm"][1].stats.requests_total == 0


def test_pool_sections_unmarked_request_stays_on_the_vllm_pool() -> None:
    with pool_sections_sims() as sims, gateway(pool_sections_text({k: v[0] for k, v in sims.items()})) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="glm-5.1", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Latency-Budget-Ms": "201"}
        )
        raw.parse()
        assert raw.headers["x-latgate-provider"] == "vllm"
        assert raw.headers["x-latgate-route-reason"] == "default"
        assert sims["tile-rt"][1].stats.requests_total == 0


POOL_SECTIONS_SHAPE_TABLES = """
[providers.tile-rt]
api_base = "{tile-rt}/v1"
connector = "vllm"
max_batch_size = 8
[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
[routing]
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
default_route = "vllm"
"""


def pool_sections_shape_tables(urls: dict[str, str]) -> str:
    """The pool_sections shape written as provider tables without roles (no role prior to help)."""
    return POOL_SECTIONS_SHAPE_TABLES.replace("{tile-rt}", urls["tile-rt"]).replace("{vllm}", urls["vllm"])


@pytest.mark.parametrize("config", [pool_sections_text, pool_sections_shape_tables], ids=["pool_sections", "provider-tables"])
def test_pool_sections_after_an_ordinary_stream_latency_sensitive_requests_still_reach_the_idle_decode_pool(config) -> None:
    with pool_sections_sims() as sims, gateway(config({k: v[0] for k, v in sims.items()})) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        ordinary = client.chat.completions.with_raw_response.create(
            model="glm-5.1-highspeed", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        list(ordinary.parse())
        assert ordinary.headers["x-latgate-provider"] == "vllm"
        for _ in range(5):
            raw = client.chat.completions.with_raw_response.create(
                model="glm-5.1-highspeed",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"X-Latency-Sensitive": "1", "X-Latgate-Debug": "1"},
            )
            assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            assert raw.headers["x-latgate-provider"] == "tile-rt", raw.headers.get("x-latgate-route-candidates")
            assert raw.headers["x-latgate-route-reason"] == "latency_sensitive"
        assert sims["tile-rt"][1].stats.requests_total == 5
