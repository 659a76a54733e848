"""An HTML page with plots of one or more replays, and of a load sweep.

matplotlib draws PNGs next to `index.html` (the Agg backend: no display needed). Plots: wait time
by size class per policy, utilisation over time, JCT CDFs, and for a sweep the curves of each
metric against the offered load with their 95 % confidence intervals.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from synapse.sim.metrics import SIZE_CLASSES, Summary, utilisation_series
from synapse.sim.replay import RunResult

if TYPE_CHECKING:  # matplotlib is optional (the sim extra): imported only to draw
    from matplotlib.figure import Figure

#: (metric, axis label, scale) of the load sweep curves.
SWEEP_CURVES = (("mean_jct_s", "mean JCT (h)", 3600), ("big_gang_p99_wait_s", "big-gang p99 wait (h)", 3600),
                ("useful_utilisation", "useful GPU utilisation", 1), ("single_rack_share", "single-rack share", 1))


class ReportError(RuntimeError):
    """The report cannot be drawn here (matplotlib missing)."""


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--report draws with matplotlib, which is not installed: "
                          "pip install 'synapse-scheduler[sim]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: ModuleType, fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_waits(path: Path, summaries: dict[str, Summary]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    classes = [name for name, *_ in SIZE_CLASSES]
    width = 0.8 / max(1, len(summaries))
    top = 0.0
    for i, (policy, s) in enumerate(summaries.items()):
        xs = [c + i * width for c in range(len(classes))]
        means = [s["by_size"].get(k, {}).get("mean_wait_s", math.nan) / 3600 for k in classes]
        p99 = [s["by_size"].get(k, {}).get("p99_wait_s", math.nan) / 3600 for k in classes]
        bars = ax.bar(xs, means, width, label=policy)
        ax.scatter(xs, p99, marker="_", s=120, color=bars.patches[0].get_facecolor())
        top = max([top, *(v for v in p99 + means if not math.isnan(v))])
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(classes))], [f"{k} GPUs" for k in classes])
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylim(0, max(1.0, top * 1.5))
    ax.set_ylabel("wait (h): bar mean, tick p99")
    ax.set_title("Wait by gang size")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def plot_utilisation(path: Path, runs: Sequence[RunResult]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for run in runs:
        series = utilisation_series(run, step=3 * 3600)
        ax.plot([t / 86400 for t, _ in series], [u for _, u in series], label=run.policy, linewidth=1)
    if runs:
        ax.axvline(runs[0].horizon / 86400, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("day (dotted: last submission)")
    ax.set_ylabel("GPUs allocated")
    ax.set_ylim(0, 1.02)
    ax.set_title("Utilisation over time (3-hour bins)")
    ax.legend(fontsize=8, ncol=3)
    _save(plt, fig, path)


def plot_jct_cdf(path: Path, runs: Sequence[RunResult]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for run in runs:
        jcts = sorted(r.end - r.submit for r in run.records if not math.isnan(r.end))
        ax.plot([max(j, 1) / 3600 for j in jcts], [(i + 1) / len(jcts) for i in range(len(jcts))], label=run.policy,
                linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("share of jobs")
    ax.set_title("JCT CDF")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def plot_sweep(path: Path, sweep: dict[str, Any]) -> None:
    """`sweep`: {"loads": [...], "policies": {NAME: {metric: [(mean, half width) per load]}}}."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(SWEEP_CURVES), figsize=(4 * len(SWEEP_CURVES), 3.5))
    for ax, (metric, label, scale) in zip(axes, SWEEP_CURVES, strict=True):
        for policy, curves in sweep["policies"].items():
            means = [m / scale for m, _ in curves[metric]]
            errs = [0 if math.isnan(h) else h / scale for _, h in curves[metric]]
            ax.errorbar(sweep["loads"], means, yerr=errs, label=policy, marker="o", markersize=3, capsize=3)
        ax.set_xlabel("offered load")
        ax.set_title(label)
    axes[0].legend(fontsize=8)
    _save(plt, fig, path)


def write_report(directory: str | Path, runs: Sequence[RunResult], summaries: dict[str, Summary], *, title: str,
                 sweep: dict[str, Any] | None = None, table_text: str = "") -> Path:
    """Write index.html and its PNGs into `directory`; returns the page's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, str, Callable[[Path], None]]] = [
               ("wait-by-size.png", "Wait by gang size", lambda p: plot_waits(p, summaries)),
               ("utilisation.png", "Utilisation over time", lambda p: plot_utilisation(p, runs)),
               ("jct-cdf.png", "JCT CDF", lambda p: plot_jct_cdf(p, runs))]
    if sweep is not None:
        figures.append(("load-sweep.png", "Load sweep", lambda p: plot_sweep(p, sweep)))
    body = [f"<h1>{html.escape(title)}</h1>"]
    if table_text:
        body.append(f"<pre>{html.escape(table_text)}</pre>")
    for name, caption, draw in figures:
        draw(out / name)
        body.append(f"<h2>{html.escape(caption)}</h2><img src=\"{name}\" alt=\"{html.escape(caption)}\">")
    page = out / "index.html"
    page.write_text("<!doctype html><html><head><meta charset=\"utf-8\"><title>"
                    f"{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}"
                    "pre{font-size:12px}</style></head><body>" + "".join(body) + "</body></html>\n")
    return page
