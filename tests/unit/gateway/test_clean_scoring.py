"""The pure parts of scoring in a clean sandbox: which evaluates move, and what of a tree travels."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod, image_key
from sandfleet.gateway.backend import PoolInfo
from sandfleet.gateway.clean_scoring import (
    LostEpisodes,
    NotApart,
    image_of,
    lost_mid_episode,
    plan,
    refused,
    regular_files,
    travelling,
    wanted,
)
from sandfleet.gateway.kube import pool_from_object
from sandfleet.wire import Outcome
from tests.unit.core.test_pods import POOL_OBJECT

POOL = PoolInfo("ns", "p", 60, 600, ("r",), "registry/base:1", served_images=("registry/task:2",))


def tar_of(*members: tuple[str, bytes | str | None, int, int]) -> bytes:
    """A tar of (name, content, uid, mode): bytes a file, str a symlink's target, None a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content, uid, mode in members:
            info = tarfile.TarInfo(name)
            info.uid, info.mode = uid, mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def test_a_pool_or_the_caller_asks_for_it() -> None:
    assert not wanted(POOL, {})
    assert wanted(POOL, {"clean": "true"})
    assert wanted(POOL, {"clean": "1"})
    assert not wanted(POOL, {"clean": "no"})
    forced = PoolInfo("ns", "p", 60, 600, ("r",), "img", clean_scoring=True)
    assert wanted(forced, {})
    assert wanted(forced, {"clean": "false"})


def test_only_a_task_moves() -> None:
    assert plan(json.dumps({"task": {"tree": "repo", "deciding": ["a::b"]}}).encode()).tree == "repo"
    for body in (b"not json", b"{}", b'{"shell": "true"}', b'{"task": {"tree": ""}}', b"[1]"):
        with pytest.raises(NotApart):
            plan(body)


def test_the_tree_travels_without_links_specials_or_roots_private_files() -> None:
    tar = tar_of(
        ("src", None, 1000, 0o755),
        ("src/mod.py", b"fixed", 1000, 0o644),
        ("src/link", "/etc/passwd", 1000, 0o777),
        ("readable-of-roots.py", b"task's", 0, 0o644),
        ("private-of-roots", b"secret", 0, 0o600),
    )
    moved = travelling(tar)
    assert moved.files == {"src/mod.py", "readable-of-roots.py"}
    # What stays behind was not deleted: the clean sandbox keeps its own (the task's) there.
    assert moved.entries == {"src/mod.py", "src/link", "readable-of-roots.py", "private-of-roots"}
    assert moved.left == 2
    with tarfile.open(fileobj=io.BytesIO(moved.tar)) as kept:
        names = {m.name: m for m in kept}
        assert set(names) == {"src", "src/mod.py", "readable-of-roots.py"}
        reader = kept.extractfile(names["src/mod.py"])
        assert reader is not None
        assert reader.read() == b"fixed"
    assert regular_files(tar) == {"src/mod.py", "readable-of-roots.py", "private-of-roots"}


@given(st.lists(st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}", fullmatch=True), unique=True, max_size=8))
def test_every_regular_file_a_user_owns_travels(names: list[str]) -> None:
    # A name that is also another's directory would not make a tree: keep the leaves only.
    leaves = [n for n in names if not any(other.startswith(n + "/") for other in names)]
    tar = tar_of(*((f"./{name}", name.encode(), 1000, 0o644) for name in leaves))
    assert travelling(tar).files == set(leaves) == regular_files(tar)


def test_the_clean_sandbox_runs_the_episodes_image() -> None:
    def sandbox(image: str) -> SandboxPod:
        return SandboxPod("ns", "s", "p", "r", image_key=image_key(image))

    assert image_of(POOL, sandbox("registry/base:1")) is None  # the pool's own: lease without `image`
    assert image_of(POOL, sandbox("registry/task:2")) == "registry/task:2"
    with pytest.raises(NotApart, match="only prefetched"):
        image_of(POOL, sandbox("registry/prefetched:3"))


def test_a_refusal_is_an_evaluation_with_reward_0() -> None:
    report = refused("the tree is too big", Outcome.FAILED, started=10.0, now=10.5)
    assert (report["outcome"], report["reward"], report["tampered"]) == (
        "failed",
        0.0,
        ["the tree is too big"],
    )
    assert report["durations"] == {"prepare_s": 0.5, "tests_s": 0.0}
    assert refused("lost", Outcome.INFRA_ERROR, 0.0, 0.0)["tampered"] == []


def test_a_pool_whose_commands_run_as_the_images_user_is_always_scored_clean() -> None:
    body = {**POOL_OBJECT, "spec": {**POOL_OBJECT["spec"]}}
    plain = pool_from_object(body)
    assert not plain.clean_scoring
    assert not plain.commands_as_image_user
    body["spec"]["template"] = {
        **POOL_OBJECT["spec"]["template"],
        "agent": "injected",
        "commandsUser": "root",
    }
    as_root = pool_from_object(body)
    assert as_root.commands_as_image_user
    assert wanted(as_root, {})


def _leased(pool: str = "root", **changes: object) -> SandboxPod:
    lease = LeaseRecord("L1", pool, "actor", acquired_at=0.0, expires_at=100.0, ttl_seconds=100)
    fields: dict[str, Any] = {"state": api.LEASE_LEASED, "ready": True, "address": "10.0.0.1", "lease": lease}
    return SandboxPod("ns", "s", pool, "r", **(fields | changes))


def test_an_episode_run_as_the_images_user_that_lost_its_sandbox_scores_0_for_its_holder_only() -> None:
    pools = {
        "root": PoolInfo("ns", "root", 60, 600, ("r",), "img", commands_as_image_user=True),
        "plain": PoolInfo("ns", "plain", 60, 600, ("r",), "img"),
    }
    lost = LostEpisodes(pools.get, clock=lambda: 50.0)
    lost.on_change(_leased())  # alive: nothing
    assert lost.report("L1", "actor") is None
    lost.on_change(_leased(pool="plain", ready=False))  # another pool's loss is the infrastructure's
    assert lost.report("L1", "actor") is None
    lost.on_change(_leased(ready=False, address=None))
    report = lost.report("L1", "actor")
    assert report is not None
    assert (report["outcome"], report["reward"]) == ("failed", 0.0)
    assert "stopped answering" in str(report["outcome_reason"])
    assert lost.report("L1", "someone-else") is None


@pytest.mark.parametrize(
    ("changes", "lost"),
    [
        ({}, False),
        ({"ready": False}, True),
        ({"terminating": True}, True),
        ({"broken": True}, True),
        ({"address": None}, True),
        ({"state": api.LEASE_RELEASED, "ready": False}, False),  # released first: not mid-episode
    ],
)
def test_what_counts_as_a_sandbox_lost_mid_episode(changes: dict[str, Any], lost: bool) -> None:
    assert lost_mid_episode(_leased(**changes), now=50.0) is lost
    assert not lost_mid_episode(_leased(**changes), now=500.0)  # the lease had expired
