"""Harbor-format tasks: `instruction.md`, `environment/`, `tests/test.sh` -> a reward, in a leased sandbox.

The environment's files become the sandbox image: build it with
`sandbox_image/build task --name N --workspace TASK/environment` (a Dockerfile in it is not run;
its set-up goes in `--setup`). At verification the task's `tests/` are uploaded to the sandbox and
`evaluate` runs `bash tests/test.sh`, whose `/logs/verifier/reward.txt` is the reward (the agent
honours the Harbor convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandfleet.client import AsyncSandbox


class HarborTaskError(ValueError):
    """A directory that is not a Harbor task, with what is missing."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task directory."""

    root: Path
    instruction: str
    tests: dict[str, bytes]  # path relative to tests/ -> content

    @classmethod
    def load(cls, root: Path) -> HarborTask:
        instruction, test_sh = root / "instruction.md", root / "tests" / "test.sh"
        missing = [str(p.relative_to(root)) for p in (instruction, test_sh) if not p.is_file()]
        if not (root / "environment").is_dir():
            missing.append("environment/")
        if missing:
            raise HarborTaskError(f"{root} is not a Harbor task: missing {', '.join(missing)}")
        tests = {
            str(p.relative_to(root / "tests")): p.read_bytes()
            for p in sorted((root / "tests").rglob("*"))
            if p.is_file()
        }
        return cls(root, instruction.read_text(), tests)

    @property
    def name(self) -> str:
        return self.root.name

    async def verify(self, sandbox: AsyncSandbox, workdir: str = "/workspace") -> float:
        """Upload the tests and run them in `sandbox`; the reward test.sh wrote (or its exit status)."""
        for relative, content in self.tests.items():
            await sandbox.write_file(f"{workdir}/tests/{relative}", content)
        outcome = await sandbox.evaluate(cwd=workdir)
        return float(outcome.get("reward", 0.0))
