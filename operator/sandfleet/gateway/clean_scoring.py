"""Scores an episode in a clean sandbox of its image: only its tree travels there, none of its processes.

In place, a task's scoring trusts the episode's sandbox: its agent builds the scoring tree from the
task's root-owned copy and runs the suite as the verifier, which holds while the episode's
commands cannot reach the agent. Where they might (an episode that runs as root, or a pool that
trusts no sandbox an episode ran in), the gateway leases a second sandbox of the same image, writes
the episode's tree over that sandbox's own (its directories and regular files, through the agent's
archive routes; links stay behind, as scoring never carries one), deletes what the episode deleted,
and asks that sandbox's agent to score the task. Its agent applies every rule it applies in place
(only source edits are carried, against its own pristine copy), and nothing of the episode ever ran
there. SWE-bench's harness does the same with the model's patch; here the tree travels, not a diff.
"""

from __future__ import annotations

import asyncio
import io
import json
import stat
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
from fastapi import Response

from sandfleet.core import api
from sandfleet.core.model import SandboxPod, image_key
from sandfleet.gateway.backend import PoolInfo
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.proxy import DEFAULT_TIMEOUTS, AgentProxy, SandboxUnreachable, answer_bound, as_problem
from sandfleet.wire import Outcome, RewardSource

# The most of an episode's tree that travels (the agent carries at most 256 MiB of changes anyway).
MAX_TREE_BYTES = 512 << 20
# The most files an episode may delete from the task's tree and still be scored (each is one call).
MAX_DELETED = 2_000
# How long the gateway waits for a clean sandbox of the image before it gives up (an infra error).
CLEAN_WAIT_S = 60.0
# The lease label that says which lease a clean sandbox scored.
SCORES_LABEL = "scores"
# Why an episode whose commands ran as the image's user scored 0 when its sandbox went away.
LOST_EPISODE = "the episode's sandbox stopped answering while its commands ran as the image's user"


@dataclass(frozen=True)
class Plan:
    """What a clean scoring needs from the caller's evaluate body."""

    tree: str  # the episode's tree, relative to its working area (the same path in the clean sandbox)


@dataclass(frozen=True)
class Travelling:
    """The episode's tree as it travels: a tar of its directories and regular files, and their names."""

    tar: bytes
    files: frozenset[str]  # the regular files that travel
    entries: frozenset[str]  # every entry but a directory, travelling or not: nothing of these was deleted
    left: int  # links, hard links and special files left behind (scoring never carries them)


class NotApart(ValueError):
    """The body is not one a clean sandbox can score: the caller's to fix (a 422)."""


def wanted(pool: PoolInfo, query: Mapping[str, str]) -> bool:
    """Whether this evaluate runs in a clean sandbox: the pool says so, or the caller asks (`clean=true`)."""
    return pool.clean_scoring or query.get("clean", "").lower() in ("1", "true", "yes")


def plan(raw: bytes) -> Plan:
    """Read the evaluate body: only a task's scoring can move (a test command runs in the episode's tree)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise NotApart("the evaluate body is not JSON") from None
    task = body.get("task") if isinstance(body, dict) else None
    if not isinstance(task, dict):
        raise NotApart(
            "scoring in a clean sandbox takes a `task` object (its tree travels; a test command runs "
            "where the episode ran): evaluate with the task's scoring() (docs/tasks.md)"
        )
    tree = task.get("tree")
    if not isinstance(tree, str) or not tree:
        raise NotApart("task.tree must be a non-empty string")
    return Plan(tree=tree)


def travelling(tar: bytes) -> Travelling:
    """Keep a tree's directories and regular files; links, special files and root's own stay behind.

    Scoring never carries a link (its own tree keeps the task's), and the clean sandbox's upload
    refuses links out of the working area, which task trees hold (`python -> /usr/bin/python3`).
    """
    out = io.BytesIO()
    files: set[str] = set()
    entries: set[str] = set()
    left = 0
    with (
        tarfile.open(fileobj=io.BytesIO(tar), mode="r:*") as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as kept,
    ):
        for member in source:
            if not member.isdir():
                entries.add(_name(member.name))
            if member.isdir():
                kept.addfile(member)
            elif member.isreg() and (member.uid != 0 or member.mode & stat.S_IROTH):
                kept.addfile(member, source.extractfile(member))
                files.add(_name(member.name))
            else:  # a link, a special file, or root's private file (a hard link to data of root's)
                left += 1
    return Travelling(out.getvalue(), frozenset(files), frozenset(entries), left)


def regular_files(tar: bytes) -> frozenset[str]:
    """The regular files a tree's tar holds (its names, normalised)."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:*") as source:
        return frozenset(_name(member.name) for member in source if member.isreg())


def _name(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def image_of(pool: PoolInfo, sandbox: SandboxPod) -> str | None:
    """The reference of the image the episode's sandbox runs (None: the pool's own).

    NotApart for an image the pool neither runs nor always serves (a cluster's prefetched task
    image): its Pod names it, the index keeps only its key, so no clean sandbox of it can be asked for.
    """
    if not sandbox.image_key or image_key(pool.image) == sandbox.image_key:
        return None
    for image in pool.served_images:
        if image_key(image) == sandbox.image_key:
            return image
    raise NotApart(
        "the episode ran an image its pool only prefetched, and a clean sandbox can be had only of the "
        "pool's own image or the images it serves: give such tasks a pool of their image"
    )


def refused(reason: str, outcome: Outcome, started: float, now: float) -> dict[str, object]:
    """An evaluation that never reached the tests: reward 0, with why."""
    return {
        "outcome": str(outcome),
        "outcome_reason": reason,
        "reward": 0.0,
        "reward_source": str(RewardSource.DECIDING_TESTS),
        "deciding": {},
        "tampered": [reason] if outcome == Outcome.FAILED else [],
        "carried": {},
        "counts": {},
        "tests": [],
        "tests_report": None,
        "patch": {},
        "exec": {},
        "durations": {"prepare_s": round(now - started, 6), "tests_s": 0.0},
    }


def lost_mid_episode(sandbox: SandboxPod, now: float) -> bool:
    """Whether a leased sandbox just went (unready, no address, broken, deleted) before its lease ended."""
    lease = sandbox.lease
    if lease is None or sandbox.state != api.LEASE_LEASED or lease.expired(now):
        return False
    return sandbox.terminating or sandbox.broken or not sandbox.ready or sandbox.address is None


class LostEpisodes:
    """The leases of pools whose commands run as the image's user that lost their sandbox mid-episode.

    Root in such a sandbox can stop its agent, so that loss is the episode's doing: an evaluate of
    the lease, even once its sandbox is gone and the lease with it, scores 0 (`failed`) rather
    than an error a trainer would mask. Fed by the backend's changes; remembers the last `limit`.
    """

    def __init__(
        self, pool: Callable[[str], PoolInfo | None], clock: Callable[[], float], limit: int = 10_000
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.limit = limit
        self._lost: dict[str, tuple[str, str]] = {}  # lease id -> (holder, why)

    def on_change(self, sandbox: SandboxPod) -> None:
        lease = sandbox.lease
        if lease is None or lease.id in self._lost or not lost_mid_episode(sandbox, self.clock()):
            return
        pool = self.pool(sandbox.pool)
        if pool is None or not pool.commands_as_image_user:
            return
        self._lost[lease.id] = (lease.holder, f"sandbox {sandbox.name} went away mid-episode")
        while len(self._lost) > self.limit:
            del self._lost[next(iter(self._lost))]

    def report(self, lease_id: str, holder: str) -> dict[str, object] | None:
        """The evaluation of a lost episode of `holder`'s, or None when `lease_id` is not one."""
        found = self._lost.get(lease_id)
        if found is None or found[0] != holder:
            return None
        now = time.monotonic()
        return refused(f"{LOST_EPISODE}: {found[1]}", Outcome.FAILED, now, now)


class _TreeRefused(Exception):
    """The episode's tree cannot travel: the episode's doing (failed), with why."""


async def score(
    service: LeaseService,
    proxy: AgentProxy,
    holder: str,
    lease_id: str,
    sandbox: SandboxPod,
    raw: bytes,
) -> tuple[Response, float]:
    """Score `lease_id`'s episode in a clean sandbox of its image; the agent's answer and its seconds.

    The clean sandbox's tree is the task's as the image has it: the episode's regular files are
    written over it and the files the episode deleted are deleted, so the clean agent's scoring sees
    the episode's tree (less its links) and its own pristine copy, untouched by the episode.
    """
    started = time.monotonic()
    planned = plan(raw)
    pool = service.pool(sandbox.pool)
    try:
        episode = await asyncio.to_thread(travelling, await _download(proxy, sandbox, planned.tree))
    except (_TreeRefused, tarfile.TarError) as error:
        return _failed(f"the episode's tree cannot travel: {error}", started)
    except SandboxUnreachable as error:
        if not pool.commands_as_image_user:
            raise
        # Its commands could stop the agent: a sandbox lost mid-episode is the episode's zero.
        return _failed(f"{LOST_EPISODE}: {error}", started)
    request = LeaseRequest(
        pool=pool.name,
        holder=holder,
        image=image_of(pool, sandbox),
        labels={SCORES_LABEL: lease_id},
        wait_seconds=CLEAN_WAIT_S,
    )
    granted = await service.acquire(request)
    lease, clean = granted.leases[0]
    try:
        try:
            own = await asyncio.to_thread(regular_files, await _download(proxy, clean, planned.tree))
        except (_TreeRefused, tarfile.TarError) as error:
            raise SandboxUnreachable(f"the clean sandbox's tree could not be read: {error}") from None
        # A link where the task has a file is never carried (in place, the task's file stays): only
        # what the episode's tree has no entry for at all was deleted.
        deleted = sorted(own - episode.entries)
        if len(deleted) > MAX_DELETED:
            why = (
                f"the episode deleted {len(deleted)} files of the task's tree (at most {MAX_DELETED} travel)"
            )
            return _failed(why, started)
        try:
            await _upload(proxy, clean, planned.tree, episode.tar)
        except _TreeRefused as error:
            return _failed(str(error), started)
        for name in deleted:
            await _delete(proxy, clean, f"{planned.tree.rstrip('/')}/{name}")
        answer = await _evaluate(proxy, clean, raw)
    finally:
        await service.release(lease.id, holder)
    payload, headers = (
        answer.content,
        {"content-type": answer.headers.get("content-type", "application/json")},
    )
    if answer.status_code >= 400:
        payload, headers = as_problem(payload, headers)
    return Response(payload, status_code=answer.status_code, headers=headers), time.monotonic() - started


def _url(sandbox: SandboxPod) -> str:
    url = sandbox.agent_url()
    if url is None:
        raise SandboxUnreachable(f"sandbox {sandbox.name} has no address yet; retry the evaluate")
    return url


async def _evaluate(proxy: AgentProxy, clean: SandboxPod, raw: bytes) -> httpx.Response:
    read = answer_bound(raw, None, DEFAULT_TIMEOUTS["/v1/evaluate"])
    headers = {**proxy.agent_headers(clean.name, clean.episodes), "content-type": "application/json"}
    try:
        return await proxy.client.post(
            _url(clean) + "/v1/evaluate",
            content=raw,
            headers=headers,
            timeout=httpx.Timeout(proxy.timeout, connect=5.0, read=read),
        )
    except httpx.TransportError as error:
        raise SandboxUnreachable(
            f"the clean sandbox's agent did not answer ({type(error).__name__}); retry the evaluate"
        ) from error


async def _download(proxy: AgentProxy, sandbox: SandboxPod, tree: str) -> bytes:
    """A sandbox's tree as a tar, at most MAX_TREE_BYTES; a refusal (no such tree, too big) raised."""
    url, headers = _url(sandbox), proxy.agent_headers(sandbox.name, sandbox.episodes)
    data = bytearray()
    try:
        async with proxy.client.stream(
            "GET", url + "/v1/files/archive", params={"path": tree}, headers=headers
        ) as answer:
            if answer.status_code >= 400:
                await answer.aread()
                raise _TreeRefused(f"{tree!r} could not be read: {_agent_message(answer)}")
            async for chunk in answer.aiter_bytes():
                data.extend(chunk)
                if len(data) > MAX_TREE_BYTES:
                    raise _TreeRefused(f"{tree!r} is larger than {MAX_TREE_BYTES} bytes")
    except httpx.TransportError as error:
        raise SandboxUnreachable(
            f"sandbox {sandbox.name}'s agent did not answer while its tree was read ({type(error).__name__})"
        ) from error
    return bytes(data)


async def _upload(proxy: AgentProxy, sandbox: SandboxPod, path: str, tree: bytes) -> None:
    """Unpack the episode's tree over `path` in the clean sandbox; an unsafe member is the episode's doing."""
    headers = {**proxy.agent_headers(sandbox.name, sandbox.episodes), "content-type": "application/x-tar"}
    try:
        answer = await proxy.client.put(
            _url(sandbox) + "/v1/files/archive", params={"path": path}, content=tree, headers=headers
        )
    except httpx.TransportError as error:
        raise SandboxUnreachable(
            f"the clean sandbox's agent did not answer while the tree was copied ({type(error).__name__})"
        ) from error
    if answer.status_code == 422:
        raise _TreeRefused(f"the episode's tree cannot be copied: {_agent_message(answer)}")
    if answer.status_code >= 400:
        raise SandboxUnreachable(f"the clean sandbox refused the tree: {_agent_message(answer)}")


async def _delete(proxy: AgentProxy, sandbox: SandboxPod, path: str) -> None:
    """Delete a file the episode deleted from the clean sandbox's tree."""
    try:
        answer = await proxy.client.delete(
            _url(sandbox) + "/v1/files",
            params={"path": path},
            headers=proxy.agent_headers(sandbox.name, sandbox.episodes),
        )
    except httpx.TransportError as error:
        raise SandboxUnreachable(
            f"the clean sandbox's agent did not answer ({type(error).__name__})"
        ) from error
    if answer.status_code >= 400 and answer.status_code != 404:
        raise SandboxUnreachable(f"the clean sandbox refused to delete {path!r}: {_agent_message(answer)}")


def _agent_message(answer: httpx.Response) -> str:
    try:
        error = answer.json().get("error", {})
        return str(error.get("message") or error.get("code") or answer.status_code)
    except (ValueError, AttributeError):
        return f"HTTP {answer.status_code}"


def _failed(reason: str, started: float) -> tuple[Response, float]:
    """A `failed` evaluation with reward 0 that the episode caused, as the route answers it."""
    now = time.monotonic()
    body = json.dumps(refused(reason, Outcome.FAILED, started, now)).encode()
    return Response(body, status_code=200, media_type="application/json"), now - started
