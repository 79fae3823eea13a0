"""`sandfleet task mine` (a package's tests and mutants become tasks) and `task check` (proof in gVisor)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandfleet.cli.client_commands import TOKEN, URL, console
from sandfleet.cli.task_commands import task
from sandfleet.wire import EvaluateRequest, Outcome

if TYPE_CHECKING:
    from sandfleet.client import AsyncFleet
    from sandfleet.tasks.catalogue import Task
    from sandfleet.tasks.checking import TaskCheck

DEFAULT_CATALOGUE = Path("tasks/catalogue.yaml")


@task.command("mine")
def mine(
    sdist: Annotated[str, typer.Option(help="The package to mine, pinned: NAME==VERSION (its sdist).")],
    catalogue: Annotated[
        Path, typer.Option(help="Catalogue to add the tasks to (created if missing; the source replaced).")
    ] = DEFAULT_CATALOGUE,
    max_mutants: Annotated[int, typer.Option(min=1, max=5000, help="Mutants to try.")] = 60,
    max_tasks: Annotated[int, typer.Option(min=1, help="Tasks to keep at most (the first caught).")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed for choosing mutants.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, max=32, help="Mutants tested at once.")] = 1,
    test_command: Annotated[
        str | None, typer.Option(help="The package's test command (default: pytest in the tree).")
    ] = None,
    python: Annotated[
        str, typer.Option(help="Interpreter the host runs tests with (the image's minor version).")
    ] = "/usr/bin/python3",
    summary_json: Annotated[Path | None, typer.Option(help="Write tried/kept/yield/seconds here.")] = None,
) -> None:
    """Mutate what the package's tests cover; keep mutants its tests catch, as verified tasks."""
    import re

    from sandfleet.rl.catalogue_tasks import cache_dir
    from sandfleet.tasks.catalogue import (
        SDIST_PATTERN,
        Catalogue,
        CatalogueError,
        Source,
        dump_catalogue,
        parse_catalogue,
    )
    from sandfleet.tasks.fetching import TaskBuildError
    from sandfleet.tasks.mining import (
        Miner,
        MiningError,
        fetch_sdist,
        runtime_wheels,
        test_deps,
        unpack,
        unpack_wheels,
    )

    if not re.match(SDIST_PATTERN, sdist):
        raise typer.BadParameter("--sdist takes NAME==VERSION, e.g. idna==3.7")
    if not Path(python).is_file():
        raise typer.BadParameter(f"--python {python} does not exist")
    name, version = sdist.split("==")
    source_id = f"{name}-{version}".lower()
    try:
        existing = parse_catalogue(catalogue.read_text(), str(catalogue)) if catalogue.exists() else None
    except CatalogueError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    root = cache_dir().parent / "task-factory"
    started = time.monotonic()
    try:
        archive = fetch_sdist(sdist, root / "downloads")
        tree = unpack(archive, root / "trees" / source_id)
        deps = test_deps(root / "downloads", root, with_coverage=True)
        requires = unpack_wheels(runtime_wheels(sdist, root / "downloads"), root / f"requires-{source_id}")
        source = Source(sdist=sdist, **({"test_command": test_command} if test_command else {}))
        if tree.name != source.directory:
            raise MiningError(f"{archive.name} unpacks to {tree.name}, not {source.directory}")
        miner = Miner(
            tree, deps, source_id, source, python,
            lambda line: typer.echo(f"mine {sdist}: {line}", err=True), requires,
        )  # fmt: skip
        report = miner.mine(max_mutants, seed, jobs)
    except (MiningError, TaskBuildError, OSError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    kept = report.kept[:max_tasks]
    sources = dict(existing.sources) if existing else {}
    sources[source_id] = report.source
    tasks = [t for t in (existing.tasks if existing else []) if t.source != source_id] + kept
    catalogue.parent.mkdir(parents=True, exist_ok=True)
    catalogue.write_text(dump_catalogue(Catalogue(sources=sources, tasks=tasks)))
    result = {
        "sdist": sdist,
        "tried": report.tried,
        "kept": len(report.kept),
        "written": len(kept),
        "yield": round(report.yield_, 3),
        "reasons": report.reasons,
        "baseline_seconds": round(report.baseline_seconds, 2),
        "seconds": round(time.monotonic() - started, 1),
    }
    typer.echo(
        f"{sdist}: kept {len(report.kept)} of {report.tried} mutants (yield {report.yield_:.0%}) "
        f"in {result['seconds']} s; wrote {len(kept)} tasks to {catalogue}"
    )
    if summary_json is not None:
        summary_json.write_text(json.dumps(result, indent=2) + "\n")


@task.command("check")
def check(
    catalogue: Annotated[Path, typer.Argument(help="The catalogue whose tasks to prove.")],
    ids: Annotated[list[str] | None, typer.Option("--ids", help="Only these task ids (repeatable).")] = None,
    pool: Annotated[str, typer.Option(help="Pool serving the catalogue's image.")] = "default",
    wait: Annotated[float, typer.Option(min=1, help="Seconds to wait for a sandbox.")] = 120.0,
    image: Annotated[
        str | None, typer.Option(help="The catalogue's image TAG, when the pool serves several.")
    ] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Write each task's verdict here.")] = None,
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Prove each task in gVisor: its tests fail with the bug, pass with the fix, and on the clean tree.

    The pool serves the catalogue's image (`sandfleet rl build-tasks --tasks CATALOGUE`, then
    `sandfleet serve --local --image LAYOUT:TAG`), in which each task's tree holds its bug.
    """
    import asyncio

    from sandfleet.client import AsyncFleet
    from sandfleet.tasks.catalogue import CatalogueError, parse_catalogue
    from sandfleet.tasks.checking import summary

    try:
        parsed = parse_catalogue(catalogue.read_text(), str(catalogue))
        chosen = parsed.select(ids)
    except (OSError, CatalogueError, KeyError) as error:
        console.print(f"[red]error:[/red] {str(error).strip(chr(39))}")
        raise typer.Exit(1) from None

    async def main() -> list[TaskCheck]:
        results = []
        async with AsyncFleet(url=url, token=token) as fleet:
            for index, entry in enumerate(chosen, start=1):
                result = await _check_one(fleet, entry, pool, wait, image)
                results.append(result)
                verdict = (
                    "verified" if result.verified else "[red]FAILED[/red]: " + "; ".join(result.problems)
                )
                console.print(
                    f"check {index}/{len(chosen)} {entry.id}: {verdict} "
                    f"({result.bug_failing} fail with the bug, {result.fixed_passing} pass fixed, "
                    f"{result.seconds:.1f} s)",
                    soft_wrap=True,
                )
        return results

    try:
        checks = asyncio.run(main())
    except Exception as error:  # the fleet's failure in one line, not a stack trace
        console.print(f"[red]error:[/red] {type(error).__name__}: {error}")
        raise typer.Exit(1) from None
    typer.echo(summary(checks))
    if summary_json is not None:
        summary_json.write_text(
            json.dumps(
                [{"task": c.task, "verified": c.verified, "problems": list(c.problems),
                  "bug_failing": c.bug_failing, "fixed_passing": c.fixed_passing,
                  "seconds": round(c.seconds, 2)} for c in checks],
                indent=2,
            ) + "\n"
        )  # fmt: skip
    if not all(c.verified for c in checks):
        raise typer.Exit(1)


async def _check_one(
    fleet: AsyncFleet, entry: Task, pool: str, wait: float, image: str | None = None
) -> TaskCheck:
    """Bug, then fix, then the clean tree, in one sandbox, each scored as an episode is scored."""
    from sandfleet.tasks.checking import (
        TaskCheck,
        bug_problems,
        outcomes,
        passing_problems,
    )

    scoring = entry.scoring()
    started = time.monotonic()
    problems: list[str] = []
    async with fleet.lease(
        pool, wait_seconds=wait, image=image, labels={"run": "task-check", "task": entry.id}
    ) as sandbox:

        async def evaluate(patch: str | None = None) -> tuple[float, dict[str, str]]:
            body: EvaluateRequest = {"task": scoring}
            if patch:
                body["patch"] = patch
            result = await sandbox.evaluate(**body)
            if result.outcome in (Outcome.INFRA_ERROR, Outcome.TIMED_OUT):
                problems.append(f"an evaluation was {result.outcome}: {result.reason or 'no reason given'}")
            return result.reward, outcomes(result.tests)

        reward, tests = await evaluate()
        problems += bug_problems(entry, reward, tests)
        bug_failing = sum(1 for t in entry.fail_to_pass if tests.get(t) != "passed")
        expected = entry.deciding()  # what must pass once fixed
        fix = entry.fix_edit()
        fixed_passing = 0
        if fix is not None:
            path = f"{entry.tree}/{fix.file}"
            broken = (await sandbox.read_file(path)).decode()
            try:
                await sandbox.write_file(path, fix.apply(broken))
            except ValueError as error:
                problems.append(f"the fix does not apply: {error}")
            else:
                reward, tests = await evaluate()
                problems += passing_problems("with the fix", reward, tests, expected)
                fixed_passing = sum(1 for t in expected if tests.get(t) == "passed")
            if entry.fix is not None and entry.bug.edit is not None:
                # An explicit fix may differ from the original: check the clean tree too.
                await sandbox.write_file(path, entry.bug.edit.reverse().apply(broken))
                reward, tests = await evaluate()
                problems += passing_problems("on the clean tree", reward, tests, expected)
        elif entry.fix is not None and entry.fix.patch is not None:
            reward, tests = await evaluate(entry.fix.patch)
            problems += passing_problems("with the fix", reward, tests, expected)
            fixed_passing = sum(1 for t in expected if tests.get(t) == "passed")
    return TaskCheck(entry.id, tuple(problems), bug_failing, fixed_passing, time.monotonic() - started)
