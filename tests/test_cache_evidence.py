"""The engine's reported cached tokens as evidence for the TTFT fit and the prefix
index: pure functions on plain data, and the pool's use of them with a manual clock."""

from __future__ import annotations

from clocks import ManualClock

from latgate.foundation.config import load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.live.providers.cache_evidence import counters_evidence, reported_evidence
from latgate.live.providers.engine_cache import EngineCacheFacts
from latgate.routing.prefix_index import MAX_SHORTFALL_DIVISOR, PrefixIndex, prompt_prefix

CONFIG = """
[providers.pool]
endpoints = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
models = ["m"]
prefix_cache_tokens = 100000
"""


def body(turns: int, name: str = "s") -> dict:
    return {"messages": [{"role": "user", "content": f"{name} turn {i} " + "x" * 400} for i in range(turns)]}


def test_a_report_below_the_match_is_a_shortfall_and_sets_the_uncached_tokens() -> None:
    evidence = reported_evidence(
        prompt_tokens=10_000, predicted_cached_tokens=9_000, reported_prompt_tokens=12_000, reported_cached_tokens=2_400
    )
    assert (evidence.uncached_tokens, evidence.shortfall_tokens) == (8_000, 7_000)


def test_a_report_within_a_block_and_the_slack_of_the_match_confirms_it() -> None:
    evidence = reported_evidence(
        prompt_tokens=10_000, predicted_cached_tokens=9_000, reported_prompt_tokens=11_000, reported_cached_tokens=9_600, block_tokens=128
    )
    assert evidence.shortfall_tokens == 0 and evidence.uncached_tokens == round(10_000 * (1 - 9_600 / 11_000))


def test_a_report_above_the_match_gives_capacity_back() -> None:
    evidence = reported_evidence(
        prompt_tokens=10_000, predicted_cached_tokens=0, reported_prompt_tokens=10_000, reported_cached_tokens=8_000
    )
    assert evidence.shortfall_tokens == -8_000 and evidence.uncached_tokens == 2_000


def test_odd_reports_stay_in_range() -> None:
    assert reported_evidence(prompt_tokens=0, predicted_cached_tokens=0, reported_prompt_tokens=0, reported_cached_tokens=5).uncached_tokens == 0
    more_than_all = reported_evidence(prompt_tokens=100, predicted_cached_tokens=100, reported_prompt_tokens=50, reported_cached_tokens=80)
    assert more_than_all.uncached_tokens == 0 and more_than_all.shortfall_tokens == 0


def test_hit_counters_over_an_interval_are_evidence_as_a_fraction() -> None:
    assert counters_evidence(prompt_tokens=20_000, predicted_cached_tokens=18_000, queried_tokens=20_000, hit_tokens=10_000) == 8_000
    assert counters_evidence(prompt_tokens=20_000, predicted_cached_tokens=18_000, queried_tokens=0, hit_tokens=0) == 0


def test_correct_shrinks_the_effective_capacity_and_evicts_the_least_recently_used() -> None:
    index = PrefixIndex(capacity_tokens=10_000)
    old, kept = (prompt_prefix(body(2, n), prompt_tokens=3_000) for n in ("old", "kept"))
    assert old is not None and kept is not None
    index.record(old)
    index.record(kept)
    index.correct(6_000)  # 6 000 tokens held, 4 000 effective: the older prompt goes
    assert index.effective_capacity_tokens == 4_000
    assert index.longest_match_tokens(old) == 0 and index.longest_match_tokens(kept) == kept.total_tokens
    index.correct(10**9)
    assert index.effective_capacity_tokens == 10_000 // MAX_SHORTFALL_DIVISOR
    index.correct(-(10**9))
    assert index.effective_capacity_tokens == 10_000 and index.shortfall_tokens == 0


class Pool:
    def __init__(self) -> None:
        self.config = load_config_text(CONFIG, source="test.toml")
        self.clock = ManualClock()
        self.pool = ProviderPool(self.config, metrics=Metrics(providers=self.config.providers, models=[]), env={}, clock=self.clock)
        self.runtime = self.pool["pool"]
        self.endpoint = self.runtime.endpoints[0]

    def serve(self, turns: int, *, ttft_ms: float, report: tuple[int, int] | None) -> None:
        """One streamed request: its first token, then its usage's ``(prompt, cached)``."""
        prefix = prompt_prefix(body(turns), prompt_tokens=1_000 * turns)
        ticket = self.pool.begin(self.runtime, self.endpoint, prompt_tokens=1_000 * turns, prefix=prefix)
        self.pool.record_first_token(self.runtime, self.endpoint, ticket, ttft_ms=ttft_ms)
        assert self.endpoint.prefix_index is not None and prefix is not None
        self.endpoint.prefix_index.record(prefix)  # as the strategy does at the first token
        self.pool.record_outcome(self.runtime, self.endpoint, ok=True, ticket=ticket)
        if report is not None:
            self.pool.record_cached_tokens(self.runtime, self.endpoint, ticket, prompt_tokens=report[0], cached_tokens=report[1])
        self.pool.end(self.runtime, self.endpoint, ticket)


def test_the_ttft_fit_is_on_the_tokens_the_engine_reports_it_prefilled() -> None:
    engines = Pool()
    engines.serve(4, ttft_ms=100.0, report=(4_000, 0))  # the first report: from now on the fit waits for it
    predictor = engines.endpoint.predictor
    observations, sx = predictor.observations, predictor._sx
    engines.serve(5, ttft_ms=100.0, report=(5_000, 0))  # the index matched 4 of 5 turns; the engine held none
    observed_tokens = predictor._sx - (1 - predictor.alpha) * sx
    assert predictor.observations == observations + 1
    assert round(observed_tokens) == 5_000, "fitted on what the engine prefilled, not the 1 000 the index left"
    assert engines.endpoint.cache_hits.misses == 1 and engines.endpoint.prefix_index is not None
    assert engines.endpoint.prefix_index.shortfall_tokens > 3_000, "4 of 5 turns believed held, none was"


def test_without_a_report_the_index_prediction_stands_and_nothing_is_corrected() -> None:
    engines = Pool()
    engines.serve(4, ttft_ms=100.0, report=None)
    engines.serve(5, ttft_ms=100.0, report=None)
    assert engines.endpoint.cache_hits.reports == 0 and engines.endpoint.cache_hits.predicted_tokens > 0
    assert engines.endpoint.prefix_index is not None and engines.endpoint.prefix_index.shortfall_tokens == 0


def test_hit_counters_on_metrics_are_the_report_where_answers_give_none() -> None:
    engines = Pool()
    engines.pool.record_engine_cache(engines.runtime, engines.endpoint, EngineCacheFacts(capacity_tokens=50_000, queried_tokens=0.0, hit_tokens=0.0))
    assert engines.endpoint.prefix_cache_capacity_tokens == 50_000
    engines.serve(4, ttft_ms=100.0, report=None)
    engines.serve(5, ttft_ms=100.0, report=None)
    engines.pool.record_engine_cache(engines.runtime, engines.endpoint, EngineCacheFacts(capacity_tokens=50_000, queried_tokens=9_000.0, hit_tokens=0.0))
    hits = engines.endpoint.cache_hits
    assert (hits.reported_tokens, hits.reported_prompt_tokens) == (0, 9_000)
    assert engines.endpoint.prefix_index is not None and engines.endpoint.prefix_index.shortfall_tokens > 0
