"""A PNG of a bench run: the TTFT distribution and the tokens/s distribution.

matplotlib is optional (``pip install 'latgate[plot]'``); it is imported only when a
plot is asked for, with the non-interactive Agg backend so no display is needed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from latgate.bench.sample import RequestSample
from latgate.bench.stats import summarize

INSTALL_HINT = "--plot needs matplotlib: pip install 'latgate[plot]'"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def ensure_plotting_available() -> None:
    """Raise PlotUnavailableError (with the install hint) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotUnavailableError(INSTALL_HINT)


def write_plot(path: Path, samples: Sequence[RequestSample], *, title: str) -> None:
    """Write a PNG with two histograms (TTFT in ms, decode tokens/s) of the successful samples.

    Each histogram marks p50/p90/p99 with vertical lines; an empty one says so.
    Raises PlotUnavailableError without matplotlib, OSError if ``path`` cannot be written.
    """
    ensure_plotting_available()
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    ok = [s for s in samples if s.ok]
    panels = (
        ("time to first token (ms)", [s.ttft_ms for s in ok if s.ttft_ms is not None]),
        ("decode tokens/s per request", [s.tokens_per_second for s in ok if s.tokens_per_second is not None]),
    )
    # Figure() directly (not pyplot): no global figure registry, nothing to close.
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    figure.suptitle(title)
    for axes, (label, values) in zip(figure.subplots(1, 2), panels, strict=True):
        axes.set_xlabel(label)
        axes.set_ylabel("requests")
        metric = summarize(values)
        if metric is None:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
            continue
        axes.hist(values, bins=min(50, max(5, len(values) // 4)), color="#4C72B0")
        for name, value, style in (
            ("p50", metric.p50, "-"),
            ("p90", metric.p90, "--"),
            ("p99", metric.p99, ":"),
        ):
            axes.axvline(value, color="#C44E52", linestyle=style, label=f"{name} {value:.1f}")
        axes.legend(loc="upper right")
    figure.savefig(path, format="png", dpi=100)
