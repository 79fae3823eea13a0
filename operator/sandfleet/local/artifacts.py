"""Finds (and, on demand, builds) what the local runtime runs: runsc and the sandbox image."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import ImageNotFoundError, LocalRuntimeError

REPO = Path(__file__).resolve().parents[3]
GVISOR_SCRIPT = REPO / "hack" / "gvisor"
IMAGE_BUILD_SCRIPT = REPO / "sandbox_image" / "build"
# A cold gVisor build is a few minutes on 2 cores; a cold image build about a minute.
BUILD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class ImageRef:
    """An image in an OCI layout on this host.

    `tag` is what leases call it; `ref_name` is its name in the layout when that differs (an image
    pulled into the store is named by its pinned digest there, `pin-sha256-<hex>`).
    """

    layout: Path
    tag: str
    digest: str
    ref_name: str = ""

    @property
    def layout_ref(self) -> str:
        """`LAYOUT:NAME`, as umoci takes it."""
        return f"{self.layout}:{self.ref_name or self.tag}"


async def ensure_runsc() -> Path:
    """The runsc binary: $SANDFLEET_RUNSC if set, else the pinned build (built now if missing)."""
    explicit = os.environ.get("SANDFLEET_RUNSC")
    if explicit:
        path = Path(explicit)
        if not os.access(path, os.X_OK):
            raise LocalRuntimeError(f"SANDFLEET_RUNSC={explicit} is not an executable")
        return path
    bin_dir = Path((await run_command([str(GVISOR_SCRIPT), "bin-dir"])).stdout.strip())
    runsc = bin_dir / "runsc"
    if not os.access(runsc, os.X_OK):
        try:
            await run_command([str(GVISOR_SCRIPT), "build"], timeout_s=BUILD_TIMEOUT_S)
        except CommandError as error:
            raise LocalRuntimeError(f"building runsc failed (hack/gvisor build): {error}") from None
    return runsc


async def ensure_base_image() -> ImageRef:
    """The base sandbox image, built (or found in the cache) by sandbox_image/build."""
    try:
        result = await run_command([str(IMAGE_BUILD_SCRIPT), "--json"], timeout_s=BUILD_TIMEOUT_S)
    except CommandError as error:
        raise LocalRuntimeError(f"building the sandbox image failed (sandbox_image/build): {error}") from None
    return image_ref_from_json(result.stdout.strip().splitlines()[-1])


async def ensure_agent_bundle() -> Path:
    """The agent bundle injected into images sandfleet did not build (sandbox_image/build agent-bundle).

    Cached by the Debian packages' versions and the agent's source: a second call is about a second.
    """
    try:
        result = await run_command(
            [str(IMAGE_BUILD_SCRIPT), "--json", "agent-bundle"], timeout_s=BUILD_TIMEOUT_S
        )
        path = Path(str(json.loads(result.stdout.strip().splitlines()[-1])["path"]))
    except CommandError as error:
        raise LocalRuntimeError(
            f"building the agent bundle failed (sandbox_image/build agent-bundle): {error}"
        ) from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise LocalRuntimeError("unexpected output from sandbox_image/build agent-bundle") from None
    if not (path / "manifest.json").is_file():
        raise LocalRuntimeError(f"the agent bundle at {path} has no manifest.json")
    return path


def image_ref_from_json(line: str) -> ImageRef:
    """Read the JSON line sandbox_image/build --json prints."""
    try:
        data = json.loads(line)
        return ImageRef(layout=Path(data["layout"]), tag=str(data["tag"]), digest=str(data["digest"]))
    except (ValueError, KeyError, TypeError):
        raise LocalRuntimeError(f"unexpected output from sandbox_image/build: {line[:200]!r}") from None


REF_NAME = "org.opencontainers.image.ref.name"


def image_ref_from_layout(reference: str) -> ImageRef:
    """An image named `LAYOUT:TAG` (umoci's form), or `LAYOUT` when that layout holds one tag.

    The digest is the layout's own record of the tag (index.json), so a lease can report exactly
    what it runs.
    """
    path, _, tag = reference.rpartition(":") if ":" in reference else (reference, "", "")
    if path and not Path(path).is_dir():  # `:` inside the directory name, no tag after it
        path, tag = reference, ""
    layout = Path(path)
    tagged = layout_tags(layout)
    if not tag:
        if len(tagged) != 1:
            raise ImageNotFoundError(
                f"{layout} holds tags {sorted(tagged) or 'none'}: name one as LAYOUT:TAG"
            )
        (tag,) = tagged
    if tag not in tagged:
        raise ImageNotFoundError(
            f"{layout} has no tag {tag!r} (it has {', '.join(sorted(tagged)) or 'none'})"
        )
    return ImageRef(layout=layout, tag=tag, digest=tagged[tag])


def layout_tags(layout: Path) -> dict[str, str]:
    """Each name an OCI layout's index.json holds, with the manifest digest it names."""
    try:
        index = json.loads((layout / "index.json").read_text())
        manifests = [m for m in index["manifests"] if isinstance(m, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        raise ImageNotFoundError(f"{layout} is not an OCI image layout (no readable index.json)") from None
    tagged = {
        str((m.get("annotations") or {}).get(REF_NAME, "")): str(m.get("digest", "")) for m in manifests
    }
    tagged.pop("", None)
    return tagged


def tagged_digest(layout: Path, name: str) -> str | None:
    """The digest `name` names in the layout now, None when it names none."""
    try:
        return layout_tags(layout).get(name)
    except ImageNotFoundError:
        return None
