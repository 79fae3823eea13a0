"""SVG plots for the benchmark report, with no plotting dependency: latency distributions and fill curves."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")


def _frame(title: str, body: list[str], x_label: str, y_label: str, legend: Sequence[str]) -> str:
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text x="14" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f})">{escape(y_label)}</text>',
        *body,
    ]
    # Bottom right: both the CDFs and the fill curves rise from there, so it is the empty corner.
    left = WIDTH - RIGHT - 420
    for index, name in enumerate(legend):
        y = HEIGHT - BOTTOM - 8 - (len(legend) - 1 - index) * 16
        colour = PALETTE[index % len(PALETTE)]
        lines.append(f'<rect x="{left}" y="{y - 9}" width="12" height="10" fill="{colour}"/>')
        lines.append(f'<text x="{left + 18}" y="{y}">{escape(name)}</text>')
    lines.append("</svg>")
    return "\n".join(lines)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _label(value: float) -> str:
    if value != 0 and (abs(value) >= 10_000 or abs(value) < 0.01):
        return f"{value:.0e}"
    return f"{value:g}" if value == int(value) else f"{value:.2f}".rstrip("0")


def _axes(x_ticks: list[tuple[float, str]], y_ticks: list[tuple[float, str]]) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    body = [
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="black"/>',
    ]
    for x, text in x_ticks:
        body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="#eeeeee"/>')
        body.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{escape(text)}</text>')
    for y, text in y_ticks:
        body.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#eeeeee"/>')
        body.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>')
    return body


def latency_cdf(title: str, series: Mapping[str, Sequence[float]], unit: str = "ms") -> str:
    """Cumulative distributions of latency samples on a log x axis (one line per series)."""
    present = {name: sorted(v for v in values if v > 0) for name, values in series.items()}
    present = {name: values for name, values in present.items() if values}
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    everything = [v for values in present.values() for v in values] or [1.0]
    low = 10 ** math.floor(math.log10(min(everything)))
    high = 10 ** math.ceil(math.log10(max(everything)))
    if high <= low:
        high = low * 10
    span = math.log10(high) - math.log10(low)

    def x_of(value: float) -> float:
        return LEFT + (math.log10(value) - math.log10(low)) / span * plot_w

    def y_of(fraction: float) -> float:
        return TOP + plot_h - fraction * plot_h

    decades = [low * 10**i for i in range(round(span) + 1)]
    body = _axes(
        [(x_of(v), _label(v)) for v in decades],
        [(y_of(f), f"{f:.0%}") for f in (0.0, 0.25, 0.5, 0.75, 0.99, 1.0) if f != 0.99]
        + [(y_of(0.99), "p99")],
    )
    for index, values in enumerate(present.values()):
        n = len(values)
        points = " ".join(f"{x_of(v):.1f},{y_of((i + 1) / n):.1f}" for i, v in enumerate(values))
        colour = PALETTE[index % len(PALETTE)]
        body.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
    legend = [
        f"{name} (n={len(values)}, p50 {values[len(values) // 2]:g} {unit})"
        for name, values in present.items()
    ]
    return _frame(title, body, f"latency ({unit}, log scale)", "fraction of requests at or below", legend)


def curves(
    title: str, series: Mapping[str, Sequence[tuple[float, float]]], x_label: str, y_label: str
) -> str:
    """Lines through (x, y) points, e.g. Ready sandboxes over seconds since the fill began."""
    present = {name: list(points) for name, points in series.items() if points}
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    xs = [x for points in present.values() for x, _ in points] or [0.0, 1.0]
    ys = [y for points in present.values() for _, y in points] or [0.0, 1.0]
    x_high = max(xs) or 1.0
    y_high = max(ys) or 1.0

    def x_of(value: float) -> float:
        return LEFT + value / x_high * plot_w

    def y_of(value: float) -> float:
        return TOP + plot_h - value / y_high * plot_h

    body = _axes(
        [(x_of(v), _label(v)) for v in _ticks(0, x_high)],
        [(y_of(v), _label(v)) for v in _ticks(0, y_high)],
    )
    for index, points in enumerate(present.values()):
        line = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in points)
        colour = PALETTE[index % len(PALETTE)]
        body.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
    legend = [f"{name} ({points[-1][1]:g} at {points[-1][0]:g})" for name, points in present.items()]
    return _frame(title, body, x_label, y_label, legend)
