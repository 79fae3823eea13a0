"""`sandfleet task export` and `task import`: the catalogue as SWE-bench instances, and back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandfleet.cli.task_commands import task

if TYPE_CHECKING:
    from sandfleet.tasks.catalogue import Catalogue, Task

DEFAULT_CATALOGUE = Path("tasks/catalogue.yaml")
FORMATS = ("swebench",)


def _format(value: str) -> str:
    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r}: the formats are {', '.join(FORMATS)}")
    return value


def _load(path: Path) -> Catalogue:
    from sandfleet.tasks.catalogue import CatalogueError, parse_catalogue

    try:
        return parse_catalogue(path.read_text(), str(path))
    except (OSError, CatalogueError) as error:
        typer.echo(f"task: {error}", err=True)
        raise typer.Exit(2) from None


def _dir_reader(catalogue_path: Path) -> Callable[[Task, str], str | None]:
    """Reads a `dir:` source's file (relative to the catalogue), so its gold patch has real context."""

    def read(task: Task, path: str) -> str | None:
        source = task.source_entry
        if source.dir is None:
            return None  # an sdist's tree is not here without fetching it
        try:
            return (catalogue_path.parent / source.dir / path).read_text()
        except OSError:
            return None

    return read


@task.command("export")
def export(
    out: Annotated[Path, typer.Option(help="File to write: FILE.jsonl (one a line) or FILE.json (a list).")],
    fmt: Annotated[str, typer.Option("--format", callback=_format, help="Only `swebench`.")] = "swebench",
    catalogue: Annotated[Path, typer.Option(help="The catalogue to export.")] = DEFAULT_CATALOGUE,
    image: Annotated[
        str | None, typer.Option(help="The tasks' image reference (default: tasks-<catalogue stem>).")
    ] = None,
) -> None:
    """Write the catalogue's tasks as SWE-bench instances, which swebench's loader reads."""
    from sandfleet.rl.catalogue_tasks import image_name
    from sandfleet.tasks.swebench_format import dump_instances, export_catalogue

    if out.suffix not in (".json", ".jsonl"):
        typer.echo(
            "task export: --out must end in .jsonl or .json, as swebench's loader reads them", err=True
        )
        raise typer.Exit(2)
    parsed = _load(catalogue)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    instances = export_catalogue(parsed, image or image_name(catalogue), created, _dir_reader(catalogue))
    out.write_text(dump_instances(instances, json_list=out.suffix == ".json"))
    typer.echo(f"wrote {len(instances)} SWE-bench instances to {out}")


@task.command("import")
def import_(
    instances: Annotated[Path, typer.Argument(help="SWE-bench instances: JSONL or a JSON list.")],
    out: Annotated[Path, typer.Option(help="The catalogue (YAML) to write the imported tasks to.")],
    fmt: Annotated[str, typer.Option("--format", callback=_format, help="Only `swebench`.")] = "swebench",
    known: Annotated[
        Path | None,
        typer.Option(help="A catalogue whose sources' tests FAIL_TO_PASS is checked against (same sdist)."),
    ] = None,
) -> None:
    """Read SWE-bench instances into a catalogue; bad ones are skipped, each with its reason."""
    from sandfleet.tasks.catalogue import dump_catalogue
    from sandfleet.tasks.swebench_format import SwebenchMissing, import_instances

    try:
        text = instances.read_text()
    except (OSError, UnicodeDecodeError) as error:
        typer.echo(f"task import: cannot read {instances}: {error}", err=True)
        raise typer.Exit(2) from None
    known_tests: dict[str, set[str]] = {}
    if known is not None:
        for source in _load(known).sources.values():
            if source.sdist is not None:
                known_tests[source.sdist] = set(source.tests_passing)
    try:
        result = import_instances(text, str(instances), known_tests)
    except SwebenchMissing as error:
        typer.echo(f"task import: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.summary())
    if result.catalogue is None:
        typer.echo("task import: no instance could be imported; nothing written", err=True)
        raise typer.Exit(1)
    out.write_text(dump_catalogue(result.catalogue))
    typer.echo(f"wrote {len(result.imported)} tasks to {out}")
