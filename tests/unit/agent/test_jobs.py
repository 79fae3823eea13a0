"""Background jobs through the agent: start, poll, tail, wait, kill, delete."""

from __future__ import annotations

import time

from tests.unit.agent.conftest import Agent, wait_dead


def test_job_runs_in_background_and_can_be_waited_and_tailed(agent: Agent) -> None:
    started = agent.client.post("/v1/jobs", json={"shell": "for i in 1 2 3; do echo line$i; sleep 0.1; done"})
    assert started.status_code == 201
    job = started.json()
    assert job["state"] == "running"
    job_id = job["job_id"]
    assert [entry["job_id"] for entry in agent.client.get("/v1/jobs").json()["jobs"]] == [job_id]

    done = agent.client.get(f"/v1/jobs/{job_id}/wait", params={"timeout_s": 10}).json()
    assert done["state"] == "exited"
    assert done["exit_code"] == 0
    assert done["stdout_bytes"] == len("line1\nline2\nline3\n")

    full = agent.client.get(f"/v1/jobs/{job_id}/output").json()
    assert full["data"] == "line1\nline2\nline3\n"
    assert full["running"] is False
    tail = agent.client.get(f"/v1/jobs/{job_id}/output", params={"tail": 6}).json()
    assert tail["data"] == "line3\n"
    incremental = agent.client.get(f"/v1/jobs/{job_id}/output", params={"offset": 6, "max_bytes": 6}).json()
    assert incremental["data"] == "line2\n"
    assert incremental["next_offset"] == 12


def test_polling_sees_output_while_the_job_runs(agent: Agent) -> None:
    job_id = agent.client.post("/v1/jobs", json={"shell": "echo early; sleep 30"}).json()["job_id"]
    deadline = time.monotonic() + 5
    output = ""
    while time.monotonic() < deadline and not output:
        output = agent.client.get(f"/v1/jobs/{job_id}/output").json()["data"]
        time.sleep(0.05)
    assert output == "early\n"
    assert agent.client.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
    agent.client.post(f"/v1/jobs/{job_id}/kill")


def test_kill_takes_the_whole_group(agent: Agent) -> None:
    marker = agent.root / "child.pid"
    job = agent.client.post("/v1/jobs", json={"shell": f"sleep 60 & echo $! > {marker}; wait"}).json()
    deadline = time.monotonic() + 5
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(marker.read_text())
    killed = agent.client.post(f"/v1/jobs/{job['job_id']}/kill").json()
    assert killed["state"] == "killed"
    assert killed["signal"] == 9
    assert wait_dead(child)
    assert wait_dead(job["pid"])


def test_job_timeout(agent: Agent) -> None:
    job = agent.client.post("/v1/jobs", json={"shell": "sleep 30", "timeout_s": 0.3}).json()
    done = agent.client.get(f"/v1/jobs/{job['job_id']}/wait", params={"timeout_s": 10}).json()
    assert done["state"] == "timed_out"


def test_delete_and_unknown_jobs(agent: Agent) -> None:
    job_id = agent.client.post("/v1/jobs", json={"argv": ["sleep", "30"]}).json()["job_id"]
    assert agent.client.delete(f"/v1/jobs/{job_id}").json() == {"job_id": job_id, "deleted": True}
    missing = agent.client.get(f"/v1/jobs/{job_id}")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "job_not_found"
    bad = agent.client.post("/v1/jobs", json={"argv": ["no-such-command"]})
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "command_not_found"
