"""The evaluate answer's words, as the client reads them: outcomes, reward sources, counts, error codes.

The agent stands alone (standard library only), so this is a copy of sandfleet.wire's, which the
client, the gateway and the CLI use; tests/unit/agent/test_wire.py holds the two equal.
"""

from __future__ import annotations

from typing import Final

# An evaluation's `outcome`: a trainer masks INFRA_ERROR episodes rather than learn from their zero.
PASSED: Final = "passed"
FAILED: Final = "failed"
TIMED_OUT: Final = "timed_out"
INFRA_ERROR: Final = "infra_error"
OUTCOMES: Final = (PASSED, FAILED, TIMED_OUT, INFRA_ERROR)

# An evaluation's `reward_source`: what its reward was read from.
DECIDING_TESTS: Final = "deciding_tests"  # a task's named tests, run in a scoring tree
REWARD_FILE: Final = "reward_file"  # the verifier's reward.txt or reward.json
EXIT_CODE: Final = "exit_code"  # the test command's exit status: 0 earns 1.0
REWARD_SOURCES: Final = (DECIDING_TESTS, REWARD_FILE, EXIT_CODE)

# The keys of an evaluation's `counts`, in the order pytest's summary line names them.
COUNT_KEYS: Final = ("passed", "failed", "error", "skipped", "xfailed")

# Error codes the client turns into an outcome rather than raise: a patch that does not apply is
# the episode's doing (failed) ...
BAD_PATCH: Final = "bad_patch"
# ... a verifier that cannot be run is the task's or the sandbox's (infra_error).
NO_TEST_COMMAND: Final = "no_test_command"
COMMAND_NOT_FOUND: Final = "command_not_found"
COMMAND_NOT_EXECUTABLE: Final = "command_not_executable"
VERIFIER_DIR_UNWRITABLE: Final = "verifier_dir_unwritable"
VERIFIER_CANNOT_RUN: Final = frozenset(
    {NO_TEST_COMMAND, COMMAND_NOT_FOUND, COMMAND_NOT_EXECUTABLE, VERIFIER_DIR_UNWRITABLE}
)

# An agent whose commands run as root refuses to score in place: the gateway scores elsewhere.
SCORE_ELSEWHERE: Final = "score_elsewhere"
