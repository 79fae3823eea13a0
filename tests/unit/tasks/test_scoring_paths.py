"""Every path that scores a catalogue task sends the agent the same `task` object: its `Task.scoring()`."""

from __future__ import annotations

from sandfleet.cli.client_commands import _task_scoring
from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE, from_catalogue
from sandfleet.tasks.catalogue import parse_catalogue


def test_the_loop_the_cli_and_the_catalogue_make_one_scoring_object() -> None:
    catalogue = parse_catalogue(DEFAULT_CATALOGUE.read_text(), str(DEFAULT_CATALOGUE))
    loop_tasks = {task.id: task for task in from_catalogue(DEFAULT_CATALOGUE)}
    for entry in catalogue.tasks:
        expected = entry.scoring()
        assert loop_tasks[entry.id].scoring() == expected  # the reference loop (and the adapters' examples)
        assert _task_scoring(entry.id, DEFAULT_CATALOGUE) == expected  # sandfleet evaluate --task
        assert loop_tasks[entry.id].bug_path.startswith(
            f"{expected['tree']}/"
        )  # the loop edits what is scored
        # The deciding tests are FAIL_TO_PASS then PASS_TO_PASS, and nothing runs from the episode's
        # own copy of pytest or the dependencies.
        assert expected["deciding"] == [*entry.fail_to_pass, *entry.pass_to_pass()]
        assert all(str(p).startswith(("/opt/sandfleet/pristine/", ".")) for p in expected["pythonpath"])  # type: ignore[attr-defined]
