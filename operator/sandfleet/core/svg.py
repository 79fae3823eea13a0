"""Small SVG charts with no plotting dependency: the loop profile's split and a reward curve."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from html import escape

COLOURS = {"generation": "#4c78a8", "sandbox": "#f58518", "scoring": "#54a24b", "training": "#e45756"}
WIDTH = 640


def _document(height: int, body: list[str], title: str) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif" font-size="12">',
            f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
            f'<text x="10" y="20" font-size="15" font-weight="bold">{escape(title)}</text>',
            *body,
            "</svg>",
        ]
    )


def profile_chart(
    title: str,
    split: Mapping[str, float],
    phases: Sequence[tuple[str, float, float]],
    verdict: str,
) -> str:
    """A stacked bar of the category split, p50/p99 bars per phase (seconds), and the verdict."""
    body: list[str] = []
    x = 10.0
    for category, share in split.items():
        width = max(share, 0.0) * (WIDTH - 20)
        colour = COLOURS.get(category, "#999999")
        body.append(f'<rect x="{x:.1f}" y="35" width="{width:.1f}" height="28" fill="{colour}"/>')
        if share * (WIDTH - 20) >= 8 * (len(category) + 5):  # only where the label fits
            body.append(f'<text x="{x + 4:.1f}" y="54" fill="white">{escape(category)} {share:.0%}</text>')
        x += width
    longest = max((p99 for _, _, p99 in phases), default=0.0) or 1.0
    y = 85
    for phase, p50, p99 in phases:
        scale = (WIDTH - 330) / longest  # leaves room for the p50/p99 label after the bar
        body.append(f'<text x="10" y="{y + 12}">{escape(phase)}</text>')
        body.append(f'<rect x="110" y="{y}" width="{p99 * scale:.1f}" height="14" fill="#bbbbbb"/>')
        body.append(f'<rect x="110" y="{y}" width="{p50 * scale:.1f}" height="14" fill="#4c78a8"/>')
        body.append(f'<text x="{115 + p99 * scale:.1f}" y="{y + 12}">p50 {p50:.3f}s  p99 {p99:.3f}s</text>')
        y += 20
    for line in textwrap.wrap(verdict, 95):
        body.append(f'<text x="10" y="{y + 20}">{escape(line)}</text>')
        y += 16
    return _document(y + 20, body, title)


def line_chart(title: str, values: Sequence[float], y_label: str = "") -> str:
    """A line through `values` (e.g. mean reward per learner step), with its range on the axis."""
    height, left, top, bottom = 260, 50, 35, 30
    plot_w, plot_h = WIDTH - left - 20, height - top - bottom
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5
    points = " ".join(
        f"{left + i * plot_w / max(len(values) - 1, 1):.1f},"
        f"{top + plot_h - (v - low) / (high - low) * plot_h:.1f}"
        for i, v in enumerate(values)
    )
    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
        f'<text x="5" y="{top + 10}">{high:.2f}</text>',
        f'<text x="5" y="{top + plot_h}">{low:.2f}</text>',
        f'<text x="{left}" y="{height - 8}">{escape(y_label)} ({len(values)} points)</text>',
    ]
    if values:
        body.append(f'<polyline points="{points}" fill="none" stroke="#4c78a8" stroke-width="2"/>')
    return _document(height, body, title)
