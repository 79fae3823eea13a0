"""The CLI's and the benchmarks' figures, drawn with matplotlib (the optional `plots` extra)."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("svg", "png")
COLOURS = {"generation": "#4c78a8", "sandbox": "#f58518", "scoring": "#54a24b", "training": "#e45756"}
WIDTH = 7.2  # inches; 720 px at the default 100 dpi, as wide as the report's column
MISSING = "plots need matplotlib: pip install 'sandfleet[plots]'"


class PlotError(Exception):
    """A plot cannot be drawn: matplotlib is missing, or the file is not .svg or .png."""


def check(path: Path | None = None) -> None:
    """Raise PlotError now, before any work, if a plot (to `path`) could not be written later."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(MISSING) from None
    if path is not None and path.suffix.lstrip(".").lower() not in FORMATS:
        raise PlotError(f"cannot write a plot to {path}: use a .svg or .png file")


def save(figure: Figure, path: Path) -> None:
    """Write `figure` to `path` as SVG or PNG, by the file's suffix."""
    check(path)
    import matplotlib

    kind = path.suffix.lstrip(".").lower()
    # Text stays <text> (searchable, small) and no date or random ids: committed figures diff cleanly.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sandfleet"}):
        figure.savefig(path, format=kind, metadata={"Date": None} if kind == "svg" else None)


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and up to `window - 1` before it (the first points average fewer)."""
    if window < 1:
        raise ValueError(f"a rolling window needs at least one value, not {window}")
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def _figure(height: float) -> Figure:
    # Figure without pyplot: no global state and no GUI backend, so it is safe in servers and threads.
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(MISSING) from None
    return Figure(figsize=(WIDTH, height), layout="constrained")


def profile_figure(
    title: str,
    split: Mapping[str, float],
    phases: Sequence[tuple[str, float, float]],
    verdict: str,
) -> Figure:
    """The loop profile: the share of time per category, p50/p99 seconds per phase, and the verdict."""
    figure = _figure(2.4 + 0.3 * max(len(phases), 1))
    share_axes, phase_axes = figure.subplots(2, 1, height_ratios=[1, max(len(phases), 2)])
    left = 0.0
    for category, share in split.items():
        width = max(share, 0.0) * 100
        colour = COLOURS.get(category, "#999999")
        share_axes.barh(0, width, left=left, color=colour, label=f"{category} {share:.0%}")
        left += width
    share_axes.set_xlim(0, 100)
    share_axes.set_yticks([])
    share_axes.set_xlabel("share of the loop's time (%)")
    if split:
        share_axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=len(split), frameon=False)
    rows = range(len(phases))
    p99 = phase_axes.barh(rows, [p for _, _, p in phases], color="#bbbbbb", label="p99")
    phase_axes.barh(rows, [p for _, p, _ in phases], color="#4c78a8", label="p50")
    labels = [f"p50 {p50:.3f} s  p99 {p99_:.3f} s" for _, p50, p99_ in phases]
    phase_axes.bar_label(p99, labels=labels, padding=4, fontsize="small")
    phase_axes.margins(x=0.45)  # room for the p50/p99 label after the longest bar
    phase_axes.set_xlim(left=0)
    phase_axes.set_yticks(list(rows), [name for name, _, _ in phases])
    phase_axes.invert_yaxis()
    phase_axes.set_xlabel("phase duration (s)")
    if phases:  # beside the axes: inside, it would cover a bar or its label
        phase_axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    figure.suptitle(title)
    # The verdict goes under the axes as a figure-wide label, so the layout makes room for it.
    figure.supxlabel("\n".join(textwrap.wrap(verdict, 100)), fontsize="small")
    return figure


def reward_figure(title: str, rewards: Sequence[float], window: int = 20) -> Figure:
    """Reward per episode (in completion order) and its rolling mean over `window` episodes."""
    figure = _figure(3.6)
    axes = figure.subplots()
    episodes = range(1, len(rewards) + 1)
    window = max(1, min(window, len(rewards)))
    axes.scatter(episodes, rewards, s=10, alpha=0.35, color="#4c78a8", label="reward of an episode")
    axes.plot(
        episodes,
        rolling_mean(rewards, window),
        color="#e45756",
        linewidth=2,
        label=f"rolling mean over {window} episode{'s' if window > 1 else ''}",
    )
    axes.set_title(title)
    axes.set_xlabel("episode (in completion order)")
    axes.set_ylabel("reward (unitless, from the task's tests)")
    if rewards:
        axes.legend(loc="lower right")
    return figure


def latency_cdf_figure(title: str, series: Mapping[str, Sequence[float]], unit: str = "ms") -> Figure:
    """Cumulative distributions of latency samples on a log x axis, one line per series."""
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    figure = _figure(4.4)
    axes = figure.subplots()
    drawn = False
    for name, samples in series.items():
        values = sorted(v for v in samples if v > 0)  # a log axis has no place for 0
        if not values:
            continue
        n = len(values)
        fractions = [(i + 1) / n for i in range(n)]
        label = f"{name} (n={n}, p50 {values[n // 2]:.3g} {unit})"
        axes.step(values, fractions, where="post", linewidth=1.8, label=label)
        drawn = True
    axes.axhline(0.99, color="#999999", linestyle=":", linewidth=1)
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 100, not 10^2
    axes.set_ylim(0, 1.02)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.grid(True, which="major", color="#eeeeee")
    axes.set_title(title)
    axes.set_xlabel(f"latency ({unit}, log scale)")
    axes.set_ylabel("requests at or below (%; dotted: p99)")
    if drawn:
        figure.legend(loc="outside lower center", fontsize="small", frameon=False)
    return figure


def curves_figure(
    title: str, series: Mapping[str, Sequence[tuple[float, float]]], x_label: str, y_label: str
) -> Figure:
    """Lines through (x, y) points, e.g. Ready sandboxes over seconds since the fill began."""
    figure = _figure(3.8)
    axes = figure.subplots()
    drawn = False
    for name, points in series.items():
        if not points:
            continue
        xs, ys = [x for x, _ in points], [y for _, y in points]
        axes.plot(xs, ys, linewidth=2, label=f"{name} ({ys[-1]:g} at {xs[-1]:g})")
        drawn = True
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(True, color="#eeeeee")
    axes.set_title(title)
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    if drawn:
        axes.legend(loc="lower right", fontsize="small")
    return figure


def bars_figure(
    title: str, values: Mapping[str, float], x_label: str, marks: Mapping[str, float] | None = None
) -> Figure:
    """Horizontal bars, largest on top, each labelled with its value.

    `marks` are dashed lines at named values (e.g. a target): how far the bars are from them.
    """
    figure = _figure(0.8 + 0.32 * max(len(values), 3))
    axes = figure.subplots()
    ordered = sorted(values.items(), key=lambda item: item[1])
    names, numbers = [name for name, _ in ordered], [number for _, number in ordered]
    axes.barh(names, numbers, color="#4c78a8")
    for y, number in enumerate(numbers):
        axes.annotate(f"{number:.3g}", (number, y), xytext=(3, 0), textcoords="offset points", va="center")
    for n, (name, at) in enumerate((marks or {}).items()):
        axes.axvline(
            at, color=("#e45756", "#54a24b", "#999999")[n % 3], linestyle="--", linewidth=1.2, label=name
        )
    axes.set_xlim(left=0, right=max([*numbers, *(marks or {}).values(), 0.0]) * 1.15 or 1.0)
    axes.grid(True, axis="x", color="#eeeeee")
    axes.set_axisbelow(True)
    axes.set_title(title)
    axes.set_xlabel(x_label)
    if marks:
        axes.legend(loc="lower right", fontsize="small")
    return figure
