"""The dependency-free SVG charts are well-formed XML and escape what they print."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from sandfleet.core.svg import line_chart, profile_chart


def test_profile_chart_is_valid_svg_with_every_phase() -> None:
    svg = profile_chart(
        "run <r1>",
        {"generation": 0.2, "sandbox": 0.5, "scoring": 0.3, "training": 0.0},
        [("generate", 0.2, 0.3), ("exec", 0.05, 1.4)],
        "verdict: rollout-sandbox -> warm pool & prefetch",
    )
    root = ET.fromstring(svg)
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "run <r1>" in texts
    assert "generate" in texts
    assert "sandbox 50%" in texts
    assert "warm pool & prefetch" in texts


def test_line_chart_handles_flat_and_empty_series() -> None:
    for values in ([], [0.5], [0.5, 0.5], [0.0, 0.25, 1.0]):
        root = ET.fromstring(line_chart("reward", values, "mean reward"))
        lines = list(root.iter("{http://www.w3.org/2000/svg}polyline"))
        assert len(lines) == (1 if values else 0)
