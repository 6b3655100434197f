"""The Grafana dashboard, its provisioning and the Prometheus alert rules: the files
parse, point at each other and at the compose mounts, every query is valid PromQL, and
every metric (and label) they query is exported by a running gateway after traffic."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from stack import FAST, demo_stack, gateway

from latgate.commands.sim import SimOptions

DOCKER = Path(__file__).resolve().parent.parent / "docker"
GRAFANA = DOCKER / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "latgate.json"
PROMETHEUS_BUILTIN = {"up"}  # series Prometheus makes itself


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def compose_mounts(service: str) -> dict[str, str]:
    """``{target: source}`` of a compose service's bind mounts."""
    volumes = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"][service]["volumes"]
    return {v.split(":")[1]: v.split(":")[0] for v in volumes if v.startswith(".")}


def parse(expr: str) -> promql_parser.Expr:
    """PromQL with Grafana's variables replaced by values of their kind."""
    expr = re.sub(r"\$__\w+", "1m", expr)
    return promql_parser.parse(re.sub(r"\$\w+", ".*", expr))


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in ``expr``."""
    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, {m.name for m in node.matchers.matchers}))

    promql_parser.walk(parse(expr), visit)
    return iter(found)


def grouping_labels(expr: str) -> Iterator[tuple[set[str], set[str]]]:
    """(``by (...)`` labels, metric names aggregated) of every aggregation in ``expr``."""
    found = []

    def visit(node):
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            inner = []
            promql_parser.walk(
                node.expr,
                lambda n: inner.append(n.name) if isinstance(n, promql_parser.VectorSelector) else None,
            )
            found.append((set(node.modifier.labels), set(inner)))

    promql_parser.walk(parse(expr), visit)
    return iter(found)


def exported(text: str) -> dict[str, set[str] | None]:
    """Sample name -> label names, from a /metrics scrape; ``None`` for a counter
    declared (HELP and TYPE) with no samples yet: its events did not happen in this
    traffic (hedges, overflows, ejections; tests/prometheus/ makes them happen)."""
    out: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples and family.type == "counter":
            out[family.name + "_total"] = None
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_grafana_datasource_is_provisioned_with_the_uid_every_panel_uses() -> None:
    provisioning = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert provisioning["apiVersion"] == 1
    (datasource,) = provisioning["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    for panel in panels():
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        assert all(t["datasource"]["uid"] == datasource["uid"] for t in panel["targets"])
    for variable in dashboard()["templating"]["list"]:
        assert variable["datasource"]["uid"] == datasource["uid"]


def test_grafana_loads_the_dashboard_from_where_compose_mounts_it() -> None:
    provisioning = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "latgate.yaml").read_text())
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file"
    mounts = compose_mounts("grafana")
    assert (DOCKER / mounts[provider["options"]["path"]]).resolve() == DASHBOARD.parent
    assert (DOCKER / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    environment = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["grafana"]["environment"]
    home = environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == provider["options"]["path"] + "/" + DASHBOARD.name


def test_dashboard_is_well_formed_and_every_query_is_valid_promql() -> None:
    board = dashboard()
    assert board["uid"] == "latgate" and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            parse(target["expr"])  # raises on a syntax error


def test_dashboard_shows_what_operators_asked_for() -> None:
    queried = {name for expr in dashboard_queries() for name, _ in selectors(expr)}
    asked = {
        "latgate_time_to_first_token_seconds_bucket",  # TTFT p50/p90/p99 by provider
        "latgate_inter_token_latency_seconds_bucket",
        "latgate_output_tokens_per_second_bucket",
        "latgate_requests_total",  # request rate, errors by provider and status
        "latgate_upstream_errors_total",
        "latgate_route_decisions_total",
        "latgate_retries_total",
        "latgate_fallbacks_total",
        "latgate_in_flight_requests",
        "latgate_provider_healthy",
        "latgate_gateway_overhead_seconds_bucket",
    }
    assert asked <= queried
    ttft = [
        t
        for p in panels()
        for t in p["targets"]
        if "time_to_first_token" in t["expr"] and "by (le, provider)" in t["expr"]
    ]
    assert {re.match(r"histogram_quantile\(([\d.]+),", t["expr"]).group(1) for t in ttft} >= {
        "0.5",
        "0.9",
        "0.99",
    }


def test_alert_rules_parse_and_cover_ttft_budget_error_rate_and_provider_down() -> None:
    rules = alert_rules()
    names = {rule["alert"] for rule in rules}
    assert {
        "LatgateFastPoolTTFTOverBudget",
        "LatgateTTFTOverBudget",
        "LatgateHighErrorRate",
        "LatgateProviderDown",
    } <= names
    assert len(names) == len(rules)
    for rule in rules:
        parse(rule["expr"])
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"page", "warning"}
        assert rule["annotations"]["summary"]


@pytest.fixture(scope="module")
def scrapes() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The gateway's and an engine simulator's exported samples after traffic that
    exercises every path: streams, retries and a fallback off a failing decode pool."""
    failing = SimOptions(name="tile-rt", error_rate=1.0, seed=1, **FAST)
    with demo_stack(tile=failing) as stack, httpx.Client(base_url=stack.v1, timeout=30) as client:
        body = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hello"}]}
        assert (
            client.post("/chat/completions", json=body, headers={"X-Latency-Sensitive": "1"}).status_code
            == 200
        )
        streamed = client.post("/chat/completions", json={**body, "stream": True})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("[DONE]")
        gateway = httpx.get(stack.url + "/metrics").text
        engine_base = stack.config.providers["vllm"].endpoints[0].api_base.removesuffix("/v1")
        engine = httpx.get(engine_base + "/metrics").text
    return exported(gateway), exported(engine)


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_and_label_queried_is_exported_by_a_running_gateway_after_traffic(
    scrapes, source
) -> None:
    gateway, engine = scrapes
    queries = dashboard_queries() if source == "dashboard" else [rule["expr"] for rule in alert_rules()]
    for expr in queries:
        for name, labels in selectors(expr):
            if name in PROMETHEUS_BUILTIN:
                continue
            samples = engine if name.startswith("vllm:") else gateway
            assert name in samples, f"{source} queries {name}, which is not exported: {expr}"
            if samples[name] is None:
                continue
            assert labels <= samples[name] | {"job", "instance"}, (
                f"{name} has no label {labels - samples[name]}: {expr}"
            )
        for by, names in grouping_labels(expr):
            if any(gateway.get(n, ()) is None for n in names):
                continue
            have = set().union(*((gateway.get(n) or set()) | (engine.get(n) or set()) for n in names)) | {
                "job",
                "instance",
            }
            assert by <= have, f"{source} groups by {by - have}, not a label of {names}: {expr}"


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_no_query_names_a_provider_so_the_files_work_for_any_config(source) -> None:
    queries = dashboard_queries() if source == "dashboard" else [rule["expr"] for rule in alert_rules()]
    for expr in queries:
        for match in re.finditer(r'\b(provider|from|to)\s*(=~|!~|!=|=)\s*"([^"]*)"', expr):
            assert match.group(3).startswith("$"), f"{source} names a provider ({match.group(0)}): {expr}"
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert {"provider", "model"} <= set(variables)
    assert "latgate_provider_info" in variables["provider"]["definition"]


def test_provider_info_labels_every_configured_provider_with_its_role_connector_and_engine() -> None:
    with demo_stack() as stack:
        text = httpx.get(stack.url + "/metrics").text
    info = {
        sample.labels["provider"]: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "latgate_provider_info"
    }
    assert set(info) == set(stack.config.providers)
    for name, sample in info.items():
        provider = stack.config.providers[name]
        assert sample.value == 1
        assert sample.labels == {
            "provider": name,
            "role": provider.role or "",
            "connector": provider.connector,
            "engine": provider.engine or "",
        }


def test_rare_event_counters_start_at_zero_so_prometheus_counts_the_first_event() -> None:
    with demo_stack() as stack:
        text = httpx.get(stack.url + "/metrics").text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for provider in stack.config.providers:
        for name in ("latgate_hedges_total", "latgate_hedge_wins_total", "latgate_retries_total"):
            assert samples[(name, (("provider", provider),))] == 0
        for endpoint in stack.config.providers[provider].endpoints:
            for reason in ("errors", "probes", "latency", "shared"):
                key = (("endpoint", endpoint.id), ("provider", provider), ("reason", reason))
                assert samples[("latgate_ejections_total", key)] == 0


def test_a_tile_rt_provider_without_role_is_labelled_a_decode_pool() -> None:
    """``connector = "tile_rt_connector"`` is a decode pool: the dashboard's decode-pool
    panels (``latgate_provider_info{role="decode"}``) show it without ``role`` written."""
    config = """
[providers.fast]
connector = "tile_rt_connector"
api_base = "http://127.0.0.1:9/v1"
[providers.bulk]
connector = "vllm"
api_base = "http://127.0.0.1:9/v1"
"""
    with gateway(config) as stack:
        text = httpx.get(stack.url + "/metrics").text
    roles = {
        sample.labels["provider"]: sample.labels["role"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "latgate_provider_info"
    }
    assert roles == {"fast": "decode", "bulk": ""}
