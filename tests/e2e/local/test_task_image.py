"""A task image (the base plus a task's repository, built offline) runs and is evaluated end to end."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sandfleet.local.runtime import LocalRuntime
from tests.e2e.local.conftest import build_task_image

pytestmark = pytest.mark.gvisor

PATCH = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


async def test_task_image_carries_the_repository_and_its_harbor_tests(runsc: Path, tmp_path: Path) -> None:
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (task / "tests" / "test.sh").write_text(
        "python3 -c 'import calc; assert calc.add(2, 3) == 5' && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    image = build_task_image(
        "calc",
        task,
        setup="git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm task",
    )
    async with LocalRuntime(image, runsc) as runtime:
        sandbox = await runtime.create()
        async with httpx.AsyncClient(
            base_url=sandbox.url, headers=sandbox.headers, timeout=60, trust_env=False
        ) as agent:
            log = (
                await agent.post(
                    "/v1/exec", json={"shell": "git log --oneline | wc -l; id -un; stat -c %U calc.py"}
                )
            ).json()
            assert log["stdout"].split() == ["1", "sandbox", "sandbox"]
            before = (await agent.post("/v1/evaluate", json={})).json()
            assert before["reward"] == 0.0
            after = (await agent.post("/v1/evaluate", json={"patch": PATCH})).json()
            assert after["reward"] == 1.0
            assert after["patch"]["files"] == ["calc.py"]
