"""`sandfleet rl`: build the real tasks' image, run the loop in one process, or run its learner and actors.

The tasks come from a task catalogue: `--tasks CATALOGUE` (SANDFLEET_TASKS), by default tasks/ci.yaml.

`rl run` is the demo's path (actors and learner in one process). `rl learner` and `rl actor` are the
same classes as separate processes, as the chart's GPU Deployments run them: both reach the gateway
(`--url`, SANDFLEET_GATEWAY_URL or SANDFLEET_URL; `--token`/SANDFLEET_TOKEN or `--token-file`/
SANDFLEET_TOKEN_FILE for a projected ServiceAccount token), and actors reach the learner's endpoint
(`--learner-url`, SANDFLEET_LEARNER_URL).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sandfleet.cli.app import app
from sandfleet.cli.client_commands import TOKEN, URL, console

if TYPE_CHECKING:
    from sandfleet.rl.loop import Learner, LoopStats
    from sandfleet.tasks.catalogue import Task
    from sandfleet.wire import ProfileAnswer

GATEWAY_URL = Annotated[
    str | None,
    typer.Option("--url", envvar=["SANDFLEET_GATEWAY_URL", "SANDFLEET_URL"], help="Gateway URL."),
]
TOKEN_FILE = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="SANDFLEET_TOKEN_FILE",
        help="File holding the bearer token, re-read when it changes (a projected ServiceAccount token).",
    ),
]
RUN = Annotated[
    str, typer.Option("--run", envvar="SANDFLEET_RUN", help="Run name (labels, policy, profile).")
]
SEED = Annotated[int, typer.Option(envvar="SANDFLEET_SEED", help="Random seed.")]
EPISODES_PER_STEP = Annotated[
    int,
    typer.Option(
        min=1,
        max=4096,
        envvar="SANDFLEET_EPISODES_PER_STEP",
        help="Episodes an actor runs at once on one batch acquire (samples of one task); 1: a lease each.",
    ),
]
DURATION = Annotated[float, typer.Option(min=0, help="Seconds to run; 0 runs until SIGTERM or SIGINT.")]
TASKS = Annotated[
    Path | None,
    typer.Option(
        "--tasks",
        envvar="SANDFLEET_TASKS",
        help="The task catalogue to sample from (e.g. tasks/catalogue.yaml); default: tasks/ci.yaml.",
    ),
]

rl = typer.Typer(help="The reference RL loop: real tasks, async actors, a learner.", no_args_is_help=True)
app.add_typer(rl, name="rl")


def _tasks(catalogue: Path | None) -> tuple[Task, ...]:
    """The catalogue's tasks (the default one's without it); a bad catalogue is one line and exit 1."""
    from sandfleet.rl.catalogue_tasks import load_tasks
    from sandfleet.tasks.fetching import TaskBuildError

    try:
        return load_tasks(catalogue)
    except TaskBuildError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None


@rl.command("build-tasks")
def build_tasks(tasks: TASKS = None) -> None:
    """Fetch the tasks' packages from PyPI (cached), break them, build the task image (root)."""
    from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE, build_image, image_name
    from sandfleet.tasks.fetching import TaskBuildError

    try:
        typer.echo(json.dumps(build_image(_tasks(tasks), image_name(tasks or DEFAULT_CATALOGUE))))
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
    episodes_per_step: EPISODES_PER_STEP = 1,
    plots: Annotated[Path | None, typer.Option(help="Directory for reward.svg and profile.svg.")] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Write the summary as JSON here.")] = None,
    tasks: TASKS = None,
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Run actors and a learner over the real tasks; print lease latency, reward curve and profile."""
    import asyncio

    from rich.console import Console

    from sandfleet import plots as figures
    from sandfleet.cli.run_commands import check_plot, render_profile, write_profile_plot
    from sandfleet.client import AsyncFleet
    from sandfleet.rl.loop import LoopConfig, reward_curve, run_loop

    if plots is not None:
        check_plot(plots / "reward.svg")

    config = LoopConfig(
        run=run_name,
        pool=pool,
        actors=actors,
        duration_seconds=duration,
        batch_size=batch_size,
        staleness_bound=staleness_bound,
        think_seconds=think,
        tasks=_tasks(tasks),
        episodes_per_step=episodes_per_step,
    )

    def progress(stats: LoopStats) -> None:
        recent = stats.rewards[-20:]
        mean = sum(recent) / len(recent) if recent else 0.0
        version = stats.updates[-1].version if stats.updates else 0
        console.print(
            f"rl: {stats.episodes} episodes, policy v{version}, reward (last 20) {mean:.2f}, "
            f"refused {stats.refused}, dropped stale {stats.dropped_stale}, errors {len(stats.errors)}, "
            f"infra errors {stats.infra_errors} (masked), timed out {stats.timed_out}"
        )

    async def main() -> tuple[LoopStats, ProfileAnswer]:
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
        f"{len(stats.updates)} learner steps; refused {stats.refused}; dropped stale {stats.dropped_stale}; "
        f"infra errors {stats.infra_errors} (masked, not trained on); timed out {stats.timed_out}"
    )
    out.print("lease latency: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in lease.items()))
    out.print("reward curve (mean per slice): " + " ".join(f"{r:.2f}" for r in curve))
    out.print("P(correct edit): " + ", ".join(f"{t} {p:.2f}" for t, p in stats.probabilities_correct.items()))
    for failure in stats.errors[:5]:
        out.print(f"[yellow]episode error:[/yellow] {failure}")
    for failure in stats.infra_reasons[:5]:
        out.print(f"[yellow]infra error (masked):[/yellow] {failure}")
    out.print(render_profile(profile))
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
        figures.save(figures.reward_figure(f"reward, run {run_name}", stats.rewards), plots / "reward.svg")
        write_profile_plot(profile, plots / "profile.svg")
        out.print(f"plots: {plots / 'reward.svg'}, {plots / 'profile.svg'}")
    if summary_json is not None:
        summary_json.write_text(
            json.dumps(
                {
                    "episodes": stats.episodes,
                    "refused": stats.refused,
                    "dropped_stale": stats.dropped_stale,
                    "errors": stats.errors,
                    "infra_errors": stats.infra_errors,
                    "infra_error_reasons": stats.infra_reasons,
                    "timed_out": stats.timed_out,
                    "lease_seconds": lease,
                    "reward_curve": curve,
                    "probabilities_correct": stats.probabilities_correct,
                    "learner_steps": len(stats.updates),
                    "profile": profile,
                },
                indent=2,
            )
        )


@rl.command("learner")
def learner(
    run_name: RUN = "demo",
    host: Annotated[
        str, typer.Option(envvar="SANDFLEET_LEARNER_HOST", help="Address the endpoint listens on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=1, max=65535, envvar="SANDFLEET_LEARNER_PORT", help="Endpoint port.")
    ] = 8500,
    batch_size: Annotated[int, typer.Option(min=1, help="Trajectories per learner step.")] = 4,
    staleness_bound: Annotated[int, typer.Option(min=0, help="Versions an actor may lag.")] = 4,
    mode: Annotated[str, typer.Option(help="Stale acquires: refuse or flag.")] = "refuse",
    learning_rate: Annotated[float, typer.Option(min=0, help="Policy-gradient step size.")] = 1.0,
    clip: Annotated[float, typer.Option(min=0.01, help="Importance-weight truncation level.")] = 2.0,
    device: Annotated[
        str,
        typer.Option(
            envvar="SANDFLEET_DEVICE", help="numpy (default), auto (cuda if torch sees one), cpu, cuda."
        ),
    ] = "numpy",
    seed: SEED = 0,
    duration: DURATION = 0.0,
    tasks: TASKS = None,
    url: GATEWAY_URL = None,
    token: TOKEN = None,
    token_file: TOKEN_FILE = None,
) -> None:
    """Serve the learner: actors POST trajectories and GET weights; versions go to the gateway."""
    import asyncio

    from sandfleet.cli.run_commands import policy_mode
    from sandfleet.client import AsyncFleet
    from sandfleet.rl.loop import Learner, LoopConfig, LoopStats
    from sandfleet.rl.processes import stop_after, stop_on_signals
    from sandfleet.rl.service import serve_learner
    from sandfleet.rl.torch_policy import TorchUnavailable, make_policy, resolve_device

    chosen = policy_mode(mode) or "refuse"
    config = LoopConfig(run=run_name, batch_size=batch_size, staleness_bound=staleness_bound, mode=chosen,
                        learning_rate=learning_rate, clip=clip, seed=seed, tasks=_tasks(tasks))  # fmt: skip
    try:
        resolved = resolve_device(device)
        policy = make_policy({t.id: len(t.choices) for t in config.tasks}, resolved, seed)
    except (TorchUnavailable, ValueError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None

    def progress(learner: Learner) -> None:
        typer.echo(f"learner stats: {json.dumps(learner.summary(), sort_keys=True)}", err=True)

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        timer = asyncio.create_task(stop_after(stop, duration))
        async with AsyncFleet(url=url, token=token, token_file=token_file) as fleet:
            learner = Learner(fleet, config, LoopStats(), policy)
            console.print(f"learner: run {run_name!r}, {resolved}, on http://{host}:{port}")
            await serve_learner(learner, host, port, stop, progress)
        timer.cancel()

    _run_process(main, "learner")


@rl.command("actor")
def actor(
    learner_url: Annotated[
        str,
        typer.Option(
            envvar="SANDFLEET_LEARNER_URL", help="The learner's endpoint, e.g. http://learner:8500."
        ),
    ],
    run_name: RUN = "demo",
    pool: Annotated[
        str, typer.Option(envvar="SANDFLEET_POOL", help="Pool serving the task image.")
    ] = "default",
    name: Annotated[
        str | None, typer.Option(envvar="SANDFLEET_ACTOR_NAME", help="Actor name (default: the host name).")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Episodes in flight in this process.")] = 1,
    think: Annotated[float, typer.Option(min=0, help="Simulated generation seconds per episode.")] = 0.2,
    episodes_per_step: EPISODES_PER_STEP = 1,
    wait: Annotated[float, typer.Option(min=1, help="Seconds to wait in the gateway's queue.")] = 60.0,
    grace: Annotated[
        float, typer.Option(min=0, help="Seconds an episode in flight may take to finish on SIGTERM.")
    ] = 30.0,
    seed: SEED = 0,
    duration: DURATION = 0.0,
    tasks: TASKS = None,
    url: GATEWAY_URL = None,
    token: TOKEN = None,
    token_file: TOKEN_FILE = None,
) -> None:
    """Run episodes: lease a sandbox each, act with the learner's newest weights, send the trajectory."""
    import asyncio

    from sandfleet.client import AsyncFleet
    from sandfleet.rl.loop import LoopConfig
    from sandfleet.rl.processes import run_actors, stop_after, stop_on_signals
    from sandfleet.rl.transport import LearnerClient

    base = name or socket.gethostname()
    names = [base] if concurrency == 1 else [f"{base}-{i}" for i in range(concurrency)]
    config = LoopConfig(
        run=run_name,
        pool=pool,
        think_seconds=think,
        seed=seed,
        tasks=_tasks(tasks),
        episodes_per_step=episodes_per_step,
    )

    def progress(stats: LoopStats) -> None:
        recent = stats.rewards[-20:]
        summary = {
            "actor": base,
            "episodes": stats.episodes,
            "refused": stats.refused,
            "errors": len(stats.errors),
            "infra_errors": stats.infra_errors,
            "timed_out": stats.timed_out,
            "mean_reward_last_20": sum(recent) / len(recent) if recent else 0.0,
            "last_error": stats.errors[-1] if stats.errors else None,
            "last_infra_error": stats.infra_reasons[-1] if stats.infra_reasons else None,
        }
        typer.echo(f"actor stats: {json.dumps(summary, sort_keys=True)}", err=True)

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        timer = asyncio.create_task(stop_after(stop, duration))
        async with (
            AsyncFleet(url=url, token=token, token_file=token_file) as fleet,
            LearnerClient(learner_url) as link,
        ):
            console.print(f"actor {base}: run {run_name!r}, pool {pool!r}, learner {learner_url}")
            await run_actors(fleet, config, link, names, stop, grace, wait, progress)
        timer.cancel()

    _run_process(main, "actor")


def _run_process(main: Any, what: str) -> None:
    """Run a process's main; a failure is one line and exit code 1, a signal a clean exit 0."""
    import asyncio

    try:
        asyncio.run(main())
    except Exception as error:
        console.print(f"[red]{what} error:[/red] {type(error).__name__}: {error}")
        raise typer.Exit(1) from None
