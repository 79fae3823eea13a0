"""`task export --format swebench` and `task import --format swebench`: files, summaries, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sandfleet.cli import app
from sandfleet.tasks.catalogue import parse_catalogue

REPO = Path(__file__).resolve().parents[3]
CI = REPO / "tasks" / "ci.yaml"


def test_export_then_import_gives_the_catalogues_tests_back(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "ci.jsonl"
    exported = runner.invoke(
        app, ["task", "export", "--format", "swebench", "--catalogue", str(CI), "--out", str(out)]
    )
    assert exported.exit_code == 0, exported.output
    instances = [json.loads(line) for line in out.read_text().splitlines()]
    catalogue = parse_catalogue(CI.read_text(), str(CI))
    assert [i["instance_id"] for i in instances] == [t.id for t in catalogue.tasks]
    assert {i["image"] for i in instances} == {"tasks-ci"}
    assert f"wrote {len(instances)} SWE-bench instances" in exported.output

    back = tmp_path / "back.yaml"
    imported = runner.invoke(
        app, ["task", "import", "--format", "swebench", str(out), "--out", str(back), "--known", str(CI)]
    )
    assert imported.exit_code == 0, imported.output
    assert imported.output.startswith(f"imported {len(instances)}, skipped 0\n")
    again = parse_catalogue(back.read_text(), str(back))
    assert [(t.id, t.deciding()) for t in again.tasks] == [(t.id, t.deciding()) for t in catalogue.tasks]


def test_a_json_list_is_written_for_a_json_file_and_other_names_are_refused(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "ci.json"
    assert runner.invoke(app, ["task", "export", "--catalogue", str(CI), "--out", str(out)]).exit_code == 0
    assert isinstance(json.loads(out.read_text()), list)
    refused = runner.invoke(app, ["task", "export", "--catalogue", str(CI), "--out", str(tmp_path / "x.txt")])
    assert refused.exit_code == 2
    assert "must end in .jsonl or .json" in refused.output
    other = runner.invoke(app, ["task", "export", "--format", "harbor", "--out", str(out)])
    assert other.exit_code == 2


def test_a_file_with_nothing_importable_says_why_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\nnot json\n')
    out = tmp_path / "out.yaml"
    result = CliRunner().invoke(app, ["task", "import", str(bad), "--out", str(out)])
    assert result.exit_code == 1
    assert "imported 0, skipped 2 (1 bad_field, 1 malformed_json)" in result.output
    assert "bad.jsonl:2: not valid JSON" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    missing = CliRunner().invoke(app, ["task", "import", str(tmp_path / "none.jsonl"), "--out", str(out)])
    assert missing.exit_code == 2
    assert "cannot read" in missing.output
