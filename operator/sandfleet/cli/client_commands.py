"""Client commands: lease, exec, files, evaluate, release, pools, leases (gateway from --url or env)."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from sandfleet.cli.app import app
from sandfleet.wire import EvaluateRequest, ExecAnswer, Outcome, PlaceJson, PoolJson

URL = Annotated[str | None, typer.Option("--url", envvar="SANDFLEET_URL", help="Gateway URL.")]
TOKEN = Annotated[str | None, typer.Option("--token", envvar="SANDFLEET_TOKEN", help="Bearer token.")]
AS_JSON = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]

console = Console(stderr=True)
files = typer.Typer(help="Copy files into and out of a leased sandbox.", no_args_is_help=True)
app.add_typer(files, name="files")


def _fleet(url: str | None, token: str | None) -> Any:
    from sandfleet.client import Fleet

    return Fleet(url=url, token=token)


def _fail(error: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {error}")
    return typer.Exit(1)


def _run(action: Any) -> Any:
    """Run a client action; gateway errors become one readable line and exit code 1."""
    import httpx

    from sandfleet.client import SandfleetError

    try:
        return action()
    except SandfleetError as error:
        raise _fail(error) from None
    except httpx.TransportError as error:
        raise _fail(RuntimeError(f"cannot reach the gateway ({error}); is it running? set --url")) from None


@app.command()
def lease(
    pool: Annotated[str, typer.Argument(help="Pool to lease from.")],
    count: Annotated[int, typer.Option(help="Sandboxes at once (all or nothing, unless --min).")] = 1,
    min_count: Annotated[
        int | None,
        typer.Option(
            "--min",
            min=1,
            help="A batch: up to --count, at least this many, after at most --wait seconds.",
        ),
    ] = None,
    ttl: Annotated[int | None, typer.Option(help="Lease TTL in seconds.")] = None,
    run: Annotated[str | None, typer.Option(help="Run label (for bulk release).")] = None,
    region: Annotated[list[str], typer.Option(help="Preferred region (repeatable).")] = [],  # noqa: B006
    wait: Annotated[float, typer.Option(help="Seconds to wait in the queue.")] = 30.0,
    image: Annotated[
        str | None, typer.Option(help="A task image the pool serves (a TAG of `serve --local --image`).")
    ] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Lease sandboxes and print their lease ids, one a line (`--count 512 --min 256`: a batch)."""
    labels = {"run": run} if run else {}
    with _fleet(url, token) as fleet, console.status(f"waiting for a sandbox from {pool}..."):
        leases = _run(
            lambda: fleet.acquire(
                pool,
                count=count,
                ttl_seconds=ttl,
                labels=labels,
                regions=region,
                wait_seconds=wait,
                image=image,
                min_count=min_count,
            )
        )
    if as_json:
        typer.echo(json.dumps([lease.__dict__ for lease in leases]))
        return
    for item in leases:
        typer.echo(item.id)
    asked = f" of {count} asked for" if len(leases) < count else ""
    console.print(f"leased {len(leases)}{asked} in {leases[0].timings.get('total_ms', 0):.1f} ms")


def _sandbox(fleet: Any, lease_id: str) -> Any:
    from sandfleet.client import Lease, Sandbox

    return Sandbox(fleet, Lease(lease_id, "", "", "", 0.0, {}, None))


def exec_notes(raw: Mapping[str, Any], max_output_bytes: int | None) -> list[str]:
    """What a reader of the output must know and cannot see in it: a cut output, a timeout."""
    answer = cast(ExecAnswer, raw)
    streams = (
        ("stdout", answer.get("stdout_truncated"), answer.get("stdout_bytes", "?")),
        ("stderr", answer.get("stderr_truncated"), answer.get("stderr_bytes", "?")),
    )
    notes = []
    for stream, truncated, produced in streams:
        if truncated:
            cap = f" at {max_output_bytes} bytes" if max_output_bytes is not None else ""
            notes.append(
                f"sandfleet: {stream} truncated{cap} ({produced} bytes produced); raise --max-output-bytes"
            )
    if answer.get("timed_out"):
        notes.append(f"sandfleet: timed out after {answer.get('duration_s', '?')}s; the command was killed")
    return notes


@app.command("exec")
def exec_(
    lease_id: Annotated[str, typer.Argument(help="Lease id.")],
    command: Annotated[list[str], typer.Argument(help="Command and arguments (after --).")],
    shell: Annotated[bool, typer.Option(help="Run the words as one shell command.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Kill after this many seconds.")] = None,
    max_output_bytes: Annotated[
        int | None, typer.Option(help="Keep at most this many bytes of each stream (agent default 1 MiB).")
    ] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Run a command in a leased sandbox; exits with its exit code (124 when it timed out)."""
    with _fleet(url, token) as fleet:
        sandbox = _sandbox(fleet, lease_id)
        words: list[str] | str = " ".join(command) if shell else command
        # base64 keeps the command's bytes exact: they are written out as they were produced.
        result = _run(
            lambda: sandbox.exec(
                words, timeout_s=timeout, max_output_bytes=max_output_bytes, encoding="base64"
            )
        )
    if as_json:
        typer.echo(json.dumps(result.raw))
    else:
        sys.stdout.buffer.write(result.data("stdout"))
        sys.stdout.flush()
        sys.stderr.buffer.write(result.data("stderr"))
        sys.stderr.flush()
        # Plain lines, never wrapped or styled: scripts grep them.
        sys.stderr.write("".join(f"{note}\n" for note in exec_notes(result.raw, max_output_bytes)))
    # 124, as coreutils' timeout says it: the agent reports the kill's own status (137) then.
    timed_out = result.timed_out or result.exit_code is None
    raise typer.Exit(124 if timed_out else result.exit_code)


@files.command("put")
def files_put(
    lease_id: Annotated[str, typer.Argument(help="Lease id.")],
    local: Annotated[Path, typer.Argument(help="A local file, or a directory (sent as a tar).")],
    remote: Annotated[str, typer.Argument(help="Where in the sandbox (a file, or a directory for a tree).")],
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Copy a local file or directory tree into a leased sandbox."""
    if not local.exists():
        raise _fail(RuntimeError(f"{str(local)!r} does not exist"))
    with _fleet(url, token) as fleet:
        sandbox = _sandbox(fleet, lease_id)
        if local.is_dir():
            report = _run(lambda: sandbox.upload_archive(remote, tar_of(local)))
            console.print(f"unpacked {report.get('files', 0)} files into {report.get('path', remote)}")
        else:
            _run(lambda: sandbox.write_file(remote, local.read_bytes()))
            console.print(f"wrote {local.stat().st_size} bytes to {remote}")


def tar_of(directory: Path) -> bytes:
    """A gzipped tar of `directory`'s contents, as `tar -C directory -czf - .` makes it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return buffer.getvalue()


@files.command("get")
def files_get(
    lease_id: Annotated[str, typer.Argument(help="Lease id.")],
    remote: Annotated[str, typer.Argument(help="A file in the sandbox, or a directory with --tree.")],
    local: Annotated[Path | None, typer.Argument(help="Where to write it ('-' or none: stdout).")] = None,
    tree: Annotated[bool, typer.Option(help="Fetch a directory as a gzipped tar.")] = False,
    url: URL = None,
    token: TOKEN = None,
) -> None:
    """Copy a file (or, with --tree, a directory as .tar.gz) out of a leased sandbox."""
    with _fleet(url, token) as fleet:
        sandbox = _sandbox(fleet, lease_id)
        data = _run(lambda: sandbox.download_archive(remote) if tree else sandbox.read_file(remote))
    if local is None or str(local) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        local.write_bytes(data)
    except OSError as error:
        raise _fail(RuntimeError(f"cannot write {str(local)!r}: {error.strerror}")) from None
    console.print(f"wrote {len(data)} bytes to {local}")


@app.command()
def evaluate(
    lease_id: Annotated[str, typer.Argument(help="Lease id.")],
    command: Annotated[
        list[str] | None, typer.Argument(help="Test command (after --); default: tests/test.sh.")
    ] = None,
    patch: Annotated[Path | None, typer.Option(help="A unified diff to apply first ('-': stdin).")] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory in the sandbox.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Kill the tests after this many seconds.")] = None,
    require_report: Annotated[
        bool, typer.Option(help="No JUnit report from the tests is an infra_error, not a zero.")
    ] = False,
    task: Annotated[
        str | None,
        typer.Option(help="Score this catalogue task by its deciding tests (no command: the task has one)."),
    ] = None,
    catalogue: Annotated[
        Path | None,
        typer.Option(help="The catalogue --task is in (default: $SANDFLEET_TASKS or tasks/ci.yaml)."),
    ] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Apply a patch, run the tests, print the outcome, reward and per-test counts.

    With --task, the task's deciding tests decide, run from the image's own copy of the task with
    the sandbox's source edits carried over (docs/tasks.md, How rewards are computed).
    Exit status: 0 passed, 1 failed, 124 timed out, 3 infra_error (mask that episode).
    """
    body: EvaluateRequest = {}
    if task is not None:
        if command or cwd or timeout is not None or require_report:
            raise typer.BadParameter(
                "--task runs the task's own tests: give no command, --cwd, --timeout or --require-report"
            )
        body["task"] = _task_scoring(task, catalogue)
    if command:
        body["shell"] = " ".join(command)
    if patch is not None:
        body["patch"] = sys.stdin.read() if str(patch) == "-" else _read_text(patch)
    if cwd:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeout_s"] = timeout
    if require_report:
        body["require_report"] = True
    with _fleet(url, token) as fleet:
        result = _run(lambda: _sandbox(fleet, lease_id).score(**body))
    if as_json:
        typer.echo(json.dumps(dict(result)))
    else:
        counts = ", ".join(f"{n} {k}" for k, n in result.counts.items() if n)
        typer.echo(f"{result.outcome}\treward={result.reward:g}\t{counts or 'no per-test report'}")
        if result.reason:
            sys.stderr.write(f"sandfleet: {result.reason}\n")
    raise typer.Exit(EVALUATE_EXIT[result.outcome])


EVALUATE_EXIT = {Outcome.PASSED: 0, Outcome.FAILED: 1, Outcome.TIMED_OUT: 124, Outcome.INFRA_ERROR: 3}


def _task_scoring(task_id: str, catalogue: Path | None) -> dict[str, object]:
    """The evaluate request's `task` object for a catalogue task (its deciding tests and tree)."""
    from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE
    from sandfleet.tasks.catalogue import CatalogueError, parse_catalogue

    path = catalogue or Path(os.environ.get("SANDFLEET_TASKS") or DEFAULT_CATALOGUE)
    try:
        parsed = parse_catalogue(path.read_text(), str(path))
        (entry,) = parsed.select([task_id])
        return entry.scoring()
    except (OSError, CatalogueError, KeyError, ValueError) as error:
        raise _fail(RuntimeError(f"cannot score task {task_id!r} from {str(path)!r}: {error}")) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise _fail(RuntimeError(f"cannot read the patch {str(path)!r}: {error}")) from None


@app.command()
def release(
    lease_ids: Annotated[list[str], typer.Argument(help="Lease ids.")] = [],  # noqa: B006
    run: Annotated[str | None, typer.Option(help="Release every lease of this run.")] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Release leases (idempotent), or every lease of a run."""
    if not lease_ids and not run:
        raise typer.BadParameter("give lease ids or --run")
    with _fleet(url, token) as fleet:
        released = {lease_id: _run(lambda i=lease_id: fleet.release(i)) for lease_id in lease_ids}
        if run:
            released.update(dict.fromkeys(_run(lambda: fleet.release_run(run)), True))
    if as_json:
        typer.echo(json.dumps(released))
    else:
        for lease_id, done in released.items():
            typer.echo(f"{lease_id}\t{'released' if done else 'already ended'}")


@app.command()
def pools(url: URL = None, token: TOKEN = None, as_json: AS_JSON = False) -> None:
    """List pools: warm, leased and waiting counts, and where (cluster/region warm/leased)."""
    with _fleet(url, token) as fleet:
        found: list[PoolJson] = _run(fleet.pools)
    if as_json:
        typer.echo(json.dumps(found))
        return
    table = Table("POOL", "WARM", "LEASED", "WAITING", "REGIONS", "WHERE (WARM/LEASED)", "IMAGE")
    for pool in found:
        table.add_row(
            pool["name"], str(pool["warm"]), str(pool["leased"]), str(pool["waiting"]),
            ",".join(pool["regions"]), "\n".join(map(_place, pool.get("places") or ())), pool["image"],
        )  # fmt: skip
    Console().print(table)


def _place(place: PlaceJson) -> str:
    where = "/".join(part for part in (place["cluster"], place["region"]) if part) or "-"
    return f"{where} {place['warm']}/{place['leased']}"


@app.command()
def leases(
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    run: Annotated[str | None, typer.Option(help="Only this run.")] = None,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """List your live leases."""
    with _fleet(url, token) as fleet:
        found = _run(lambda: fleet.leases(pool=pool, run=run))
    if as_json:
        typer.echo(json.dumps([item.__dict__ for item in found]))
        return
    table = Table("LEASE", "POOL", "REGION", "RUN", "EXPIRES IN")
    import time

    for item in found:
        table.add_row(
            item.id, item.pool, item.region, item.labels.get("run", ""),
            f"{item.expires_at - time.time():.0f}s",
        )  # fmt: skip
    Console().print(table)


@app.command()
def bench(
    pool: Annotated[str, typer.Argument(help="Pool to lease from.")],
    episodes: Annotated[int, typer.Option(help="Lease -> exec -> release cycles.")] = 50,
    concurrency: Annotated[int, typer.Option(help="Cycles in flight at once.")] = 4,
    url: URL = None,
    token: TOKEN = None,
    as_json: AS_JSON = False,
) -> None:
    """Measure your gateway from here: lease, first exec and release latencies (p50/p99)."""
    import asyncio
    import statistics
    import time

    from rich.progress import Progress

    from sandfleet.client import AsyncFleet, AsyncSandbox

    timings: dict[str, list[float]] = {"lease_ms": [], "first_exec_ms": [], "release_ms": []}

    async def run(progress: Progress) -> None:
        task = progress.add_task("episodes", total=episodes)
        remaining = [episodes]
        async with AsyncFleet(url=url, token=token) as fleet:

            async def worker() -> None:
                while remaining[0] > 0:
                    remaining[0] -= 1
                    t0 = time.perf_counter()
                    (lease,) = await fleet.acquire(pool)
                    t1 = time.perf_counter()
                    await AsyncSandbox(fleet, lease).exec(["true"])
                    t2 = time.perf_counter()
                    await fleet.release(lease.id)
                    t3 = time.perf_counter()
                    timings["lease_ms"].append((t1 - t0) * 1000)
                    timings["first_exec_ms"].append((t2 - t1) * 1000)
                    timings["release_ms"].append((t3 - t2) * 1000)
                    progress.advance(task)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    with Progress(console=console, transient=True) as progress:
        _run(lambda: asyncio.run(run(progress)))
    summary = {
        name: {
            "p50": round(statistics.median(values), 2),
            "p99": round(sorted(values)[max(0, round(0.99 * len(values)) - 1)], 2),
        }
        for name, values in timings.items()
    }
    if as_json:
        typer.echo(json.dumps({"episodes": episodes, **summary}))
        return
    table = Table("WHAT", "P50 MS", "P99 MS")
    for name, stats in summary.items():
        table.add_row(name, str(stats["p50"]), str(stats["p99"]))
    Console().print(table)
