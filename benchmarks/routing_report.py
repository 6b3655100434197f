"""What each routing scenario reports (``benchmarks/routing_scenarios.py``): the numbers
per system, latgate's targets met or missed, and the markdown table.

Which endpoint served each request comes from the simulators' arrival times, the same
for every system; latgate's own counters (overflows, latency ejections by endpoint) from
its ``/metrics``. Percentiles are ``benchmarks/harness.py``'s (linear interpolation).
"""

from __future__ import annotations

from typing import Any

from harness import LATGATE_SYSTEMS, Result, percentile, rounded

SLOWED_ENDPOINT = "pool-1"
"""The endpoint of the ``unequal`` scenario that slows down (its simulator ``u1``)."""


def summarize(name: str, budget_ms: int, observed: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """Scenario ``name``'s numbers for one system (see ``routing_scenarios``'s docstring)."""
    results: list[Result] = observed["results"]
    arrivals: dict[str, list[float]] = observed["arrivals"]
    ls = [r for r in results if r.kind == "ls"] or results
    budget_s = budget_ms / 1000.0
    ttft = [r.ttft_s for r in ls if r.ok and r.ttft_s is not None]
    out: dict[str, Any] = {
        "requests": len(results),
        "errors": sum(1 for r in results if not r.ok),
        "slo": round(sum(1 for r in ls if r.ok and r.ttft_s is not None and r.ttft_s <= budget_s) / len(ls), 4),
        "ls_p50_s": rounded(percentile(ttft, 50)),
        "ls_p99_s": rounded(percentile(ttft, 99)),
        "served": {name: len(times) for name, times in arrivals.items()},
    }
    if name == "cold":
        marked = [r for r in results if r.kind == "ls"]
        out["first_ls_provider"] = marked[0].provider if marked else None
        out["ls_left_rule"] = sum(1 for r in marked if r.provider != "tile-rt")
    elif name == "identical":
        mark = observed["marks"][0]
        for label, keep in (("c1", lambda t: t < mark), ("c8", lambda t: t >= mark)):
            counts = [sum(1 for t in times if keep(t)) for times in arrivals.values()]
            out[f"{label}_counts"] = counts
            out[f"{label}_ratio"] = round(max(counts) / max(1, min(counts)), 3)
    elif name == "recovery":
        merged = sorted((t, n) for n, times in arrivals.items() for t in times)
        fifth = [i for i, (_, n) in enumerate(merged) if n == "b"][4:5]
        window = merged[fifth[0] + 1 : fifth[0] + 101] if fifth else []
        out["b_share_next_100"] = round(sum(1 for _, n in window if n == "b") / max(1, len(window)), 3)
    elif name == "overflow":
        e2e = [r.done_at - r.sent_at for r in ls if r.ok]
        out["ls_e2e_p50_s"] = rounded(percentile(e2e, 50))
        out["ls_e2e_p99_s"] = rounded(percentile(e2e, 99))
        out["ls_served"] = {p: sum(1 for r in ls if r.provider == p) for p in sorted({str(r.provider) for r in ls})}
    elif name == "unequal":
        ejections = gateway.get("ejections_by_endpoint", {})
        out["ejections"] = ejections
        out["healthy_ejections"] = int(sum(v for k, v in ejections.items() if k != SLOWED_ENDPOINT))
    if "overflows" in gateway:
        out["overflows"] = int(gateway["overflows"])
    return out


def gateway_numbers(base: str, system: str) -> dict[str, Any]:
    """latgate's overflow count and ejections by endpoint (nothing for a peer)."""
    if system not in LATGATE_SYSTEMS:
        return {}
    import httpx

    text = httpx.get(base + "/metrics", timeout=5).text
    out: dict[str, Any] = {"overflows": 0.0, "ejections_by_endpoint": {}}
    for line in text.splitlines():
        if line.startswith("latgate_overflows_total{"):
            out["overflows"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("latgate_ejections_total{") and 'reason="latency"' in line:
            endpoint = line.split('endpoint="', 1)[1].split('"', 1)[0]
            out["ejections_by_endpoint"][endpoint] = out["ejections_by_endpoint"].get(endpoint, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


P99_NOISE = (1.1, 0.005)
SLO_NOISE = 0.01
"""What one run on a shared 2-core machine cannot tell apart: a p99 within 10% + 5 ms,
an SLO attainment within one point."""


def within_noise(p99_s: float) -> float:
    """The largest p99 (s) indistinguishable from ``p99_s`` in one run."""
    return p99_s * P99_NOISE[0] + P99_NOISE[1]


def targets(name: str, rows: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """Each target of scenario ``name`` for latgate: (what, met, the numbers); met is
    None when a number it needs is missing."""
    lg = rows.get("latgate")
    if lg is None:
        return []
    out: list[tuple[str, bool | None, str]] = []
    base = [rows[s] for s in ("round_robin", "least_outstanding") if s in rows]
    if base:
        best_p99 = min((b["ls_p99_s"] for b in base if b["ls_p99_s"] is not None), default=None)
        best_slo = max(b["slo"] for b in base)
        met = (
            lg["ls_p99_s"] is not None
            and best_p99 is not None
            and lg["ls_p99_s"] <= within_noise(best_p99)
            and lg["slo"] >= best_slo - SLO_NOISE
        )
        out.append(("p99 and SLO at least the better baseline's (within noise)", met, f"p99 {lg['ls_p99_s']} vs {best_p99} s, SLO {lg['slo']} vs {best_slo}"))
    if name == "cold":
        ok = lg["first_ls_provider"] == "tile-rt" and lg["ls_left_rule"] <= 1
        out.append(("first LS to tile-rt; <= 1 in 50 leaves it", ok, f"first {lg['first_ls_provider']}, left {lg['ls_left_rule']} of 50"))
    elif name == "identical":
        ok = lg["c1_ratio"] <= 1.3 and lg["c8_ratio"] <= 1.3
        out.append(("busiest <= 1.3x least busy at c1 and c8", ok, f"c1 {lg['c1_counts']} ({lg['c1_ratio']}), c8 {lg['c8_counts']} ({lg['c8_ratio']})"))
    elif name == "recovery":
        out.append(("recovered replica >= 35% of the next 100", lg["b_share_next_100"] >= 0.35, f"{lg['b_share_next_100']:.0%}"))
    elif name == "unequal":
        lo = rows.get("least_outstanding")
        out.append(("no healthy endpoint ejected", lg["healthy_ejections"] == 0, f"ejections {lg['ejections']}"))
        if lo is not None:
            out.append(("no more failures than least_outstanding", lg["errors"] <= lo["errors"], f"{lg['errors']} vs {lo['errors']}"))
            ok = lg["ls_p99_s"] is not None and lo["ls_p99_s"] is not None and lg["ls_p99_s"] <= within_noise(lo["ls_p99_s"])
            out.append(("LS p99 <= least_outstanding's", ok, f"{lg['ls_p99_s']} vs {lo['ls_p99_s']} s"))
    elif name == "overflow" and base:
        best = min(b["ls_e2e_p50_s"] for b in base if b["ls_e2e_p50_s"] is not None)
        ok = lg["ls_e2e_p50_s"] is not None and lg["ls_e2e_p50_s"] <= best / 2
        out.append(("LS p50 e2e at most half the better baseline's", ok, f"{lg['ls_e2e_p50_s']} vs {best} s"))
    return out


COLUMNS = ("requests", "errors", "slo", "ls_p50_s", "ls_p99_s")
EXTRA = {
    "cold": ("first_ls_provider", "ls_left_rule"),
    "identical": ("c1_counts", "c1_ratio", "c8_counts", "c8_ratio"),
    "recovery": ("b_share_next_100",),
    "full": ("overflows",),
    "unequal": ("healthy_ejections", "served"),
    "overflow": ("ls_e2e_p50_s", "ls_e2e_p99_s", "ls_served"),
}


def table(document: dict[str, dict[str, Any]]) -> str:
    """A markdown table per scenario: one row per system, then the targets."""
    lines = []
    for name, rows in document.items():
        columns = (*COLUMNS, *EXTRA.get(name, ()))
        lines.append(f"\n**{name}**\n")
        lines.append("| system | " + " | ".join(columns) + " |")
        lines.append("|---" * (len(columns) + 1) + "|")
        for system, row in rows.items():
            if "skipped" in row:
                lines.append(f"| {system} | skipped: {row['skipped']} |" + " |" * (len(columns) - 1))
                continue
            lines.append(f"| {system} | " + " | ".join(str(row.get(c)) for c in columns) + " |")
        for what, met, numbers in targets(name, {s: r for s, r in rows.items() if "skipped" not in r}):
            verdict = "met" if met else ("missed" if met is not None else "n/a")
            lines.append(f"\ntarget: {what}: **{verdict}** ({numbers})")
    return "\n".join(lines)


