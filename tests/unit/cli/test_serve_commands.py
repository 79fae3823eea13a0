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
        (["--recycle-episodes", "4", "--commands-as-image-user"], "cannot be reset for another episode"),
    ],
)
def test_bad_recycling_flags_are_refused_with_what_to_pass(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--local", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert message in result.output


def test_an_image_that_cannot_be_had_is_one_line_saying_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typed image error (here a bad archive) is printed as it is, exit 1, no traceback."""
    from pathlib import Path

    from sandfleet.local import artifacts, pull
    from sandfleet.local.artifacts import ImageRef
    from sandfleet.local.errors import ImageArchiveError

    async def runsc() -> Path:
        return Path("/bin/true")

    async def base() -> ImageRef:
        return ImageRef(Path("/nonexistent"), "sandfleet", "sha256:" + "0" * 64)

    seen: list[tuple[str, object]] = []
    said = "the archive cannot be read (it looks truncated or corrupt)"

    async def refuse(reference: str, access: object = None, **_: object) -> ImageRef:
        seen.append((reference, access))
        raise ImageArchiveError(f"{reference}: {said}: EOF")

    monkeypatch.setattr(artifacts, "ensure_runsc", runsc)
    monkeypatch.setattr(artifacts, "ensure_base_image", base)
    monkeypatch.setattr(pull, "resolve_image", refuse)
    result = CliRunner().invoke(
        app,
        ["serve", "--local", "--image", "docker-archive:/tmp/[cut].tar", "--registry-cert-dir", "/etc/ca"],
        env={"COLUMNS": "60", "SANDFLEET_REGISTRY_AUTH_FILE": "/etc/auth.json"},
    )
    assert result.exit_code == 1, result.output
    # One line however narrow the terminal, the brackets kept (not read as markup).
    assert f"error: docker-archive:/tmp/[cut].tar: {said}" in result.output
    assert "Traceback" not in result.output
    (reference, access) = seen[0]
    assert reference == "docker-archive:/tmp/[cut].tar"
    assert access == pull.RegistryAccess(auth_file=Path("/etc/auth.json"), cert_dir=Path("/etc/ca"))
