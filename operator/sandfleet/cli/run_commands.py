"""Run commands: `sandfleet profile RUN` (the loop profile and its verdict) and `sandfleet policy RUN`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sandfleet.cli.app import app
from sandfleet.cli.client_commands import AS_JSON, TOKEN, URL, _fail, _fleet, _run, console
from sandfleet.wire import POLICY_MODES, PolicyAnswer, PolicyMode, ProfileAnswer


def render_profile(data: ProfileAnswer) -> Table:
    """The profile as a table: one row per phase, then the split and the verdict in the caption."""
    table = Table(title=f"loop profile of run {data['run']} (last {data['window_seconds']:.0f}s)")
    for column in ("phase", "category", "count", "total s", "p50 s", "p90 s", "p99 s"):
        table.add_column(column, justify="left" if column in ("phase", "category") else "right")
    for p in data["phases"]:
        table.add_row(
            p["phase"],
            p["category"],
            str(p["count"]),
            f"{p['total_seconds']:.2f}",
            f"{p['p50_seconds']:.3f}",
            f"{p['p90_seconds']:.3f}",
            f"{p['p99_seconds']:.3f}",
        )
    split = ", ".join(f"{c} {share:.0%}" for c, share in data["split"].items())
    busy = data["learner_busy"]
    verdict = data["verdict"]
    table.caption = (
        f"split: {split}"
        + (f"; learner busy {busy:.0%}" if busy is not None else "")
        + f"\nverdict: {verdict['bottleneck']} ({verdict['reason']})\nlever: {verdict['lever']}"
    )
    return table


def write_profile_plot(data: ProfileAnswer, path: Path) -> None:
    """The profile as a picture (SVG or PNG, by the suffix of `path`)."""
    from sandfleet import plots

    verdict = data["verdict"]
    figure = plots.profile_figure(
        f"sandfleet loop profile: run {data['run']}",
        data["split"],
        [(p["phase"], p["p50_seconds"], p["p99_seconds"]) for p in data["phases"]],
        f"verdict: {verdict['bottleneck']} -> {verdict['lever']}",
    )
    plots.save(figure, path)


def policy_mode(mode: str | None) -> PolicyMode | None:
    """A --mode as the policy's mode (refuse or flag), or a usage error naming them."""
    if mode is None:
        return None
    for known in POLICY_MODES:
        if mode == known:
            return known
    raise typer.BadParameter(f"--mode must be {' or '.join(POLICY_MODES)}")


def check_plot(path: Path | None) -> None:
    """Fail in one line before any work when a plot is asked for and cannot be written."""
    from sandfleet.plots import PlotError, check

    if path is not None:
        try:
            check(path)
        except PlotError as error:
            raise _fail(error) from None


@app.command()
def profile(
    run: Annotated[str, typer.Argument(help="The run (the `run` label on its leases).")],
    window: Annotated[float, typer.Option(help="Seconds to look back.")] = 300.0,
    plot: Annotated[
        Path | None, typer.Option(help="Write the profile as a picture here (.svg or .png).")
    ] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Where the RL loop spends its time, percentiles per phase, and the bottleneck with its lever."""
    check_plot(plot)
    with _fleet(url, token) as fleet:
        data: ProfileAnswer = _run(lambda: fleet.profile(run, window))
    if plot is not None:
        write_profile_plot(data, plot)
        console.print(f"wrote {plot}")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console

    Console().print(render_profile(data))


@app.command()
def policy(
    run: Annotated[str, typer.Argument(help="The run.")],
    publish: Annotated[int | None, typer.Option(help="Publish this policy version.")] = None,
    bound: Annotated[int | None, typer.Option(help="Staleness bound in versions.")] = None,
    mode: Annotated[str | None, typer.Option(help="refuse or flag, beyond the bound.")] = None,
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Show a run's policy version and staleness rules, or publish a version."""
    chosen = policy_mode(mode)
    with _fleet(url, token) as fleet:
        data: PolicyAnswer
        if publish is not None:
            data = _run(lambda: fleet.publish_policy(run, publish, bound, chosen))
        else:
            data = _run(lambda: fleet.policy(run))
    typer.echo(json.dumps(data, indent=2))
