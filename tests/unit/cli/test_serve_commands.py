"""`sandfleet serve --local`: recycling flags are checked before anything is built or started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sandfleet.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recycle-episodes", "1"], "at least 2"),
        (["--recycle-episodes", "-3"], "--recycle-episodes"),
        (["--recycle-episodes", "4", "--recycle-seconds", "0"], "--recycle-seconds"),
    ],
)
def test_bad_recycling_flags_are_refused_with_what_to_pass(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--local", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert message in result.output
