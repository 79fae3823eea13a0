"""The figures are valid SVG or PNG with their titles and axis labels; a missing matplotlib is one line."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import sandfleet.cli.run_commands
from sandfleet import plots
from sandfleet.cli import app

SVG = "{http://www.w3.org/2000/svg}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _texts(path: Path) -> str:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return " | ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


def test_profile_figure_is_valid_svg_with_every_phase(tmp_path: Path) -> None:
    figure = plots.profile_figure(
        "run <r1>",
        {"generation": 0.2, "sandbox": 0.5, "scoring": 0.3, "training": 0.0},
        [("generate", 0.2, 0.3), ("exec", 0.05, 1.4)],
        "verdict: rollout-sandbox -> warm pool & prefetch",
    )
    plots.save(figure, tmp_path / "profile.svg")
    texts = _texts(tmp_path / "profile.svg")
    assert "run <r1>" in texts
    assert "generate" in texts
    assert "sandbox 50%" in texts
    assert "warm pool & prefetch" in texts
    assert "share of the loop's time (%)" in texts
    assert "phase duration (s)" in texts
    assert "p50 0.050 s  p99 1.400 s" in texts


@pytest.mark.parametrize("rewards", [[], [0.5], [0.5, 0.5], [0.0, 0.25, 1.0]])
def test_reward_figure_handles_flat_and_empty_series(tmp_path: Path, rewards: list[float]) -> None:
    plots.save(plots.reward_figure("reward, run r1", rewards), tmp_path / "reward.svg")
    texts = _texts(tmp_path / "reward.svg")
    assert "reward, run r1" in texts
    assert "episode (in completion order)" in texts
    assert "reward (unitless" in texts
    if rewards:
        assert f"rolling mean over {len(rewards)} episode" in texts


def test_reward_figure_shows_the_rolling_window_it_used(tmp_path: Path) -> None:
    plots.save(plots.reward_figure("reward", [0.0, 1.0] * 30, window=10), tmp_path / "reward.svg")
    assert "rolling mean over 10 episodes" in _texts(tmp_path / "reward.svg")


def test_rolling_mean_averages_up_to_the_window_behind_each_point() -> None:
    assert plots.rolling_mean([], 3) == []
    assert plots.rolling_mean([1.0, 2.0, 3.0, 4.0], 1) == [1.0, 2.0, 3.0, 4.0]
    assert plots.rolling_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert plots.rolling_mean([0.0, 3.0, 6.0, 0.0], 3) == [0.0, 1.5, 3.0, 3.0]
    assert plots.rolling_mean([2.0, 4.0], 10) == [2.0, 3.0]
    with pytest.raises(ValueError, match="at least one"):
        plots.rolling_mean([1.0], 0)


def test_latency_cdf_labels_its_log_axis_and_skips_empty_series(tmp_path: Path) -> None:
    series = {"warm lease": [1.0, 2.0, 4.0, 40.0], "exec": [0.0, 7.5], "nothing": []}
    plots.save(plots.latency_cdf_figure("gateway: latency", series), tmp_path / "latency.svg")
    texts = _texts(tmp_path / "latency.svg")
    assert "latency (ms, log scale)" in texts
    assert "requests at or below" in texts
    assert "warm lease (n=4, p50 4 ms)" in texts
    assert "exec (n=1, p50 7.5 ms)" in texts  # 0 has no place on a log axis
    assert "nothing" not in texts
    plots.save(plots.latency_cdf_figure("empty", {}), tmp_path / "empty.svg")
    assert "latency (ms, log scale)" in _texts(tmp_path / "empty.svg")


def test_curves_are_written_as_png_too(tmp_path: Path) -> None:
    figure = plots.curves_figure(
        "fill", {"SandboxPool": [(0.0, 0.0), (2.0, 10.0)]}, "time since created (s)", "Ready sandboxes"
    )
    plots.save(figure, tmp_path / "fill.svg")
    texts = _texts(tmp_path / "fill.svg")
    assert "time since created (s)" in texts
    assert "Ready sandboxes" in texts
    assert "SandboxPool (10 at 2)" in texts
    plots.save(figure, tmp_path / "fill.png")
    assert (tmp_path / "fill.png").read_bytes().startswith(PNG_MAGIC)


def test_other_file_types_and_a_missing_matplotlib_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figure = plots.curves_figure("fill", {}, "s", "Ready")
    with pytest.raises(plots.PlotError, match=r"use a \.svg or \.png file"):
        plots.save(figure, tmp_path / "fill.pdf")
    assert not (tmp_path / "fill.pdf").exists()
    for module in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, module, None)  # what an import without the extra sees
    with pytest.raises(plots.PlotError, match=r"pip install 'sandfleet\[plots\]'"):
        plots.check()
    with pytest.raises(plots.PlotError, match="plots need matplotlib"):
        plots.reward_figure("reward", [1.0])


def test_the_profile_command_refuses_a_plot_it_cannot_write_before_asking_the_gateway(
    tmp_path: Path,
) -> None:
    # Port 9 is never asked: the check comes first, so this fails on the suffix, not the connection.
    args = ["profile", "r1", "--plot", str(tmp_path / "profile.txt"), "--url", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "use a .svg or .png file" in " ".join(result.output.split())  # rich wraps long lines
    assert "Traceback" not in result.output


class _FakeFleet:
    def __enter__(self) -> _FakeFleet:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def profile(self, run: str, window: float) -> dict[str, Any]:
        phase = {"category": "sandbox", "count": 3, "total_seconds": 0.6, "p90_seconds": 0.3}
        return {
            "run": run,
            "window_seconds": window,
            "split": {"generation": 0.4, "sandbox": 0.6},
            "learner_busy": None,
            "phases": [{**phase, "phase": "exec", "p50_seconds": 0.2, "p99_seconds": 0.31}],
            "verdict": {"bottleneck": "rollout-sandbox", "reason": "r", "lever": "raise the warm target"},
        }


@pytest.mark.parametrize("name", ["profile.svg", "profile.png"])
def test_the_profile_command_writes_its_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(sandfleet.cli.run_commands, "_fleet", lambda url, token: _FakeFleet())
    plot = tmp_path / name
    result = CliRunner().invoke(app, ["profile", "r1", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    if name.endswith(".png"):
        assert plot.read_bytes().startswith(PNG_MAGIC)
        return
    texts = _texts(plot)
    assert "sandfleet loop profile: run r1" in texts
    assert "verdict: rollout-sandbox -> raise the warm target" in texts
    assert "p50 0.200 s  p99 0.310 s" in texts


def test_bars_figure_shows_every_bar_its_value_and_the_marks(tmp_path: Path) -> None:
    figure = plots.bars_figure(
        "writes per episode",
        {"DELETE pods": 3.0, "PATCH pods": 2.0, "POST events": 1.0},
        "apiserver writes per episode",
        marks={"target without recycling": 1.5},
    )
    plots.save(figure, tmp_path / "bars.svg")
    texts = _texts(tmp_path / "bars.svg")
    for expected in ("writes per episode", "DELETE pods", "POST events", "3", "apiserver writes per episode"):
        assert expected in texts
    assert "target without recycling" in texts


def test_bars_figure_with_no_bars_is_still_a_figure(tmp_path: Path) -> None:
    plots.save(plots.bars_figure("nothing measured", {}, "count"), tmp_path / "empty.svg")
    assert "nothing measured" in _texts(tmp_path / "empty.svg")
