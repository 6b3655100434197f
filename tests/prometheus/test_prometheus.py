"""The shipped dashboard and alert rules against a real Prometheus.

Prometheus scrapes, every second, a gateway in front of simulators (a decode pool, a
throughput pool, a hosted-style upstream, plus providers that fail, stall and refuse on
purpose) and the simulated engines' vLLM-style ``/metrics``. Two rounds of traffic (a
scrape between them, so every counter and histogram moves after Prometheus first saw
it) make every series the dashboard and the alerts read: latency-sensitive and ordinary
streams, an error, a retry, a fallback, a hedge, an overflow, ejections, a wait in the
gateway queue and prefix-cache hits the engine reports. Then every dashboard query and alert expression is evaluated through Prometheus's HTTP API, and the
alert for a provider whose every endpoint is down is seen firing.

A per-panel report (query, series returned) is written to build/artifacts/prometheus.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from processes import poll
from promd import Prometheus, binary, prometheus
from prometheus_client.parser import text_string_to_metric_families
from redisd import free_port
from stack import FAST, Stack, gateway, simulators

from latgate.commands.sim import SimOptions

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "latgate.json"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
ARTIFACTS = ROOT / "build" / "artifacts"
SCRAPE_SECONDS = 1
#: Grafana's variables as the tier substitutes them: every provider and model, windows
#: that cover both traffic rounds.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$provider": ".*", "$model": ".*"}
#: Panels allowed to return no data, with why (their events do not happen here): none.
NO_DATA_EXPECTED: dict[str, str] = {}

CONFIG = """
[defaults]
timeout_sec = 10
connect_timeout_sec = 1
max_retries = 1

[providers.tile-rt]
api_base = "{tile_rt}/v1"
engine = "tile-rt"
role = "decode"
models = ["glm-5.1"]
max_batch_size = 1

[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
engine = "vllm"
role = "prefill"
models = ["glm-5.1"]

[providers.hosted]
api_base = "{hosted}/v1"
role = "upstream"
models = ["glm-5.1"]

[providers.flaky]
api_base = "{flaky}/v1"
role = "prefill"
models = ["glm-5.1"]

[providers.pair]
endpoints = ["{slow}/v1", "{fast}/v1"]
role = "prefill"
models = ["glm-5.1"]

[providers.queued]
api_base = "{queued}/v1"
role = "prefill"
models = ["glm-5.1"]
max_batch_size = 1

[providers.broken]
api_base = "http://127.0.0.1:{closed}/v1"
role = "upstream"
models = ["glm-5.1"]

[routing]
default_route = "vllm"
default_model = "glm-5.1"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
fallbacks = {{ "tile-rt" = ["hosted", "vllm"], "flaky" = ["vllm"] }}

[routing.policies.flaky]
route_to = "flaky"

[routing.policies.hedged]
route_to = "pair"
hedge = true

[routing.policies.broken]
route_to = "broken"

[routing.policies.queued]
route_to = "queued"

[routing.queue]
batch_max_wait_ms = 1

[health]
probe_interval_sec = 1
probe_failure_threshold = 2
failure_threshold = 2
open_sec = 1
max_open_sec = 2
"""

PROMETHEUS_CONFIG = """
global:
  scrape_interval: {interval}s
  evaluation_interval: {interval}s
rule_files:
  - {rules}
scrape_configs:
  - job_name: latgate
    static_configs:
      - targets: ["{gateway}"]
  - job_name: engines
    static_configs:
      - targets: {engines}
"""

BODY = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
LATENCY = {"X-Latency-Sensitive": "1"}


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def substitute(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr, f"a dashboard variable the tier does not know: {expr}"
    return expr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prometheus")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    options = {
        "tile-rt": SimOptions(name="tile-rt", tpot_ms=20.0, tpot_growth_ms=0.0, ttft_overhead_ms=1.0, default_max_tokens=8),
        "vllm": SimOptions(name="vllm", prefix_cache=True, **FAST),
        "hosted": SimOptions(name="hosted", **{**FAST, "ttft_overhead_ms": 20.0}),
        "flaky": SimOptions(name="flaky", error_rate=1.0, seed=1, **FAST),
        "slow": SimOptions(name="slow", ttft_overhead_ms=2000.0, tpot_ms=0.5, default_max_tokens=4),
        "fast": SimOptions(name="fast", **FAST),
        "queued": SimOptions(name="queued", tpot_ms=20.0, tpot_growth_ms=0.0, ttft_overhead_ms=1.0, default_max_tokens=8),
    }
    with simulators(options) as sims:
        urls = {name.replace("-", "_"): url for name, (url, _) in sims.items()}
        with gateway(CONFIG.format(closed=free_port(), **urls)) as gw:
            gw.sims = {name: app for name, (_, app) in sims.items()}
            yield gw


@pytest.fixture(scope="module")
def prom(stack: Stack, workdir: Path) -> Iterator[Prometheus]:
    (ARTIFACTS / "prometheus.md").unlink(missing_ok=True)
    rules = workdir / "alerts.yml"
    rules.write_text(ALERTS.read_text())
    engines = [host_port(url) for url in (stack.config.providers[p].endpoints[0].api_base.removesuffix("/v1") for p in ("tile-rt", "vllm", "hosted"))]
    config = workdir / "prometheus.yml"
    config.write_text(
        PROMETHEUS_CONFIG.format(interval=SCRAPE_SECONDS, rules=rules, gateway=host_port(stack.url), engines=json.dumps(engines))
    )
    with prometheus(config, workdir) as server:
        poll(lambda: server.scraped("latgate") and server.scraped("engines"), timeout=30, what="the first scrapes")
        yield server


def scrape_after(prom: Prometheus, moment: float) -> None:
    """Wait until Prometheus holds a scrape of the gateway taken after ``moment`` (epoch s)."""

    def scraped() -> bool:
        values = prom.values('max(timestamp(up{job="latgate"}))')
        return bool(values) and values[0] > moment

    poll(scraped, timeout=30, what="a scrape after the traffic")


def chat(client: httpx.Client, *, stream: bool = True, headers: dict[str, str] | None = None, **extra) -> httpx.Response:
    response = client.post("/chat/completions", json={**BODY, **extra, "stream": stream}, headers=headers or {})
    if response.status_code == 200 and stream:
        assert response.text.rstrip().endswith("data: [DONE]"), response.text[-200:]
    return response


def overflow(stack: Stack, client: httpx.Client) -> httpx.Response:
    """A latency-sensitive request while a long stream holds the decode pool's only slot."""
    with httpx.Client(timeout=30) as holder:
        body = {**BODY, "stream": True, "max_tokens": 100}
        with holder.stream("POST", stack.v1 + "/chat/completions", json=body, headers=LATENCY) as held:
            assert held.headers["x-latgate-provider"] == "tile-rt"
            chunks = held.iter_raw()
            next(chunks)
            response = chat(client, headers=LATENCY)
            del chunks
    return response


def queued(stack: Stack, client: httpx.Client) -> tuple[httpx.Response, httpx.Response]:
    """A request that waits in the gateway queue and one it sheds: a stream holds the one
    slot of the "queued" pool (8 tokens at 20 ms); a ``batch`` request routed there is
    shed at once (503, latgate's own: provider ``none``), the next is admitted when the
    stream ends. Returns (admitted, shed)."""
    policy = {"X-Route-Policy": "queued"}
    with httpx.Client(timeout=30) as holder:
        body = {**BODY, "stream": True}
        with holder.stream("POST", stack.v1 + "/chat/completions", json=body, headers=policy) as held:
            assert held.headers["x-latgate-provider"] == "queued"
            chunks = held.iter_raw()
            next(chunks)
            shed = chat(client, headers={**policy, "X-Latgate-Priority": "batch"})
            response = chat(client, headers=policy)
            del chunks
    assert response.status_code == 200 and float(response.headers["x-latgate-queue-ms"]) > 0, response.headers
    assert shed.status_code == 503 and shed.json()["error"]["code"] == "queue_full", shed.text
    return response, shed


def cached_turns(client: httpx.Client) -> httpx.Response:
    """Two turns of one conversation on the vLLM pool, whose engine caches prefixes: the
    second reports cached prompt tokens."""
    system = {"role": "system", "content": "You are a coding agent in the user's repository. " * 40}
    first = [system, {"role": "user", "content": "read main.py"}]
    chat(client, stream=False, messages=first)
    later = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "now run the tests"}]
    return chat(client, messages=later, stream_options={"include_usage": True})


def traffic_round(stack: Stack) -> dict[str, httpx.Response]:
    """Every kind of request once (ordinary ones a few times); responses by kind."""
    out: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=stack.v1, timeout=30) as client:
        for _ in range(4):
            out["latency_sensitive"] = chat(client, headers=LATENCY)
            out["ordinary"] = chat(client)
            out["unstreamed"] = chat(client, stream=False)
        out["flaky"] = chat(client, headers={"X-Route-Policy": "flaky"})  # 5xx, a retry, then the fallback
        out["hedged"] = chat(client, headers={"X-Route-Policy": "hedged"})
        out["overflow"] = overflow(stack, client)
        out["error"] = chat(client, headers={"X-Route-Policy": "broken"})
        out["queued"], out["shed"] = queued(stack, client)
        out["cached"] = cached_turns(client)
    return out


@pytest.fixture(scope="module")
def traffic(stack: Stack, prom: Prometheus) -> list[dict[str, httpx.Response]]:
    rounds = []
    for _ in range(2):
        rounds.append(traffic_round(stack))
        scrape_after(prom, time.time())
    return rounds


def test_the_traffic_mix_made_every_event(traffic, stack: Stack) -> None:
    first, second = traffic
    assert first["latency_sensitive"].headers["x-latgate-provider"] == "tile-rt"
    assert first["ordinary"].headers["x-latgate-provider"] == "vllm"
    assert first["flaky"].status_code == 200 and first["flaky"].headers["x-latgate-provider"] == "vllm"
    assert first["overflow"].headers["x-latgate-route-reason"] == "overflow:tile-rt"
    assert first["error"].status_code >= 500 and second["error"].status_code >= 500
    samples = [
        (sample.name, sample.labels)
        for family in text_string_to_metric_families(httpx.get(stack.url + "/metrics").text)
        for sample in family.samples
        if sample.value > 0
    ]

    def seen(name: str, **labels: str) -> bool:
        return any(n == name and labels.items() <= have.items() for n, have in samples)

    assert seen("latgate_retries_total", provider="flaky")
    assert seen("latgate_prompt_tokens_cached_total", provider="vllm", source="reported")
    assert seen("latgate_queue_wait_seconds_count", provider="queued", outcome="admitted")
    assert seen("latgate_fallbacks_total", **{"from": "flaky", "to": "vllm"})
    assert seen("latgate_hedges_total", provider="pair")
    assert seen("latgate_overflows_total", **{"from": "tile-rt"})
    assert seen("latgate_ejections_total", provider="flaky", reason="errors")
    assert seen("latgate_ejections_total", provider="broken", reason="probes")
    assert seen("latgate_upstream_errors_total", provider="broken", kind="connect")
    assert seen("latgate_provider_healthy", provider="tile-rt")


def test_promtool_accepts_the_shipped_rules_and_config(workdir: Path) -> None:
    rules = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in rules.stdout
    # The shipped config names the rule file by its path in the compose container.
    shipped = (DOCKER / "prometheus" / "prometheus.yml").read_text()
    (workdir / "check").mkdir(exist_ok=True)
    (workdir / "check" / "alerts.yml").write_text(ALERTS.read_text())
    config = workdir / "check" / "prometheus.yml"
    config.write_text(shipped.replace("/etc/prometheus/alerts.yml", str(workdir / "check" / "alerts.yml")))
    checked = subprocess.run([binary("promtool"), "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_dashboard_panel_query_succeeds_and_returns_data(traffic, prom: Prometheus) -> None:
    report, empty = [], []
    for panel in panels():
        for target in panel["targets"]:
            expr = substitute(target["expr"])
            result = prom.query(expr)  # raises on a query Prometheus rejects
            finite = prom.values(expr)
            report.append((panel["title"], target["refId"], len(result), finite, expr))
            # a rate or quantile over the traffic must have moved, not just exist
            moving = "rate(" in expr or "increase(" in expr
            if panel["title"] not in NO_DATA_EXPECTED and not (any(v > 0 for v in finite) if moving else finite):
                empty.append(f"{panel['title']} ({target['refId']})")
    write_report("dashboard", report)
    assert not empty, f"panel queries without data: {empty}"


def test_every_alert_expression_evaluates_and_every_rule_is_healthy(traffic, prom: Prometheus) -> None:
    report, unread = [], []
    for rule in alert_rules():
        expr = " ".join(rule["expr"].split())
        firing_now = prom.query(expr)
        measured = re.sub(r"\s*(>|<|==)\s*[\d.]+$", "", expr)  # what the rule compares with its threshold
        assert measured != expr, f"{rule['alert']}: no threshold comparison at the end of {expr}"
        values = prom.values(measured)
        report.append((rule["alert"], "expr", len(firing_now), values, expr))
        if not values:
            unread.append(rule["alert"])
    write_report("alerts (series: alerting now; values: the measured side)", report)
    assert not unread, f"alerts whose measured side has no data: {unread}"
    rules = [r for group in prom.api("rules")["groups"] for r in group["rules"]]
    assert {r["name"] for r in rules} == {rule["alert"] for rule in alert_rules()}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]


def test_latgates_own_503s_are_no_providers_5xx_in_the_error_alert(traffic, prom: Prometheus) -> None:
    # each round's shed batch request: a 503 of latgate's own, under provider none
    own = prom.values('sum(latgate_requests_total{code="503",provider="none"})')
    assert own and own[0] >= 2, own
    rule = next(r for r in alert_rules() if r["alert"] == "LatgateHighErrorRate")
    measured = re.sub(r"\s*>\s*[\d.]+$", "", " ".join(rule["expr"].split()))
    providers = {sample["metric"].get("provider") for sample in prom.query(measured)}
    assert "broken" in providers and "none" not in providers, providers


def test_alerts_fire_for_a_provider_that_is_down_and_failing(traffic, prom: Prometheus) -> None:
    # "broken" refuses connections from the start: its probes eject it, and requests
    # routed to it fail with 5xx. LatgateProviderDown waits 1 m (its `for`) before firing.
    def firing() -> dict[str, set[str]] | None:
        alerts = prom.alerts()
        return alerts if "firing" in alerts.get("LatgateProviderDown", set()) else None

    alerts = poll(firing, timeout=120, what="LatgateProviderDown to fire", interval=1.0)
    assert alerts.get("LatgateHighErrorRate"), alerts  # pending: its `for` is 5 m
    assert alerts.get("LatgateEndpointUnhealthy"), alerts
    assert "LatgateDown" not in alerts
    down = [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "LatgateProviderDown"]
    assert {a["labels"]["provider"] for a in down if a["state"] == "firing"} == {"broken"}
    write_report("alert states", [(name, ",".join(sorted(states)), 0, [], "") for name, states in sorted(alerts.items())])


def write_report(section: str, rows: list[tuple[str, str, int, list[float], str]]) -> None:
    """Append a table (name, ref, series returned, finite values, query) to the report."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "prometheus.md"
    lines = [f"\n## {section}\n", "| name | ref | series | values | query |", "|---|---|---|---|---|"]
    for name, ref, count, values, expr in rows:
        shown = ", ".join(f"{v:.4g}" for v in values[:4]) + (" ..." if len(values) > 4 else "")
        lines.append(f"| {name} | {ref} | {count} | {shown} | `{expr.replace('|', '/')}` |")
    with path.open("a") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr)
