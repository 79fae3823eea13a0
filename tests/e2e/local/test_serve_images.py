"""`serve --local` with two images: leased and prefetched by image, groups booted on demand, metrics."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sandfleet.client import Fleet
from sandfleet.core.pods import STARTUP_BUCKETS, STARTUP_METRIC, STARTUP_PHASES
from sandfleet.gateway.local import MAX_SANDBOXES
from sandfleet.local.artifacts import IMAGE_BUILD_SCRIPT, ImageRef
from sandfleet.local.image import rootfs_cache
from tests.e2e.local.conftest import build_task_image
from tests.support.kube import wait_until
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

AUTH = {"Authorization": "Bearer local-token"}
MARKER = "the second image's own workspace\n"


@dataclass(frozen=True)
class TwoImages:
    url: str
    base: ImageRef
    second: ImageRef


@pytest.fixture(scope="module")
def second_image(base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> ImageRef:
    """A tiny task image on top of the base (cached after its first build)."""
    workspace = tmp_path_factory.mktemp("second")
    (workspace / "marker.txt").write_text(MARKER)
    return build_task_image("t3-second", workspace)


@pytest.fixture(scope="module")
def served(
    base_image: ImageRef, second_image: ImageRef, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoImages]:
    """One real `serve --local` for both images, one warm of each; no sandbox left behind after."""
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("serve"),
        warm=1,
        extra_args=["--image", "base", "--image", f"{second_image.layout}:{second_image.tag}"],
        timeout=300,
    )
    try:
        yield TwoImages(url, base_image, second_image)
    finally:
        stop_local_serve(process, log)  # and none of its sandboxes left


def lease(served: TwoImages, **body: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{served.url}/v1/leases", json=body, headers=AUTH, timeout=120)
    return response, time.monotonic() - started


def release(served: TwoImages, lease_id: str) -> None:
    assert httpx.delete(f"{served.url}/v1/leases/{lease_id}", headers=AUTH).status_code in (200, 204)


def shell(served: TwoImages, lease_id: str, command: str) -> str:
    response = httpx.post(
        f"{served.url}/v1/leases/{lease_id}/exec", json={"shell": command}, headers=AUTH, timeout=60
    )
    assert response.status_code == 200, response.text
    return str(response.json()["stdout"])


def warm(served: TwoImages) -> int:
    pools = httpx.get(f"{served.url}/v1/pools", headers=AUTH).json()["pools"]
    return int(pools[0]["warm"])


def test_each_image_is_leased_by_its_tag_and_reports_its_digest(served: TwoImages) -> None:
    hashes = set()
    for image, has_marker in ((served.base, False), (served.second, True)):
        granted, _ = lease(served, image=image.tag, wait_seconds=60)
        assert granted.status_code == 201, granted.text
        (view,) = granted.json()["leases"]
        assert view["pool"] == "python"
        assert view["image_digest"] == image.digest  # exactly what the episode runs on
        assert view["template_hash"]
        hashes.add(view["template_hash"])
        found = shell(served, view["id"], "cat /workspace/marker.txt 2>/dev/null || echo none")
        assert found == (MARKER if has_marker else "none\n")
        release(served, view["id"])
    assert len(hashes) == 2
    with Fleet(served.url, token="local-token") as fleet:  # the client hands them to the trainer
        (own,) = fleet.acquire("python", wait_seconds=60)
        assert (own.image_digest, own.template_hash) != ("", "")
        assert own.image_digest == served.base.digest  # the pool's own image: the first --image
        fleet.release(own.id)
    refused, seconds = lease(served, image="never-built:1", pool="python", wait_seconds=30)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "image_not_served"
    assert seconds < 30  # refused at once, not after the wait


def test_prefetch_warms_an_image_and_refuses_past_the_caps(served: TwoImages) -> None:
    def prefetch(image: str, count: int) -> httpx.Response:
        body = {"pool": "python", "images": [{"image": image, "count": count}], "ttl_seconds": 60}
        return httpx.post(f"{served.url}/v1/prefetch", json=body, headers=AUTH, timeout=30)

    before = warm(served)
    answered = prefetch(served.second.tag, 3)
    assert answered.status_code == 200, answered.text
    wait_until(lambda: warm(served) >= before + 2, timeout=120, what="the prefetched sandboxes warm")
    granted, _ = lease(served, image=served.second.tag, count=3, wait_seconds=60)
    assert granted.status_code == 201, granted.text
    for view in granted.json()["leases"]:
        release(served, view["id"])
    too_many = prefetch(served.second.tag, MAX_SANDBOXES)
    assert too_many.status_code == 422, too_many.text
    assert too_many.json()["error"] == "prefetch_too_large"
    unknown = prefetch("never-built:1", 1)
    assert unknown.status_code == 422, unknown.text
    assert "--image" in unknown.json()["detail"]
    # Back to its standing warm count, so the next test starts from one warm of each image.
    assert prefetch(served.second.tag, 1).status_code == 200


def test_a_group_larger_than_the_warm_count_is_booted_on_demand(served: TwoImages) -> None:
    count, wait = 4, 120
    granted, seconds = lease(served, image=served.base.tag, count=count, wait_seconds=wait)
    assert granted.status_code == 201, granted.text
    body = granted.json()
    assert len({view["sandbox"] for view in body["leases"]}) == count
    # Served by booting the difference at once, not after its wait: a boot is seconds, the wait minutes.
    assert seconds < wait / 4, f"a group of {count} took {seconds:.1f} s"
    assert body["timings"]["boot_ms"] > 0  # and the answer says its wait was sandboxes booting
    print(
        f"group of {count} with 1 warm: served in {seconds:.2f} s, boot {body['timings']['boot_ms']:.0f} ms"
    )
    for view in body["leases"]:
        release(served, view["id"])


def test_serve_exports_the_clusters_startup_histogram(served: TwoImages) -> None:
    exposition = httpx.get(f"{served.url}/metrics").text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: hack/bootstrap installs it (Debian package prometheus)"
    checked = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    family = [line for line in exposition.splitlines() if line.startswith(f"{STARTUP_METRIC}_")]
    phases = {part.split('phase="')[1].split('"')[0] for part in family if 'phase="' in part}
    assert phases == set(STARTUP_PHASES)
    buckets = {line.split('le="')[1].split('"')[0] for line in family if "_bucket{" in line}
    assert buckets == {*(str(float(b)) for b in STARTUP_BUCKETS), "+Inf"}
    counts = [
        line for line in family if line.startswith(f"{STARTUP_METRIC}_count") and 'phase="total"' in line
    ]
    (total,) = counts
    assert 'pool="python"' in total
    assert 'region="local"' in total
    assert float(total.rsplit(" ", 1)[1]) >= 2  # at least one sandbox of each image


def test_prune_keeps_the_roots_a_running_serve_uses(served: TwoImages) -> None:
    """`sandbox_image/build prune` removes an unpacked root only when no running runtime mounts it."""
    spec = importlib.util.spec_from_file_location(
        "image_builder", IMAGE_BUILD_SCRIPT.parent / "image_builder.py"
    )
    assert spec is not None
    assert spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    # Registered first: its dataclasses resolve their annotations through sys.modules.
    sys.modules.setdefault("image_builder", builder)
    spec.loader.exec_module(builder)
    for image in (served.base, served.second):
        root = rootfs_cache() / image.digest.replace(":", "-")
        assert root.is_dir()
        assert builder._mounted(root), f"{image.tag}'s root is not seen as in use: prune would remove it"
