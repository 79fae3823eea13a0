"""`sandfleet rl`: build the real tasks' image and run the reference async actor/learner loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from sandfleet.cli import app
from sandfleet.cli.client_commands import TOKEN, URL, console

rl = typer.Typer(help="The reference RL loop: real tasks, async actors, a learner.", no_args_is_help=True)
app.add_typer(rl, name="rl")


@rl.command("build-tasks")
def build_tasks() -> None:
    """Fetch the tasks' packages from PyPI (cached), break them, build the task image (root)."""
    from sandfleet.rl.tasks import TaskBuildError, build_image

    try:
        typer.echo(json.dumps(build_image()))
    except TaskBuildError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None


@rl.command("run")
def run(
    pool: Annotated[
        str, typer.Option(help="Pool serving the task image (`serve --local --tasks`).")
    ] = "default",
    run_name: Annotated[str, typer.Option("--run", help="Run name (labels, policy, profile).")] = "demo",
    actors: Annotated[int, typer.Option(min=1, max=64, help="Concurrent actors.")] = 2,
    duration: Annotated[float, typer.Option(min=1, help="Seconds to run.")] = 60.0,
    batch_size: Annotated[int, typer.Option(min=1, help="Trajectories per learner step.")] = 4,
    staleness_bound: Annotated[int, typer.Option(min=0, help="Versions an actor may lag.")] = 4,
    think: Annotated[float, typer.Option(min=0, help="Simulated generation seconds per episode.")] = 0.2,
    plots: Annotated[Path | None, typer.Option(help="Directory for reward.svg and profile.svg.")] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Write the summary as JSON here.")] = None,
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Run actors and a learner over the real tasks; print lease latency, reward curve and profile."""
    import asyncio

    from rich.console import Console

    from sandfleet.cli.run_commands import profile_svg, render_profile
    from sandfleet.client import AsyncFleet
    from sandfleet.core.svg import line_chart
    from sandfleet.rl.loop import LoopConfig, LoopStats, reward_curve, run_loop

    config = LoopConfig(
        run=run_name,
        pool=pool,
        actors=actors,
        duration_seconds=duration,
        batch_size=batch_size,
        staleness_bound=staleness_bound,
        think_seconds=think,
    )

    def progress(stats: LoopStats) -> None:
        recent = stats.rewards[-20:]
        mean = sum(recent) / len(recent) if recent else 0.0
        version = stats.updates[-1].version if stats.updates else 0
        console.print(
            f"rl: {stats.episodes} episodes, policy v{version}, reward (last 20) {mean:.2f}, "
            f"refused {stats.refused}, dropped stale {stats.dropped_stale}, errors {len(stats.errors)}"
        )

    async def main() -> tuple[LoopStats, dict[str, Any]]:
        async with AsyncFleet(url=url, token=token) as fleet:
            stats, _ = await run_loop(fleet, config, progress)
            return stats, await fleet.profile(run_name, window_seconds=duration + 30)

    try:
        stats, profile = asyncio.run(main())
    except Exception as error:  # the loop's failure in one line, not a stack trace
        console.print(f"[red]error:[/red] {type(error).__name__}: {error}")
        raise typer.Exit(1) from None
    out = Console()
    curve = reward_curve(stats)
    lease = stats.lease_percentiles()
    out.print(
        f"\n{stats.episodes} episodes by {actors} actors in {duration:.0f}s; "
        f"{len(stats.updates)} learner steps; refused {stats.refused}; dropped stale {stats.dropped_stale}"
    )
    out.print("lease latency: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in lease.items()))
    out.print("reward curve (mean per slice): " + " ".join(f"{r:.2f}" for r in curve))
    out.print("P(correct edit): " + ", ".join(f"{t} {p:.2f}" for t, p in stats.probabilities_correct.items()))
    for failure in stats.errors[:5]:
        out.print(f"[yellow]episode error:[/yellow] {failure}")
    out.print(render_profile(profile))
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
        (plots / "reward.svg").write_text(line_chart(f"reward, run {run_name}", curve, "mean reward"))
        (plots / "profile.svg").write_text(profile_svg(profile))
        out.print(f"plots: {plots / 'reward.svg'}, {plots / 'profile.svg'}")
    if summary_json is not None:
        summary_json.write_text(
            json.dumps(
                {
                    "episodes": stats.episodes,
                    "refused": stats.refused,
                    "dropped_stale": stats.dropped_stale,
                    "errors": stats.errors,
                    "lease_seconds": lease,
                    "reward_curve": curve,
                    "probabilities_correct": stats.probabilities_correct,
                    "learner_steps": len(stats.updates),
                    "profile": profile,
                },
                indent=2,
            )
        )
