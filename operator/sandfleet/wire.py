"""The words on the wire that the client, the gateway and the CLI share: outcomes, reward sources, fields.

Standard library only: the client speaks HTTP and must not import the gateway's pydantic models,
so what both must spell the same lives here. The in-sandbox agent cannot import sandfleet at all;
it keeps its own copy (sandbox_image/sandfleet_agent/wire.py), held equal to this one by
tests/unit/agent/test_wire.py.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations
# only (Python 3.11), and EvaluationReport's required keys are checked at run time.
from enum import StrEnum
from typing import Any, Final, NotRequired, TypedDict


class Outcome(StrEnum):
    """How an evaluation ended; a trainer masks INFRA_ERROR episodes rather than learn from their zero."""

    PASSED = "passed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INFRA_ERROR = "infra_error"


class RewardSource(StrEnum):
    """What an evaluation's reward was read from."""

    DECIDING_TESTS = "deciding_tests"  # a task's named tests, run in a scoring tree
    REWARD_FILE = "reward_file"  # the verifier's reward.txt or reward.json
    EXIT_CODE = "exit_code"  # the test command's exit status: 0 earns 1.0


# The keys of an evaluation's `counts`, in the order pytest's summary line names them.
COUNT_KEYS: Final = ("passed", "failed", "error", "skipped", "xfailed")

# Agent error codes an evaluate call can be refused with that still amount to an outcome
# (`client.Evaluation.of_error`): a patch that does not apply is the episode's doing (FAILED) ...
BAD_PATCH: Final = "bad_patch"
# ... while a verifier that cannot be run is the task's or the sandbox's (INFRA_ERROR).
VERIFIER_CANNOT_RUN: Final = frozenset(
    {"no_test_command", "command_not_found", "command_not_executable", "verifier_dir_unwritable"}
)

# A Problem's `source` when the sandbox's agent refused, not the gateway (a 404 for a missing file,
# not for a missing lease): the gateway's proxy writes it, the client reads it.
FROM_SANDBOX: Final = "sandbox"

# Sent by the client on the first try of an acquire whose idempotency key it made itself: a key
# never sent before has no earlier attempt for the gateway to read back.
FRESH_KEY_HEADER: Final = "sandfleet-fresh-key"


class EvaluateRequest(TypedDict, total=False):
    """The body of POST /v1/leases/{id}/evaluate: a `task`, or a test command (`argv` or `shell`)."""

    patch: str  # a unified diff applied first
    task: dict[str, object]  # a catalogue task's scoring object (`Task.scoring()`): its tests decide
    argv: list[str]
    shell: str
    cwd: str
    env: dict[str, str]
    stdin: str
    stdin_base64: str
    timeout_s: float
    max_output_bytes: int
    encoding: str
    junit_xml: str  # the report's name in the verifier's directory
    require_report: bool  # no readable JUnit report is INFRA_ERROR, not a zero


class EvaluationReport(TypedDict):
    """The answer to POST /v1/leases/{id}/evaluate, as the sandbox's agent writes it."""

    outcome: str  # an Outcome's value
    reward: float
    reward_source: str  # a RewardSource's value
    counts: dict[str, int]  # by COUNT_KEYS
    tests: list[dict[str, Any]]  # one per test: name, outcome, duration_s
    patch: dict[str, Any]
    exec: dict[str, Any]
    durations: dict[str, float]
    tests_report: NotRequired[str | None]
    outcome_reason: NotRequired[str | None]  # why, unless it plainly passed or failed
    deciding: NotRequired[dict[str, Any]]  # with a task: its deciding tests' tally
    tampered: NotRequired[list[str]]  # with a task
    carried: NotRequired[dict[str, Any]]  # with a task
    reward_error: NotRequired[str]  # with a command: what was wrong with the reward file
    tests_error: NotRequired[str]  # with a command: why the JUnit report gave no results
