"""Routing rules and their order, on plain Config objects and on the two acceptance configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizer_file import whitespace_tokenizer

from latgate.foundation.config import load_config
from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.schema import (
    Config,
    EndpointConfig,
    ModelConfig,
    PolicyConfig,
    ProviderConfig,
    RoutingConfig,
)
from latgate.foundation.errors import InvalidRequest, NotFound
from latgate.routing.decision import Router, Target
from latgate.routing.models import same_model
from latgate.routing.tokens import ExactTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
PROVIDER_TABLE_LONG_PROMPT = "请总结以下内容：" + "测试" * 20000


def _provider(
    name: str, *models: str, latency_sensitive: bool = False, tokenizer: str | None = None
) -> ProviderConfig:
    return ProviderConfig(
        name=name,
        endpoints=(EndpointConfig(id=f"{name}-0", api_base=f"http://127.0.0.1:9/{name}"),),
        models=models,
        latency_sensitive=latency_sensitive,
        tokenizer=tokenizer,
    )


def _config(
    *providers: ProviderConfig,
    aliases: dict[str, dict[str, str]] | None = None,
    models: dict[str, ModelConfig] | None = None,
    **routing: Any,
) -> Config:
    providers = providers or (_provider("slow"), _provider("fast"), _provider("big"))
    routing.setdefault("default_route", providers[0].name)
    return Config(
        providers={p.name: p for p in providers},
        routing=RoutingConfig(**routing),
        aliases=aliases or {},
        models=models or {},
    )


def _chat(content: str = "Hello, how are you?", model: str | None = "m") -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    if model is not None:
        body["model"] = model
    return body


LONG = "word " * 3000  # ~3,000 tokens

ALL_RULES: dict[str, Any] = {
    "allow_route_override": True,
    "long_context_threshold": 1000,
    "long_context_provider": "big",
    "latency_threshold_ms": 200,
    "route_latency_sensitive_to": "fast",
    "policies": {
        "pin": PolicyConfig(route_to="big"),
        "quick": PolicyConfig(latency_sensitive=True, hedge=True),
    },
}


# -- each rule ------------------------------------------------------------------


def test_short_request_without_markers_takes_the_default_route() -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(), {})
    assert (decision.provider, decision.model, decision.reason) == ("slow", "m", "default")
    assert decision.candidates == (Target("slow", "m", "default"),)
    assert not decision.latency_sensitive and decision.budget_ms is None and decision.notes == ()


def test_route_to_header_is_honoured_when_overrides_are_allowed() -> None:
    decision = Router(_config(**ALL_RULES)).decide(
        _chat(LONG), {"x-route-to": "fast", "x-latency-sensitive": "1"}
    )
    assert (decision.provider, decision.reason) == ("fast", "override")


def test_route_to_header_is_ignored_with_a_note_when_overrides_are_off() -> None:
    decision = Router(_config()).decide(_chat(), {"x-route-to": "fast"})
    assert (decision.provider, decision.reason) == ("slow", "default")
    assert any("allow_route_override" in note for note in decision.notes)


def test_route_to_an_unknown_provider_is_a_bad_request_naming_the_header() -> None:
    with pytest.raises(InvalidRequest) as caught:
        Router(_config(**ALL_RULES)).decide(_chat(), {"x-route-to": "nope"})
    assert caught.value.param == "X-Route-To" and caught.value.status == 400
    assert "slow, fast, big" in caught.value.message


def test_long_prompt_routes_to_long_context_provider() -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(LONG), {"x-latency-sensitive": "true"})
    assert (decision.provider, decision.reason) == ("big", "long_context")
    assert decision.prompt_tokens > 1000
    assert decision.latency_sensitive  # still reported, though long context won


def test_prompt_exactly_at_the_threshold_is_not_long_context() -> None:
    router = Router(_config(**ALL_RULES))
    tokens = router.decide(_chat("abc " * 200), {}).prompt_tokens
    at_threshold = Router(_config(**dict(ALL_RULES, long_context_threshold=tokens)))
    assert at_threshold.decide(_chat("abc " * 200), {}).reason == "default"
    below = Router(_config(**dict(ALL_RULES, long_context_threshold=tokens - 1)))
    assert below.decide(_chat("abc " * 200), {}).reason == "long_context"


def test_policy_long_context_provider_replaces_the_routing_one() -> None:
    config = _config(**dict(ALL_RULES, policies={"lc": PolicyConfig(long_context_provider="fast")}))
    decision = Router(config).decide(_chat(LONG), {"x-route-policy": "lc"})
    assert (decision.provider, decision.reason, decision.policy) == ("fast", "long_context", "lc")


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", " 1 "])
def test_latency_sensitive_header_routes_to_the_latency_pool(value: str) -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(), {"x-latency-sensitive": value})
    assert (decision.provider, decision.reason) == ("fast", "latency_sensitive")
    assert decision.latency_sensitive and decision.budget_ms == 200


@pytest.mark.parametrize("value", ["0", "false", "no", ""])
def test_latency_sensitive_header_set_false_changes_nothing(value: str) -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(), {"x-latency-sensitive": value})
    assert (decision.provider, decision.reason, decision.latency_sensitive) == ("slow", "default", False)


def test_budget_at_or_under_the_threshold_is_latency_sensitive_and_over_it_is_not() -> None:
    router = Router(_config(**ALL_RULES))
    at = router.decide(_chat(), {"x-latency-budget-ms": "200"})
    assert (at.provider, at.reason, at.budget_ms) == ("fast", "latency_sensitive", 200)
    over = router.decide(_chat(), {"x-latency-budget-ms": "201"})
    assert (over.provider, over.reason, over.budget_ms, over.latency_sensitive) == (
        "slow",
        "default",
        201,
        False,
    )


@pytest.mark.parametrize("value", ["fast", "-5", "1.5", "1e3", "100ms"])
def test_a_malformed_budget_is_a_bad_request_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        Router(_config(**ALL_RULES)).decide(_chat(), {"x-latency-budget-ms": value})
    assert caught.value.param == "X-Latency-Budget-Ms"


def test_a_malformed_latency_flag_is_a_bad_request_naming_the_header() -> None:
    with pytest.raises(InvalidRequest) as caught:
        Router(_config(**ALL_RULES)).decide(_chat(), {"x-latency-sensitive": "maybe"})
    assert caught.value.param == "X-Latency-Sensitive"


def test_policy_can_mark_requests_latency_sensitive_by_flag_or_budget() -> None:
    config = _config(
        **dict(
            ALL_RULES,
            policies={
                "quick": PolicyConfig(latency_sensitive=True, hedge=True),
                "tight": PolicyConfig(latency_budget_ms=150),
                "loose": PolicyConfig(latency_budget_ms=900),
            },
        )
    )
    router = Router(config)
    quick = router.decide(_chat(), {"x-route-policy": "quick"})
    assert (quick.provider, quick.reason, quick.hedge, quick.budget_ms) == (
        "fast",
        "latency_sensitive",
        True,
        200,
    )
    tight = router.decide(_chat(), {"x-route-policy": "tight"})
    assert (tight.provider, tight.budget_ms) == ("fast", 150)
    loose = router.decide(_chat(), {"x-route-policy": "loose"})
    assert (loose.provider, loose.latency_sensitive, loose.budget_ms) == ("slow", False, 900)


def test_model_marked_latency_sensitive_goes_to_the_latency_pool() -> None:
    config = _config(models={"m": ModelConfig(latency_sensitive=True)}, **ALL_RULES)
    decision = Router(config).decide(_chat(), {})
    assert (decision.provider, decision.reason) == ("fast", "latency_sensitive")


def test_provider_flag_names_the_latency_pool_when_routing_does_not() -> None:
    config = _config(_provider("slow"), _provider("fast", latency_sensitive=True), latency_threshold_ms=200)
    decision = Router(config).decide(_chat(), {"x-latency-sensitive": "1"})
    assert (decision.provider, decision.reason) == ("fast", "latency_sensitive")


def test_latency_sensitive_without_a_latency_pool_takes_the_default_with_a_note() -> None:
    decision = Router(_config()).decide(_chat(), {"x-latency-sensitive": "1"})
    assert (decision.provider, decision.reason, decision.latency_sensitive) == ("slow", "default", True)
    assert any("route_latency_sensitive_to" in note for note in decision.notes)


def test_policy_route_to_from_header_or_key() -> None:
    router = Router(_config(**ALL_RULES))
    by_header = router.decide(_chat(), {"x-route-policy": "pin"})
    assert (by_header.provider, by_header.reason, by_header.policy) == ("big", "policy:pin", "pin")
    by_key = router.decide(_chat(), {}, key_policy="pin")
    assert (by_key.provider, by_key.reason) == ("big", "policy:pin")
    header_wins = router.decide(_chat(), {"x-route-policy": "quick"}, key_policy="pin")
    assert header_wins.policy == "quick"


def test_unknown_policy_is_ignored_with_a_note() -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(), {"x-route-policy": "nope"})
    assert (decision.provider, decision.reason, decision.policy) == ("slow", "default", None)
    assert any("'nope'" in note for note in decision.notes)


def test_model_only_another_provider_serves_routes_to_it() -> None:
    config = _config(_provider("general", "a", "b"), _provider("special", "c"), _provider("also", "c"))
    decision = Router(config).decide(_chat(model="c"), {})
    assert (decision.provider, decision.model, decision.reason) == ("special", "c", "model")


def test_model_rule_prefers_a_provider_that_lists_the_model_over_one_that_serves_anything() -> None:
    config = _config(_provider("general", "a"), _provider("any"), _provider("special", "c"))
    decision = Router(config).decide(_chat(model="c"), {})
    assert (decision.provider, decision.reason) == ("special", "model")


def test_unknown_model_is_404_listing_the_available_models() -> None:
    config = _config(_provider("general", "a", "b"), _provider("special", "c", "d"))
    with pytest.raises(NotFound) as caught:
        Router(config).decide(_chat(model="gpt-4o"), {})
    error = caught.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert "'gpt-4o'" in error.message and "a, b, c, d" in error.message


def test_missing_model_uses_default_model_or_is_a_bad_request() -> None:
    assert Router(_config(default_model="dm")).decide(_chat(model=None), {}).public_model == "dm"
    with pytest.raises(InvalidRequest) as caught:
        Router(_config()).decide(_chat(model=None), {})
    assert caught.value.param == "model" and caught.value.message == "model is required"
    with pytest.raises(InvalidRequest):
        Router(_config()).decide({"model": 7}, {})


# -- upstream model names ----------------------------------------------------------


def test_explicit_alias_beats_serving_the_name_as_is() -> None:
    config = _config(_provider("p"), aliases={"m": {"p": "org/m-v2"}})
    decision = Router(config).decide(_chat(), {})
    assert (decision.model, decision.public_model) == ("org/m-v2", "m")


def test_single_model_provider_takes_a_public_name_of_the_same_model_family() -> None:
    config = _config(
        _provider("hosted", "llama-3-8b-instruct"),
        _provider("local", "meta-llama/Meta-Llama-3-8B-Instruct"),
        long_context_threshold=100,
        long_context_provider="local",
    )
    decision = Router(config).decide(_chat(LONG, model="llama-3-8b-instruct"), {})
    assert (decision.provider, decision.model) == ("local", "meta-llama/Meta-Llama-3-8B-Instruct")


def test_single_model_provider_never_substitutes_a_different_model() -> None:
    config = _config(
        _provider("hosted", "llama-3-8b-instruct", "qwen2.5-72b-instruct"),
        _provider("local", "meta-llama/Meta-Llama-3-8B-Instruct"),
        long_context_threshold=100,
        long_context_provider="local",
    )
    decision = Router(config).decide(_chat(LONG, model="qwen2.5-72b-instruct"), {})
    assert (decision.provider, decision.model, decision.reason) == (
        "hosted",
        "qwen2.5-72b-instruct",
        "default",
    )
    assert any("long_context rule skipped" in note and "local" in note for note in decision.notes)


def test_a_name_no_provider_lists_is_a_404_listing_the_available_names() -> None:
    config = _config(
        _provider("general", "a", "b"), _provider("local", "org/Local-7B"), _provider("other", "c")
    )
    with pytest.raises(NotFound) as raised:
        Router(config).decide(_chat(model="gpt-4o"), {})
    assert raised.value.code == "model_not_found" and raised.value.status == 404
    assert "'gpt-4o'" in raised.value.message and "a, b, org/Local-7B, c" in raised.value.message


def test_the_default_routes_single_model_is_not_a_catch_all() -> None:
    config = _config(_provider("d", "coder-large"), _provider("c", "coder"), default_route="d")
    with pytest.raises(NotFound):
        Router(config).decide(_chat(model="gpt-4o"), {})


def test_a_catch_all_alias_serves_names_no_provider_lists() -> None:
    config = _config(
        _provider("general", "a"), _provider("local", "org/Local-7B"), aliases={"*": {"local": "org/Local-7B"}}
    )
    decision = Router(config).decide(_chat(model="gpt-4o"), {})
    assert (decision.provider, decision.model, decision.public_model) == ("local", "org/Local-7B", "gpt-4o")
    assert Router(config).decide(_chat(model="a"), {}).provider == "general"  # listed names still win


def test_a_provider_without_a_models_list_still_serves_any_name() -> None:
    config = _config(_provider("listed", "a"), _provider("any"), default_route="listed")
    decision = Router(config).decide(_chat(model="gpt-4o"), {})
    assert (decision.provider, decision.model, decision.reason) == ("any", "gpt-4o", "model")


def test_default_model_fills_a_request_naming_none() -> None:
    config = _config(_provider("p", "a", "b"), default_model="b")
    decision = Router(config).decide(_chat(model=None), {})
    assert (decision.provider, decision.model, decision.public_model) == ("p", "b", "b")


def test_an_exact_listed_name_goes_to_the_provider_listing_it_not_the_default_route() -> None:
    config = _config(_provider("d", "coder-large"), _provider("c", "coder"), default_route="d")
    decision = Router(config).decide(_chat(model="coder"), {})
    assert (decision.provider, decision.model, decision.reason) == ("c", "coder", "model")


@pytest.mark.parametrize("asked", ["QWEN2.5-7B", "Qwen/Qwen2.5-7B"])
def test_a_case_or_org_variant_of_a_listed_name_is_a_404_naming_the_listed_one(asked: str) -> None:
    config = _config(_provider("d", "coder-large"), _provider("a", "qwen2.5-7b"), default_route="d")
    with pytest.raises(NotFound) as raised:
        Router(config).decide(_chat(model=asked), {})
    assert "did you mean 'qwen2.5-7b'" in raised.value.message


def _qwen_pair(**routing: Any) -> Config:
    return _config(_provider("a", "qwen2.5-7b"), _provider("b", "qwen2.5-7b-instruct"), **routing)


def test_a_long_prompt_never_becomes_an_instruct_model_of_the_same_size() -> None:
    decision = Router(_qwen_pair(long_context_threshold=100, long_context_provider="b")).decide(
        _chat(LONG, model="qwen2.5-7b"), {}
    )
    assert (decision.provider, decision.model, decision.reason) == ("a", "qwen2.5-7b", "default")
    assert any("long_context rule skipped" in n and "'qwen2.5-7b-instruct' is another model" in n for n in decision.notes)


def test_a_fallback_serving_another_model_of_the_family_is_skipped_with_a_note() -> None:
    decision = Router(_qwen_pair(fallbacks={"a": ("b",)})).decide(_chat(model="qwen2.5-7b"), {})
    assert decision.candidates == (Target("a", "qwen2.5-7b", "default"),)
    assert any("fallback b skipped" in n and "another model" in n for n in decision.notes)


def test_an_explicit_alias_can_always_map_onto_another_model() -> None:
    config = _qwen_pair(fallbacks={"a": ("b",)}, aliases={"qwen2.5-7b": {"a": "qwen2.5-7b", "b": "qwen2.5-7b-instruct"}})
    decision = Router(config).decide(_chat(model="qwen2.5-7b"), {})
    assert decision.candidates[1:] == (Target("b", "qwen2.5-7b-instruct", "fallback:a"),)


@pytest.mark.parametrize(
    ("public", "served", "same"),
    [
        ("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct", True),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B", True),
        ("QWEN2.5-7B", "qwen2.5-7b", True),
        ("gemma-2-9b", "google/google-gemma-2-9b", True),
        ("qwen2.5-7b", "qwen2.5-7b-instruct", False),
        ("gpt-4o", "gpt-4o-mini", False),
        ("deepseek-r1", "deepseek-r1-distill-qwen-7b", False),
        ("qwen2.5-7b", "qwen2.5-14b", False),
        ("llama-3-8b", "llama-3.1-8b", False),
        ("glm-5.1", "zai-org/GLM-5.1-FP8", False),
        ("deepseek-r1", "deepseek-ai/DeepSeek-R1", True),
        ("r1", "deepseek-ai/DeepSeek-R1", False),
    ],
)
def test_same_model_is_name_equality_after_case_org_prefix_and_vendor_word(public: str, served: str, same: bool) -> None:
    assert same_model(public, served) is same


@pytest.mark.parametrize("rule", ["latency_sensitive", "policy", "fallback", "override"])
def test_every_configured_rule_maps_onto_a_single_model_of_the_same_name(rule: str) -> None:
    hosted, local = _provider("hosted", "llama-3-8b-instruct"), _provider("local", "meta-llama/Meta-Llama-3-8B-Instruct")
    routing: dict[str, Any] = {
        "latency_sensitive": {"route_latency_sensitive_to": "local"},
        "policy": {"policies": {"p": PolicyConfig(route_to="local")}},
        "fallback": {"fallbacks": {"hosted": ("local",)}},
        "override": {"allow_route_override": True},
    }[rule]
    headers = {"latency_sensitive": {"x-latency-sensitive": "1"}, "policy": {"x-route-policy": "p"}, "override": {"x-route-to": "local"}}.get(rule, {})
    decision = Router(_config(hosted, local, **routing)).decide(_chat(model="llama-3-8b-instruct"), headers)
    target = decision.candidates[1] if rule == "fallback" else decision.candidates[0]
    assert (target.provider, target.model) == ("local", "meta-llama/Meta-Llama-3-8B-Instruct")


def test_rule_whose_provider_cannot_serve_the_model_is_skipped_for_the_next_rule() -> None:
    config = _config(_provider("slow"), _provider("fast", "other", "another"), _provider("big"), **ALL_RULES)
    decision = Router(config).decide(_chat(), {"x-latency-sensitive": "1", "x-route-policy": "pin"})
    assert (decision.provider, decision.reason) == ("big", "policy:pin")
    assert any("latency_sensitive rule skipped" in note for note in decision.notes)


# -- order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "content", "expected"),
    [
        (
            {"x-route-to": "slow", "x-latency-sensitive": "1", "x-route-policy": "pin"},
            LONG,
            ("slow", "override"),
        ),
        ({"x-latency-sensitive": "1", "x-route-policy": "pin"}, LONG, ("big", "long_context")),
        ({"x-latency-sensitive": "1", "x-route-policy": "pin"}, "hi", ("fast", "latency_sensitive")),
        ({"x-route-policy": "pin"}, "hi", ("big", "policy:pin")),
        ({}, "hi", ("slow", "default")),
    ],
)
def test_rules_apply_in_design_order(
    headers: dict[str, str], content: str, expected: tuple[str, str]
) -> None:
    decision = Router(_config(**ALL_RULES)).decide(_chat(content), headers)
    assert (decision.provider, decision.reason) == expected


# -- fallbacks ------------------------------------------------------------------------


def test_fallbacks_follow_the_primary_in_order_with_their_own_model_names() -> None:
    config = _config(
        _provider("a"),
        _provider("b", "other"),
        _provider("c"),
        _provider("d"),
        aliases={"m": {"d": "served-m"}},
        fallbacks={"a": ("b", "c", "d")},
    )
    decision = Router(config).decide(_chat(), {})
    assert decision.candidates == (
        Target("a", "m", "default"),
        Target("c", "m", "fallback:a"),
        Target("d", "served-m", "fallback:a"),
    )
    assert any("fallback b skipped" in note for note in decision.notes)


def test_fallback_model_is_tried_on_the_same_provider_when_no_fallback_provider_exists() -> None:
    config = _config(_provider("p"), models={"glm-5.1-highspeed": ModelConfig(fallback_model="glm-5.1")})
    decision = Router(config).decide(_chat(model="glm-5.1-highspeed"), {})
    assert decision.candidates == (
        Target("p", "glm-5.1-highspeed", "default"),
        Target("p", "glm-5.1", "fallback:p", fallback_model="glm-5.1"),
    )


def test_fallback_provider_that_lacks_the_model_may_take_the_fallback_model() -> None:
    config = _config(
        _provider("a", "fast-m", "m"),
        _provider("b", "m"),
        models={"fast-m": ModelConfig(fallback_model="m")},
        fallbacks={"a": ("b",)},
    )
    decision = Router(config).decide(_chat(model="fast-m"), {})
    assert decision.candidates[1:] == (Target("b", "m", "fallback:a", fallback_model="m"),)


def test_a_fallback_model_reached_through_the_same_model_rule_is_still_reported() -> None:
    """A fallback provider serving one model under its own spelling takes the fallback
    model by the same-model rule: the target still says which public model it stands in for."""
    config = _config(
        _provider("a", "glm-5.1-highspeed"),
        _provider("b", "zai-org/GLM-5.1"),
        models={"glm-5.1-highspeed": ModelConfig(fallback_model="glm-5.1")},
        fallbacks={"a": ("b",)},
    )
    decision = Router(config).decide(_chat(model="glm-5.1-highspeed"), {})
    assert decision.candidates[1:] == (Target("b", "zai-org/GLM-5.1", "fallback:a", fallback_model="glm-5.1"),)


# -- exact tokenizer ----------------------------------------------------------------


def test_long_context_comparison_uses_the_providers_exact_tokenizer(tmp_path: Path) -> None:
    path = whitespace_tokenizer(tmp_path / "tokenizer.json")
    prompt = "测试" * 600  # estimate 1,200 tokens; one unknown "word" to this tokenizer
    rules: dict[str, Any] = {"long_context_threshold": 1000, "long_context_provider": "big"}
    estimated = Router(_config(_provider("slow"), _provider("big"), **rules)).decide(_chat(prompt), {})
    assert (estimated.reason, estimated.prompt_tokens > 1000) == ("long_context", True)
    exact = Router(_config(_provider("slow"), _provider("big", tokenizer=str(path)), **rules)).decide(
        _chat(prompt), {}
    )
    assert exact.reason == "default"
    assert exact.prompt_tokens == ExactTokenizer(path).count_prompt(_chat(prompt)) < 20


def test_unloadable_tokenizer_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    config = _config(_provider("slow"), _provider("big", tokenizer=str(tmp_path / "missing.json")))
    with pytest.raises(ConfigError, match=r"providers\.big\.tokenizer"):
        Router(config)


# -- the acceptance configs (tests/fixtures/acceptance) -------------------------------


@pytest.fixture(scope="module")
def provider_table() -> Router:
    return Router(load_config(FIXTURES / "acceptance" / "provider-table.config.toml"))


@pytest.fixture(scope="module")
def pool_sections() -> Router:
    return Router(load_config(FIXTURES / "pool-sections.with-addresses.config.toml"))


def test_provider_table_short_chat_goes_to_taotoken_by_default(provider_table: Router) -> None:
    decision = provider_table.decide(_chat(model="llama-3-8b-instruct"), {})
    assert (decision.provider, decision.model, decision.reason) == (
        "taotoken",
        "llama-3-8b-instruct",
        "default",
    )


def test_provider_table_long_cjk_prompt_goes_to_sglang_tilelang_with_the_served_model_name(provider_table: Router) -> None:
    decision = provider_table.decide(_chat(PROVIDER_TABLE_LONG_PROMPT, model="llama-3-8b-instruct"), {})
    assert (decision.provider, decision.reason) == ("sglang_tilelang", "long_context")
    assert decision.model == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert decision.public_model == "llama-3-8b-instruct"
    assert decision.prompt_tokens > 16384


def test_provider_table_cline_policy_header_naming_no_policy_still_routes_long_prompts(provider_table: Router) -> None:
    headers = {"x-route-policy": "long-context-prefer-tilelang"}
    decision = provider_table.decide(_chat(PROVIDER_TABLE_LONG_PROMPT, model="llama-3-8b-instruct"), headers)
    assert (decision.provider, decision.reason) == ("sglang_tilelang", "long_context")
    assert any("long-context-prefer-tilelang" in note for note in decision.notes)
    short = provider_table.decide(_chat(model="llama-3-8b-instruct"), headers)
    assert (short.provider, short.reason) == ("taotoken", "default")


def test_provider_table_request_without_model_uses_the_default_model(provider_table: Router) -> None:
    decision = provider_table.decide(_chat(model=None), {})
    assert (decision.provider, decision.model) == ("taotoken", "llama-3-8b-instruct")


def test_provider_table_served_name_goes_to_the_first_local_instance_by_model_rule(provider_table: Router) -> None:
    decision = provider_table.decide(_chat(model="meta-llama/Meta-Llama-3-8B-Instruct"), {})
    assert (decision.provider, decision.reason) == ("sglang_local", "model")


@pytest.mark.parametrize(
    ("headers", "provider", "reason"),
    [
        ({"x-latency-sensitive": "1"}, "tile-rt", "latency_sensitive"),
        ({"x-latency-budget-ms": "150"}, "tile-rt", "latency_sensitive"),
        ({"x-latency-budget-ms": "500"}, "vllm", "default"),
        ({}, "vllm", "default"),
    ],
)
def test_pool_sections_latency_marker_routes_to_tile_rt_and_the_rest_to_vllm(
    pool_sections: Router, headers: dict[str, str], provider: str, reason: str
) -> None:
    decision = pool_sections.decide(_chat(model="glm-5.1-highspeed"), headers)
    assert (decision.provider, decision.reason) == (provider, reason)


def test_pool_sections_fallback_model_glm_5_1_backs_up_glm_5_1_highspeed(pool_sections: Router) -> None:
    decision = pool_sections.decide(_chat(model="glm-5.1-highspeed"), {"x-latency-sensitive": "1"})
    assert decision.candidates[1:] == (Target("tile-rt", "glm-5.1", "fallback:tile-rt", fallback_model="glm-5.1"),)
