"""Runs one Harbor task through harbor's own code over a sandfleet gateway; prints a JSON summary.

Run by tests/e2e/local/test_harbor_adapter.py in the Harbor test environment (`.venv-harbor`,
Python 3.12: harbor requires it). The path is harbor's own as far as it goes without Docker:
`harbor.models.task.task.Task` loads the task, `EnvironmentFactory.create_environment_from_config`
builds our environment from an `import_path` config as a trial does, and harbor's `Verifier`
removes stale rewards, uploads `tests/` to `/tests`, runs `/tests/test.sh` as the task's verifier
user and parses the reward file it downloads. The agent phase is the oracle's two steps (upload
`solution/` to `/solution`, run `solve.sh` as the agent user), done here by hand: harbor's
`OracleAgent` also writes its log under `/logs/agent`, root's on this user-split pool, where
sandfleet never runs a command as root (`harbor run` itself runs on a root pool: see
test_harbor_adapter.py).

usage: harbor_trial.py TASK_DIR OUT_DIR URL TOKEN POOL [--solve]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from harbor.verifier.verifier import Verifier

IMPORT_PATH = "sandfleet.adapters.harbor:SandfleetEnvironment"


async def run(task_dir: Path, out_dir: Path, url: str, token: str, pool: str, solve: bool) -> dict[str, Any]:
    task = Task(task_dir)
    trial_paths = TrialPaths(out_dir)
    trial_paths.mkdir()
    config = EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"url": url, "token": token, "pool": pool})
    environment = EnvironmentFactory.create_environment_from_config(
        config,
        environment_dir=task.paths.environment_dir,
        environment_name=task_dir.name,
        session_id=f"{task_dir.name}__e2e__env",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    await environment.start(force_build=False)
    summary: dict[str, Any] = {"lease": environment.sandbox.lease.id}
    try:
        uploaded = await environment.exec("cat stats.py")
        summary["environment_uploaded"] = uploaded.return_code == 0 and "def mean" in (uploaded.stdout or "")
        with environment.with_default_user(task.config.agent.user):
            if solve:
                await environment.upload_dir(task.paths.solution_dir, "/solution")
                solved = await environment.exec("bash /solution/solve.sh")
                summary["solve_exit"] = solved.return_code
            forged = await environment.exec("echo 1 > /logs/verifier/reward.txt")
            planted = await environment.exec("mkdir -p /tests && echo 'exit 0' > /tests/test.sh")
            summary["episode_cannot_write_logs_or_tests"] = (
                forged.return_code != 0 and planted.return_code != 0
            )
        with environment.with_default_user(task.config.verifier.user):
            result = await Verifier(task=task, trial_paths=trial_paths, environment=environment).verify()
        summary["rewards"] = result.rewards
        summary["test_stdout"] = trial_paths.test_stdout_path.read_text()
        summary["downloaded"] = sorted(p.name for p in trial_paths.verifier_dir.iterdir())
    finally:
        await environment.stop(delete=True)
    return summary


def main(argv: list[str]) -> int:
    if len(argv) not in (5, 6) or (len(argv) == 6 and argv[5] != "--solve"):
        print(__doc__, file=sys.stderr)
        return 2
    task_dir, out_dir, url, token, pool = Path(argv[0]), Path(argv[1]), argv[2], argv[3], argv[4]
    print(json.dumps(asyncio.run(run(task_dir, out_dir, url, token, pool, solve=len(argv) == 6))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
