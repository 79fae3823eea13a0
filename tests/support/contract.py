"""How the suites run schemathesis: every check, with the exceptions the API's contract states."""

from __future__ import annotations

from pathlib import Path

# Every check, but one: positive_data_acceptance wants every schema-valid request accepted, and two
# kinds of refusal are right although the static schema cannot express them: limits a pool sets at
# runtime (its max TTL, its capacity, its image) and data-plane bodies, which the schema declares as
# free-form objects passed to the sandbox's agent (which refuses an exec with neither argv nor shell).
EXCLUDED_CHECKS = "positive_data_acceptance"
# Two statuses are right where the defaults do not expect them: 504 is the documented answer to an
# acquire whose wait ran out (no_sandbox_in_time: the pool was drained by the run's own leases, not
# a crash; every other 5xx still fails), and 410 refuses any request, valid or not, on a lease the
# chain already released.
CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]

[checks.negative_data_rejection]
expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "410", "413", "415", "422", "428", "429", "5xx",
]
"""


def config_file(directory: Path) -> Path:
    """A schemathesis.toml with the stated exceptions, written into `directory`."""
    path = directory / "schemathesis.toml"
    path.write_text(CONFIG)
    return path
