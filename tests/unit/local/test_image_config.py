"""Reading an OCI image's config (entrypoint, env, user, workdir) from a layout on disk."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from sandfleet.local.artifacts import ImageRef, image_ref_from_json
from sandfleet.local.errors import ImageSourceError, LocalRuntimeError
from sandfleet.local.image import ensure_rootfs, read_image_config


def _blob(layout: Path, document: dict[str, object]) -> str:
    data = json.dumps(document).encode()
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


def _image(tmp_path: Path, config: dict[str, object]) -> ImageRef:
    config_digest = _blob(tmp_path, {"config": config})
    manifest = _blob(tmp_path, {"config": {"digest": config_digest}, "layers": []})
    return ImageRef(layout=tmp_path, tag="t", digest=manifest)


def test_reads_entrypoint_env_user_and_workdir(tmp_path: Path) -> None:
    image = _image(
        tmp_path,
        {
            "Entrypoint": ["/usr/bin/python3", "-m", "sandfleet_agent"],
            "Cmd": ["--port", "8000"],
            "Env": ["PYTHONPATH=/opt/sandfleet/agent"],
            "User": "1000:1000",
            "WorkingDir": "/workspace",
        },
    )
    config = read_image_config(image)
    assert config.argv == ["/usr/bin/python3", "-m", "sandfleet_agent", "--port", "8000"]
    assert (config.uid, config.gid, config.workdir) == (1000, 1000, "/workspace")
    assert config.env == ["PYTHONPATH=/opt/sandfleet/agent"]


OWN_AGENT = {"org.opencontainers.image.title": "sandfleet-sandbox"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"User": "1000", "Labels": OWN_AGENT}, "no entrypoint"),
        ({"Entrypoint": ["x"], "User": "sandbox", "Labels": OWN_AGENT}, "numeric"),
    ],
)
def test_unusable_configs_of_images_with_their_own_agent_are_refused(
    tmp_path: Path, config: dict[str, object], message: str
) -> None:
    with pytest.raises(LocalRuntimeError, match=message):
        read_image_config(_image(tmp_path, config))


def test_any_other_image_needs_no_entrypoint_and_may_name_its_user(tmp_path: Path) -> None:
    # The injected agent is its process, so neither is used (the image's User is not, yet).
    config = read_image_config(_image(tmp_path, {"User": "nobody", "Labels": {"x": "y"}}))
    assert (config.argv, config.uid, config.own_agent, config.workdir) == ([], 0, False, "/")
    assert config.labels == {"x": "y"}


def test_missing_layout_and_bad_build_output(tmp_path: Path) -> None:
    with pytest.raises(LocalRuntimeError, match="cannot read the config"):
        read_image_config(ImageRef(layout=tmp_path, tag="t", digest="sha256:00"))
    with pytest.raises(LocalRuntimeError, match="unexpected output"):
        image_ref_from_json("image: something went wrong")


def test_a_tag_moved_in_its_layout_since_serve_started_is_not_unpacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digest read at start is what is served: the layout's tag naming other content is refused."""
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    layout = tmp_path / "layout"
    pinned = _image(layout, {"Env": ["A=1"]})
    moved = _image(layout, {"Env": ["A=2"]})
    annotations = {"org.opencontainers.image.ref.name": "t"}
    (layout / "index.json").write_text(
        json.dumps({"manifests": [{"digest": moved.digest, "annotations": annotations}]})
    )
    with pytest.raises(ImageSourceError, match="restart serve"):
        asyncio.run(ensure_rootfs(pinned))
    assert not [p for p in (tmp_path / "cache" / "rootfs").iterdir() if p.is_dir()]  # nothing unpacked
    # A pulled image is unpacked by its pin, which never moves (`LAYOUT:pin-sha256-<hex>`).
    assert ImageRef(layout, "registry/x:v1", pinned.digest, "pin-x").layout_ref == f"{layout}:pin-x"
