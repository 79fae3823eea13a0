"""Run policies in ConfigMaps: stable, valid names for any run, and one claim for a burst of acquires."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.gateway.kube_policy import ConfigMapPolicyStore, configmap_name
from sandfleet.kube.errors import KubeError

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@given(st.text(min_size=1, max_size=300))
def test_configmap_names_are_valid_and_stable(run: str) -> None:
    name = configmap_name(run)
    assert DNS_SUBDOMAIN.match(name)
    assert len(name) <= 253
    assert configmap_name(run) == name


def test_different_runs_get_different_names() -> None:
    assert configmap_name("r1") != configmap_name("R1")


class FakeConfigMaps:
    """A namespace's ConfigMaps behind the calls ConfigMapPolicyStore makes, each taking a moment."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()

    async def json(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls[method] += 1
        await asyncio.sleep(0.01)
        name = path.rsplit("/", 1)[-1]
        if name not in self.objects:
            raise KubeError(404, "not found")
        return self.objects[name]

    async def send(self, method: str, path: str, body: dict[str, Any], **_: Any) -> None:
        self.calls[method] += 1
        await asyncio.sleep(0.01)
        name = body["metadata"]["name"]
        if method == "POST" and name in self.objects:
            raise KubeError(409, "already exists")
        self.objects[name] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}


async def test_a_new_runs_first_step_claims_it_once_however_many_acquires_ask_at_once() -> None:
    """300 acquires of a new run at one replica: one read and one create, and one owner for all."""
    maps = FakeConfigMaps()
    store = ConfigMapPolicyStore("ns", lambda: maps)  # type: ignore[arg-type, return-value]
    owners = await asyncio.gather(*(store.claim("run-1", "alice") for _ in range(300)))
    assert set(owners) == {"alice"}
    assert (maps.calls["GET"], maps.calls["POST"]) == (1, 1)
    # Another tenant's claim while alice's is in flight gets alice's answer: the run is hers.
    maps.objects.clear()
    first, second = await asyncio.gather(store.claim("run-2", "alice"), store.claim("run-2", "mallory"))
    assert (first, second) == ("alice", "alice")
    reads = maps.calls["GET"]
    assert await asyncio.gather(*(store.owner("run-2") for _ in range(50))) == ["alice"] * 50
    assert maps.calls["GET"] - reads <= 1  # cached, or one read shared
