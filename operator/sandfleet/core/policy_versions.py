"""Policy versions per run and the staleness decision an acquire gets (pure: time is passed in)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final

from sandfleet.wire import POLICY_MODES, PolicyMode

Mode = PolicyMode  # refuse an acquire beyond the bound, or flag it: the words are sandfleet.wire's
MODES: Final = POLICY_MODES
STALE_LABEL = "policy-stale"  # set on leases the run lets through in "flag" mode


class PolicyError(ValueError):
    """A publish that cannot be honoured (a version going backwards, a bad bound or mode)."""


@dataclass(frozen=True)
class RunPolicy:
    """What the learner last published for a run: its current version and how stale actors may be."""

    run: str
    version: int
    staleness_bound: int
    mode: Mode
    updated_at: float
    owner: str = ""  # the caller that created the run; "" for runs stored before runs had owners

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> RunPolicy:
        """Parse a stored policy; PolicyError when it is not one."""
        try:
            data: Any = json.loads(raw)
            policy = cls(
                run=str(data["run"]),
                version=int(data["version"]),
                staleness_bound=int(data["staleness_bound"]),
                mode=data["mode"],
                updated_at=float(data["updated_at"]),
                owner=str(data.get("owner") or ""),
            )
        except (TypeError, ValueError, KeyError) as error:
            raise PolicyError(f"unreadable stored policy: {error}") from None
        if policy.mode not in MODES:
            raise PolicyError(f"unreadable stored policy: mode {policy.mode!r}")
        return policy


def publish(
    previous: RunPolicy | None,
    run: str,
    version: int,
    now: float,
    staleness_bound: int | None = None,
    mode: Mode | None = None,
    owner: str = "",
) -> RunPolicy:
    """The run's policy after the learner publishes `version`; bound and mode default to the last ones.

    The run keeps the owner it has; `owner` only names the owner of a run that has none yet.

    Versions never go backwards (a restarted learner that republishes an older step would make every
    live actor look fresh again); republishing the current version only changes bound or mode.
    """
    if version < 0:
        raise PolicyError(f"policy versions start at 0, got {version}")
    if previous is not None and version < previous.version:
        raise PolicyError(
            f"run {run!r} is at policy version {previous.version}; {version} would go backwards "
            "(publish a version at least as new, or start a new run)"
        )
    bound = staleness_bound if staleness_bound is not None else (previous.staleness_bound if previous else 4)
    if bound < 0:
        raise PolicyError(f"staleness_bound must be >= 0, got {bound}")
    chosen: Mode = mode or (previous.mode if previous else "refuse")
    if chosen not in MODES:
        raise PolicyError(f"mode must be one of {', '.join(MODES)}, got {chosen!r}")
    kept = previous.owner if previous is not None and previous.owner else owner
    return RunPolicy(run=run, version=version, staleness_bound=bound, mode=chosen, updated_at=now, owner=kept)


@dataclass(frozen=True)
class Staleness:
    """What an acquire for `requested` gets under the run's policy."""

    allowed: bool
    staleness: int  # current - requested; 0 when the run has no policy or no version was given
    flagged: bool
    detail: str


def staleness(current: int, used: int) -> int:
    """How many versions behind `used` is (never negative: a version ahead of the learner is fresh)."""
    return max(current - used, 0)


def decide(policy: RunPolicy | None, requested: int | None) -> Staleness:
    """Whether an episode for policy version `requested` may start in this run.

    A run without a published policy, or an acquire without a version, is never refused: policy
    awareness is opt-in per run and per caller.
    """
    if policy is None or requested is None:
        return Staleness(True, 0, False, "")
    lag = staleness(policy.version, requested)
    if lag <= policy.staleness_bound:
        return Staleness(True, lag, False, "")
    detail = (
        f"policy version {requested} is {lag} versions behind run {policy.run!r} "
        f"(current {policy.version}, bound {policy.staleness_bound})"
    )
    if policy.mode == "flag":
        return Staleness(True, lag, True, detail + f"; leased and labelled {STALE_LABEL}")
    return Staleness(
        False, lag, False, detail + f": sync weights to version >= {policy.version - policy.staleness_bound}"
    )
