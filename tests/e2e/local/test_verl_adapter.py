"""sandfleet's verl tool, built by verl's own loader from YAML, over a real gateway and real gVisor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.client import AsyncFleet
from sandfleet.local.artifacts import ImageRef
from tests.support.servers import start_local_serve, stop_local_serve
from tests.support.verl_without_gpu import install

install()

from verl.tools.schemas import ToolResponse  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from sandfleet.adapters.verl import SandboxTool  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "verl" / "sandbox_tool.yaml"
TOKEN = "local-token"
FIX = "--- a/answer.txt\n+++ b/answer.txt\n@@ -1 +1 @@\n-41\n+42\n"

pytestmark = pytest.mark.gvisor


@pytest.fixture
def gateway(
    runsc: Path, base_image: ImageRef, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    url, process, log = start_local_serve(tmp_path, warm=2)
    # What the tool reads when its YAML names no gateway: the client's own settings.
    monkeypatch.setenv("SANDFLEET_URL", url)
    monkeypatch.setenv("SANDFLEET_TOKEN", TOKEN)
    monkeypatch.setenv("SANDFLEET_POOL", "python")
    yield url
    stop_local_serve(process, log)


async def test_verl_tool_lifecycle_in_gvisor(gateway: str) -> None:
    (tool,) = initialize_tools_from_config(str(CONFIG))
    assert isinstance(tool, SandboxTool)
    instance, created = await tool.create(create_kwargs={"labels": {"episode-kind": "e2e"}})
    assert isinstance(created, ToolResponse)
    async with AsyncFleet(gateway, token=TOKEN) as fleet:
        (lease,) = [
            lease for lease in await fleet.leases(pool="python") if lease.labels.get("episode") == instance
        ]
        assert lease.labels["run"] == "verl-e2e"
        assert lease.labels["episode-kind"] == "e2e"

        wrote, reward, metrics = await tool.execute(instance, {"command": "echo 41 > answer.txt && id -un"})
        assert isinstance(wrote, ToolResponse)
        assert wrote.text == "sandbox\n"
        assert reward == 0.0
        assert metrics["exit_code"] == 0
        assert metrics["timed_out"] is False
        assert await tool.calc_reward(instance) == 0.0  # the YAML's evaluate wants 42

        patched, _, patch_metrics = await tool.execute(instance, {"patch": FIX}, agent_data=None)
        assert patched.text == "patch applied"
        assert patch_metrics["exit_code"] == 0
        assert await tool.calc_reward(instance) == 1.0

        failed, _, failed_metrics = await tool.execute(instance, {"command": "cat /etc/shadow"})
        assert failed_metrics["exit_code"] != 0
        assert "Permission denied" in (failed.text or "")
        refused, _, refused_metrics = await tool.execute(instance, {"command": ""})
        assert refused.text is not None
        assert refused.text.startswith("error:")
        assert refused_metrics == {"error": "bad_arguments"}

        await tool.release(instance)
        assert lease.id not in {held.id for held in await fleet.leases(pool="python")}
