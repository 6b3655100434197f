"""A PNG of a bench run: the TTFT, tokens/s and e2e latency distributions, by the
provider that served each request.

matplotlib is optional (``pip install 'latgate[plot]'``); it is imported only when a
plot is asked for, with the non-interactive Agg backend so no display is needed.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from latgate.commands.bench.sample import RequestSample
from latgate.commands.bench.stats import summarize

INSTALL_HINT = "--plot needs matplotlib: pip install 'latgate[plot]'"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def ensure_plotting_available() -> None:
    """Raise PlotUnavailableError (with the install hint) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotUnavailableError(INSTALL_HINT)


#: the panels, left to right: (axis label, sample attribute)
PANELS = (
    ("time to first token (ms)", "ttft_ms"),
    ("decode tokens/s per request", "tokens_per_second"),
    ("end-to-end latency (ms)", "e2e_ms"),
)
UNKNOWN_PROVIDER = "(no X-Latgate-Provider)"


def served_by(samples: Sequence[RequestSample]) -> str:
    """Who served the successful samples, most first: ``"tile-rt x120, vllm x3"``."""
    counts = Counter(s.provider or UNKNOWN_PROVIDER for s in samples if s.ok)
    return ", ".join(f"{name} x{count}" for name, count in counts.most_common()) or "no successful request"


def panel_values(samples: Sequence[RequestSample]) -> list[tuple[str, dict[str, list[float]]]]:
    """Per panel of :data:`PANELS`: its label and the successful samples' values by
    provider (providers in order of first appearance; ``None`` values left out)."""
    ok = [s for s in samples if s.ok]
    out = []
    for label, attribute in PANELS:
        by_provider: dict[str, list[float]] = {}
        for sample in ok:
            value = getattr(sample, attribute)
            if value is not None:
                by_provider.setdefault(sample.provider or UNKNOWN_PROVIDER, []).append(value)
        out.append((label, by_provider))
    return out


def write_plot(path: Path, samples: Sequence[RequestSample], *, title: str) -> None:
    """Write a PNG with three histograms of the successful samples (TTFT in ms, decode
    tokens/s, e2e in ms), stacked by the provider that served each request (the title
    says who served how many).

    Each histogram marks p50/p90/p99 of all providers with vertical lines; an empty
    one says so. Raises PlotUnavailableError without matplotlib, OSError if ``path``
    cannot be written.
    """
    ensure_plotting_available()
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    # Figure() directly (not pyplot): no global figure registry, nothing to close.
    figure = Figure(figsize=(15, 4.4), layout="constrained")
    figure.suptitle(f"{title}\nserved by {served_by(samples)}")
    for axes, (label, by_provider) in zip(figure.subplots(1, len(PANELS)), panel_values(samples), strict=True):
        axes.set_xlabel(label)
        axes.set_ylabel("requests")
        axes.locator_params(axis="x", nbins=5)  # at most ~6 x labels: long ones (45.825) never touch
        values = [v for group in by_provider.values() for v in group]
        metric = summarize(values)
        if metric is None:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
            continue
        axes.hist(
            list(by_provider.values()),
            bins=min(50, max(5, len(values) // 4)),
            stacked=True,
            label=list(by_provider),
            color=[COLORS[i % len(COLORS)] for i in range(len(by_provider))],
        )
        for name, value, style in (
            ("p50", metric.p50, "-"),
            ("p90", metric.p90, "--"),
            ("p99", metric.p99, ":"),
        ):
            axes.axvline(value, color="#C44E52", linestyle=style, label=f"{name} {value:.1f}")
        axes.legend(loc="upper right", fontsize="small")
    figure.savefig(path, format="png", dpi=100)


COLORS = ("#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C")
