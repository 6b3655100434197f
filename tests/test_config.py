"""config.toml loading: both accepted shapes, env expansion, aliases, replicas, and every mistake
reported as one line naming the file, the key and the fix."""

from __future__ import annotations

import re
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from latgate.foundation.config import (
    ConfigError,
    config_warnings,
    connector_names,
    load_config,
    load_config_text,
    resolve_config_path,
)
from latgate.live.connectors import known_connectors

ACCEPTANCE = Path(__file__).parent / "fixtures" / "acceptance"
VLLM = '[providers.vllm]\napi_base = "http://127.0.0.1:8001/v1"\n'
TWO_POOLS = VLLM + '[providers.fast]\napi_base = "http://127.0.0.1:8002/v1"\nmodels = ["glm-fast"]\n'


def load(text: str, *, env: dict[str, str] | None = None):
    return load_config_text(textwrap.dedent(text), source="gw.toml", env=env or {})


def error(text: str, *, env: dict[str, str] | None = None) -> str:
    """The message of the ConfigError loading ``text`` raises, checked to be one line
    with a line number, returned without it (``gw.toml: KEY: ...``; the line numbers
    have their own tests in test_config_errors.py)."""
    with pytest.raises(ConfigError) as caught:
        load(text, env=env)
    message = str(caught.value)
    assert "\n" not in message
    assert re.match(r"gw\.toml(:\d+)?: ", message), message
    assert caught.value.fix, "every message says how to fix it"
    return re.sub(r"^gw\.toml:\d+: ", "gw.toml: ", message)


def pool_sections_with_addresses() -> str:
    text = (ACCEPTANCE / "pool-sections.config.toml").read_text()
    text = text.replace('engine = "tile-rt"\n', 'engine = "tile-rt"\napi_base = "http://127.0.0.1:8001/v1"\n')
    return text.replace('engine = "vllm"\n', 'engine = "vllm"\napi_base = "http://127.0.0.1:8002/v1/"\n')


# --- the acceptance configs (tests/fixtures/acceptance) ------------------------------


def test_provider_table_loads_as_written():
    config = load_config(ACCEPTANCE / "provider-table.config.toml", env={})
    assert list(config.providers) == ["taotoken", "sglang_local", "sglang_tilelang"]
    assert config.routing.default_route == "taotoken"
    assert (config.defaults.timeout_sec, config.defaults.max_retries) == (120, 3)
    assert config.routing.long_context_threshold == 16384
    assert config.routing.long_context_provider == "sglang_tilelang"
    assert config.routing.default_model == "llama-3-8b-instruct"
    assert config.providers["taotoken"].endpoints[0].base_url == "https://taotoken.net/api/v1"
    assert config.providers["sglang_local"].extra_body == {"top_k": 1, "repetition_penalty": 1.05}
    assert config.providers["sglang_tilelang"].api_key_env == "SGLANG_TILELANG_KEY"


def test_pool_sections_verbatim_fails_naming_the_decode_and_prefill_sections_and_api_base():
    with pytest.raises(ConfigError) as caught:
        load_config(ACCEPTANCE / "pool-sections.config.toml", env={})
    message = str(caught.value)
    assert message == (
        f'{ACCEPTANCE / "pool-sections.config.toml"}:13: decode.api_base: section [decode] (engine "tile-rt") gives no '
        'address for its engine; add api_base = "http://HOST:PORT/v1" (or endpoints = [...])\n'
        f'{ACCEPTANCE / "pool-sections.config.toml"}:19: prefill.api_base: section [prefill] (engine "vllm") gives no '
        'address for its engine; add api_base = "http://HOST:PORT/v1" (or endpoints = [...])\n'
        f'2 errors in {ACCEPTANCE / "pool-sections.config.toml"}'
    )


def test_pool_sections_with_addresses_loads_shorthand_providers_named_after_their_engines():
    config = load_config_text(pool_sections_with_addresses(), source="pool-sections.config.toml", env={})
    assert list(config.providers) == ["upstream", "tile-rt", "vllm"]
    upstream, decode, prefill = config.providers.values()
    assert (upstream.role, decode.role, prefill.role) == ("upstream", "decode", "prefill")
    assert upstream.endpoints[0].base_url == "https://taotoken.net/api/v1"
    assert decode.connector == "tile_rt_connector"
    assert (decode.max_batch_size, decode.enable_prefix_cache) == (8, True)
    assert prefill.connector == "vllm"  # engine = "vllm" names a known connector
    assert prefill.hints == {"chunked_prefill": True, "max_num_batched_tokens": 8192}
    assert prefill.endpoints[0].api_base == "http://127.0.0.1:8002/v1"
    assert config.routing.route_latency_sensitive_to == "tile-rt"
    assert config.routing.default_route == "vllm"
    assert config.routing.latency_threshold_ms == 200
    assert config.server.host == "0.0.0.0"


def test_pool_sections_prefill_without_address_is_named_once_decode_has_one():
    text = (
        (ACCEPTANCE / "pool-sections.config.toml")
        .read_text()
        .replace('engine = "tile-rt"\n', 'engine = "tile-rt"\napi_base = "http://127.0.0.1:8001/v1"\n')
    )
    assert 'gw.toml: prefill.api_base: section [prefill] (engine "vllm")' in error(text)


# --- provider_table's [default] -----------------------------------------------------------------


def test_default_section_defines_the_provider_it_names_when_absent():
    config = load(
        '[default]\nprovider = "tt"\napi_base = "https://tt.example/api"\napi_key_env = "TT_KEY"\n' + VLLM
    )
    assert list(config.providers) == ["tt", "vllm"]
    assert config.routing.default_route == "tt"
    assert config.providers["tt"].api_key_env == "TT_KEY"


def test_default_section_contradicting_its_provider_is_an_error():
    message = error('[default]\nprovider = "vllm"\napi_base = "http://10.0.0.1:9/v1"\n' + VLLM)
    assert "gw.toml: default.api_base: " in message and "remove it from [default]" in message


def test_default_section_naming_an_unknown_provider_suggests_the_closest():
    message = error('[default]\nprovider = "vlm"\n' + VLLM)
    assert message.startswith('gw.toml: default.provider: unknown provider "vlm"; did you mean "vllm"?')


def test_default_route_is_the_first_provider_when_absent():
    assert load(TWO_POOLS).routing.default_route == "vllm"


# --- syntax, keys, types ---------------------------------------------------------------


def test_toml_syntax_error_names_the_line_and_column():
    with pytest.raises(ConfigError) as caught:
        load(VLLM + "[routing]\ndefault_route = vllm\n")
    assert str(caught.value).startswith("gw.toml:4:17: invalid TOML")
    assert (caught.value.line, caught.value.column, len(caught.value.errors())) == (4, 17, 1)


@pytest.mark.parametrize(
    ("text", "key", "near"),
    [
        (
            '[providers.vllm]\napi_bse = "http://h:1"\napi_base = "http://h:1"\n',
            "providers.vllm.api_bse",
            "api_base",
        ),
        (
            VLLM + "[routing]\nlatency_treshold_ms = 200\n",
            "routing.latency_treshold_ms",
            "latency_threshold_ms",
        ),
        (VLLM + '[routing.policies.fast]\nrout_to = "vllm"\n', "routing.policies.fast.rout_to", "route_to"),
        ("[server]\nprot = 80\n" + VLLM, "server.prot", "port"),
        (VLLM + '[state]\nredis = "redis://h"\n', "state.redis", "redis_url"),
        (VLLM + '[models."m"]\nlatency_sensitiv = true\n', "models.m.latency_sensitiv", "latency_sensitive"),
        (VLLM + '[[auth.keys]]\nname = "a"\nkey = "k"\nrmp = 5\n', "auth.keys[0].rmp", "rpm"),
        (VLLM + "chunked_prefil = true\n", "providers.vllm.chunked_prefil", "chunked_prefill"),
        ("[defaults]\ntimeout = 5\n" + VLLM, "defaults.timeout", "timeout_sec"),
    ],
)
def test_unknown_key_names_the_closest_valid_key(text, key, near):
    message = error(text)
    assert message.startswith(f"gw.toml: {key}: unknown key")
    assert f'did you mean "{near}"?' in message


def test_unknown_section_names_the_closest_section():
    assert error("[rooting]\n" + VLLM) == "gw.toml: rooting: unknown section; did you mean [routing]?"


def test_unknown_engine_setting_points_at_hints_and_hints_table_is_kept():
    assert "hints = { ... }" in error(VLLM + "launch_flag_nobody_knows = 1\n")
    config = load(VLLM + 'max_model_len = 32768\nhints = { swap_policy = "lru" }\n')
    assert config.providers["vllm"].hints == {"swap_policy": "lru", "max_model_len": 32768}


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [
        ('[server]\nport = "http"\n' + VLLM, "server.port", "whole number"),
        ("[server]\nport = 70000\n" + VLLM, "server.port", "e.g. port = 8000"),
        (VLLM + 'max_batch_size = "eight"\n', "providers.vllm.max_batch_size", "whole number"),
        (VLLM + 'models = "glm"\n', "providers.vllm.models", "write a list"),
        (VLLM + 'enable_prefix_cache = "maybe"\n', "providers.vllm.enable_prefix_cache", "true or"),
        (VLLM + 'role = "decoder"\n', "providers.vllm.role", "one of"),
        (VLLM + "extra_body = 3\n", "providers.vllm.extra_body", "write a table"),
        (VLLM + "[routing]\nfallbacks = { vllm = 5 }\n", "routing.fallbacks.vllm", "write a list"),
        ("[defaults]\ntimeout_sec = -1\n" + VLLM, "defaults.timeout_sec", "e.g. timeout_sec = 600"),
        ('[default]\nmax_retries = "many"\n' + VLLM, "default.max_retries", "whole number"),
        (VLLM + 'api_key_env = "sk-live-123"\n', "providers.vllm.api_key_env", "not the key itself"),
    ],
)
def test_wrong_type_names_the_key_and_the_expected_form(text, key, fix):
    message = error(text)
    assert message.startswith(f"gw.toml: {key}: ")
    assert fix in message
    assert "pydantic" not in message and "validation error" not in message


def test_section_that_is_not_a_table_is_an_error():
    assert error('routing = "vllm"\n' + VLLM).startswith("gw.toml: routing: expected a table")


# --- providers, endpoints, connectors --------------------------------------------------


def test_endpoints_give_replicas_with_stable_ids():
    config = load('[providers.pool]\nendpoints = ["http://a:1/", { url = "http://b:2/v1" }]\n')
    endpoints = config.providers["pool"].endpoints
    assert [(e.id, e.api_base, e.base_url) for e in endpoints] == [
        ("pool-0", "http://a:1", "http://a:1/v1"),
        ("pool-1", "http://b:2/v1", "http://b:2/v1"),
    ]


def test_base_url_is_a_synonym_of_api_base():
    config = load('[providers.p]\nbase_url = "http://h:1/v1/"\n')
    assert config.providers["p"].endpoints[0].api_base == "http://h:1/v1"


def test_api_base_and_endpoints_together_is_an_error():
    message = error('[providers.p]\napi_base = "http://h:1"\nendpoints = ["http://h:2"]\n')
    assert message.startswith("gw.toml: providers.p.endpoints: api_base is given too; give one address")


def test_duplicate_endpoint_url_in_one_provider_is_an_error():
    message = error('[providers.p]\nendpoints = ["http://h:1/v1", "http://h:1/v1/"]\n')
    assert message.startswith('gw.toml: providers.p.endpoints[1]: duplicate endpoint "http://h:1/v1"')


@pytest.mark.parametrize(
    "url", ["ftp://h:1/v1", "http://", "127.0.0.1:8000", "http://h:port/v1", "http://h/?a=1"]
)
def test_bad_url_is_an_error_showing_the_expected_form(url):
    message = error(f'[providers.p]\napi_base = "{url}"\n')
    assert message.startswith("gw.toml: providers.p.api_base: ")
    assert 'write it like "http://HOST:PORT/v1"' in message


def test_provider_defined_twice_by_section_and_shorthand_is_an_error():
    message = error(VLLM + '[prefill]\nengine = "vllm"\napi_base = "http://127.0.0.1:9/v1"\n')
    assert message.startswith(
        'gw.toml: prefill.engine: provider "vllm" is defined twice (also at providers.vllm)'
    )


def test_shorthand_without_engine_is_an_error():
    assert error('[decode]\napi_base = "http://h:1"\n').startswith("gw.toml: decode.engine: ")


def test_no_providers_is_an_error():
    message = error("[server]\nport = 8000\n")
    assert message.startswith("gw.toml: providers: no providers are defined; add a [providers.NAME] section")


def test_unknown_connector_lists_the_known_ones_and_the_closest():
    message = error(VLLM + 'connector = "tile_rt"\n')
    assert message.startswith('gw.toml: providers.vllm.connector: unknown connector "tile_rt"')
    assert 'did you mean "tile_rt_connector"?' in message
    assert ", ".join(known_connectors()) in message


def test_connector_plugin_that_fails_to_load_is_an_error(monkeypatch):
    broken = EntryPoint(name="broken", value="latgate_no_such_module:Connector", group="latgate.live.connectors")
    monkeypatch.setattr(connector_names, "_plugins", lambda: {"broken": broken})
    message = error(VLLM + 'connector = "broken"\n')
    assert message.startswith("gw.toml: providers.vllm.connector: connector 'broken' failed to load")


# --- routing references -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("routing", "key"),
    [
        ('default_route = "fsat"', "routing.default_route"),
        ('route_latency_sensitive_to = "fsat"', "routing.route_latency_sensitive_to"),
        ('long_context_provider = "fsat"\nlong_context_threshold = 10', "routing.long_context_provider"),
        ('fallbacks = { fsat = ["vllm"] }', "routing.fallbacks.fsat"),
        ('fallbacks = { vllm = ["fsat"] }', "routing.fallbacks.vllm[0]"),
        ('[routing.policies.p]\nroute_to = "fsat"', "routing.policies.p.route_to"),
        ('[routing.policies.p]\nlong_context_provider = "fsat"', "routing.policies.p.long_context_provider"),
    ],
)
def test_unknown_provider_in_routing_names_the_key_and_closest_provider(routing, key):
    message = error(TWO_POOLS + "[routing]\n" + routing + "\n")
    assert message.startswith(f'gw.toml: {key}: unknown provider "fsat"; did you mean "fast"?')


def test_fallback_to_itself_is_an_error():
    assert "listed twice" in error(TWO_POOLS + '[routing]\nfallbacks = { vllm = ["vllm"] }\n')


def test_default_model_no_provider_serves_is_an_error():
    text = (
        '[providers.p]\napi_base = "http://h:1"\nmodels = ["glm-5.1"]\n[routing]\ndefault_model = "glm-5"\n'
    )
    message = error(text)
    assert message.startswith('gw.toml: routing.default_model: no provider or alias serves model "glm-5"')
    assert 'did you mean "glm-5.1"?' in message


# --- aliases ----------------------------------------------------------------------------


def test_string_alias_expands_to_every_provider_listing_the_served_model():
    provider_table = (ACCEPTANCE / "provider-table.config.toml").read_text()
    config = load(provider_table + '[aliases]\n"llama3" = "meta-llama/Meta-Llama-3-8B-Instruct"\n')
    assert config.aliases == {
        "llama3": {
            "sglang_local": "meta-llama/Meta-Llama-3-8B-Instruct",
            "sglang_tilelang": "meta-llama/Meta-Llama-3-8B-Instruct",
        }
    }


def test_string_alias_goes_to_any_model_providers_only_when_nobody_lists_the_target():
    config = load(TWO_POOLS + '[aliases]\n"fast" = "glm-fast"\n"big" = "glm-big"\n')
    assert config.aliases == {"fast": {"fast": "glm-fast"}, "big": {"vllm": "glm-big"}}


def test_table_alias_is_kept_as_given():
    config = load(TWO_POOLS + '[aliases]\n"m" = { fast = "glm-fast", vllm = "glm-5" }\n')
    assert config.aliases == {"m": {"fast": "glm-fast", "vllm": "glm-5"}}
    assert "m" in config.public_models()


def test_alias_to_a_model_no_provider_serves_is_an_error():
    text = '[providers.p]\napi_base = "http://h:1"\nmodels = ["glm-5.1"]\n[aliases]\n"g" = "glm-5.2"\n'
    message = error(text)
    assert message.startswith('gw.toml: aliases.g: no provider serves "glm-5.2"')
    assert 'did you mean "glm-5.1"?' in message


@pytest.mark.parametrize(
    ("alias", "start"),
    [
        ('{ fsat = "glm-fast" }', 'gw.toml: aliases.m.fsat: unknown provider "fsat"; did you mean "fast"?'),
        ('{ fast = "glm-slow" }', 'gw.toml: aliases.m.fast: provider "fast" does not serve "glm-slow"'),
    ],
)
def test_table_alias_names_the_provider_entry_at_fault(alias, start):
    assert error(TWO_POOLS + f'[aliases]\n"m" = {alias}\n').startswith(start)


def test_models_section_fallback_model_must_be_servable():
    text = '[providers.p]\napi_base = "http://h:1"\nmodels = ["a", "b"]\n[models."a"]\nfallback_model = "c"\n'
    assert error(text).startswith('gw.toml: models.a.fallback_model: no provider or alias serves model "c"')


# --- auth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    ['name = "ci"', 'name = "ci"\nkey = "k1"\nkey_sha256 = "' + "a" * 64 + '"'],
)
def test_auth_key_needs_exactly_one_of_key_and_key_sha256(entry):
    message = error(VLLM + "[[auth.keys]]\n" + entry + "\n")
    assert message.startswith('gw.toml: auth.keys[0]: key "ci" must give exactly one of key and key_sha256')


def test_auth_key_naming_an_unknown_policy_is_an_error():
    text = (
        VLLM
        + "[routing.policies.fast]\nlatency_sensitive = true\n"
        + '[[auth.keys]]\nname = "ci"\nkey = "k"\npolicy = "fats"\n'
    )
    message = error(text)
    assert message.startswith(
        'gw.toml: auth.keys[0].policy: unknown policy "fats"; define [routing.policies.fats]'
    )
    assert 'did you mean "fast"?' in message


def test_auth_without_keys_is_an_error():
    assert error(VLLM + "[auth]\n").startswith("gw.toml: auth.keys: [auth] is given but has no [[auth.keys]]")


def test_auth_keys_load_with_their_policy():
    text = VLLM + (
        "[routing.policies.fast]\nlatency_sensitive = true\n"
        '[[auth.keys]]\nname = "ci"\nkey = "${env:CI_KEY}"\npolicy = "fast"\nrpm = 60\n'
    )
    config = load(text, env={"CI_KEY": "secret"})
    assert config.auth is not None
    assert (config.auth.keys[0].key, config.auth.keys[0].policy, config.auth.keys[0].rpm) == (
        "secret",
        "fast",
        60,
    )


# --- environment expansion --------------------------------------------------------------


def test_env_references_expand_in_every_string_value():
    text = textwrap.dedent("""\
        [server]
        port = "${PORT:-9000}"
        [providers.p]
        api_base = "http://${HOST}:8001/v1"
        models = ["${env:MODEL}"]
        extra_body = { tag = "${TAG:-none}" }
        """)
    config = load(text, env={"HOST": "10.1.2.3", "MODEL": "glm-5.1", "TAG": ""})
    provider = config.providers["p"]
    assert config.server.port == 9000
    assert provider.endpoints[0].api_base == "http://10.1.2.3:8001/v1"
    assert provider.models == ("glm-5.1",)
    assert provider.extra_body == {"tag": "none"}  # empty, like unset, takes the default


def test_unset_variable_without_default_names_the_key_and_the_variable():
    message = error('[providers.p]\napi_base = "${POOL_URL}"\n')
    assert message.startswith(
        "gw.toml: providers.p.api_base: environment variable POOL_URL is not set; set POOL_URL"
    )
    assert "${POOL_URL:-VALUE}" in message


def test_malformed_variable_reference_is_an_error():
    assert "malformed variable reference" in error('[providers.p]\napi_base = "${POOL URL}"\n')


# --- warnings and paths -----------------------------------------------------------------


def test_unset_key_variable_is_a_warning_naming_provider_and_variable():
    config = load_config(ACCEPTANCE / "provider-table.config.toml", env={})
    env = {"SGLANG_LOCAL_KEY": "x", "SGLANG_TILELANG_KEY": "y"}
    assert config_warnings(config, env) == [
        (
            'provider "taotoken": api_key_env TAOTOKEN_API_KEY is not set; requests to it will be sent '
            "without a key (expect 401 from the upstream)"
        )
    ]
    assert config_warnings(config, {**env, "TAOTOKEN_API_KEY": "k"}) == []


@pytest.mark.parametrize(
    ("host", "warned"),
    [("0.0.0.0", True), ("10.0.0.5", True), ("127.0.0.1", False), ("localhost", False), ("::1", False)],
)
def test_missing_auth_is_a_warning_only_beyond_loopback(host, warned):
    config = load(f'[server]\nhost = "{host}"\n' + VLLM)
    assert any("[auth] is absent" in w for w in config_warnings(config, {})) is warned


def test_sub_second_timeout_is_a_warning():
    config = load("[defaults]\ntimeout_sec = 0.5\n" + VLLM)
    assert config_warnings(config, {}) == [
        (
            "defaults.timeout_sec = 0.5 s is under 1 s: an upstream silent that long between two reads (a long "
            "prompt's prefill), or a non-streamed answer not whole by then, is cut off as the provider's timeout "
            "(retried before the first byte, else the request fails)"
        )
    ]


def test_config_path_is_flag_then_env_then_cwd_default():
    assert resolve_config_path("a.toml", env={"LATGATE_CONFIG": "b.toml"}) == Path("a.toml")
    assert resolve_config_path(None, env={"LATGATE_CONFIG": "b.toml"}) == Path("b.toml")
    assert resolve_config_path(None, env={}) == Path("config.toml")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.toml", env={})
    assert str(caught.value).endswith(
        "file: no such file; create it, pass --config PATH or set $LATGATE_CONFIG"
    )


def test_config_is_frozen():
    config = load(VLLM)
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError for frozen models
        config.routing.default_route = "other"  # type: ignore[misc]


def test_endpoints_may_be_tables_with_per_replica_batch_size_and_weight() -> None:
    from latgate.foundation.metrics import Metrics
    from latgate.live.providers import ProviderPool

    text = """
[providers.p]
endpoints = ["http://a:1/v1", { url = "http://b:1/v1", max_batch_size = 2, weight = 0.5 }]
max_batch_size = 8
"""
    config = load_config_text(text, source="t.toml")
    a, b = config.providers["p"].endpoints
    assert (a.max_batch_size, a.weight) == (None, 1.0) and (b.max_batch_size, b.weight) == (2, 0.5)
    pool = ProviderPool(config, metrics=Metrics(providers=config.providers, models=[]), env={})
    assert [ep.capacity for ep in pool["p"].endpoints] == [8, 2]
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_config_text(text.replace("max_batch_size = 2", "max_batch_size = 0"), source="t.toml")
    with pytest.raises(ConfigError, match="weigth"):
        load_config_text(text.replace("weight = 0.5", "weigth = 0.5"), source="t.toml")
