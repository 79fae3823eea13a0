"""A real Prometheus (Debian's package) for tests: scrapes the given targets, answers instant queries."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.kube import wait_until
from tests.support.servers import free_port

SCRAPE_INTERVAL_SECONDS = 1


class PrometheusError(AssertionError):
    """Prometheus refused a query or could not start; the message says what it answered."""


@dataclass
class Prometheus:
    """One running Prometheus: its API, its process and its log."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def _get(self, path: str, params: Mapping[str, str | list[str]]) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"GET {path} {dict(params)} -> {response.status_code}: {response.text}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the current time; the samples of its vector (PromQL errors raise)."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} gave a {data['resultType']}, not an instant vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """The values `label` takes on the series `match` selects (what Grafana's label_values() asks)."""
        values: list[str] = self._get(f"/api/v1/label/{label}/values", {"match[]": [match]} if match else {})
        return values

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return active

    def wait_until_up(self, timeout: float = 30) -> None:
        """Every target scraped successfully at least once (else the targets' errors and the log)."""

        def all_up() -> bool:
            found = self.targets()
            return bool(found) and all(t["health"] == "up" for t in found)

        try:
            wait_until(all_up, timeout=timeout, what="every Prometheus target to be up", interval=0.2)
        except AssertionError as error:
            states = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
            raise PrometheusError(f"{error}: {states}\nprometheus log:\n{self.log()}") from None

    def wait_for_fresh_scrape(self, timeout: float = 15) -> None:
        """Every target scraped again after this call began, so what happened before is stored."""
        since = time.time()

        def scraped() -> bool:
            stamps = [float(s["value"][1]) for s in self.query("timestamp(up)")]
            return bool(stamps) and min(stamps) > since

        wait_until(scraped, timeout=timeout, what="every target to be scraped again", interval=0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def scrape_config(targets: Mapping[str, Sequence[str]], interval_seconds: int) -> dict[str, Any]:
    """prometheus.yml (JSON is YAML): one job per name, scraping its host:port targets' /metrics."""
    interval = f"{interval_seconds}s"
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }


@contextmanager
def running_prometheus(
    directory: Path,
    targets: Mapping[str, Sequence[str]],
    interval_seconds: int = SCRAPE_INTERVAL_SECONDS,
    timeout: float = 30,
) -> Iterator[Prometheus]:
    """Debian's prometheus on a free loopback port, its storage under `directory`, until the block ends.

    It yields once every target has been scraped successfully; it is stopped and its storage
    removed afterwards. A missing binary or a Prometheus that does not start fails with its log.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError("prometheus is missing: hack/bootstrap installs it (Debian package prometheus)")
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(json.dumps(scrape_config(targets, interval_seconds), indent=2))
    storage = directory / "data"
    log_path = directory / "prometheus.log"
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={storage}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise PrometheusError(f"prometheus exited ({process.returncode}):\n{prometheus.log()}")
            try:
                return httpx.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(ready, timeout=timeout, what="prometheus to be ready", interval=0.2)
        except PrometheusError:
            raise
        except AssertionError as error:
            raise PrometheusError(f"{error}\nprometheus log:\n{prometheus.log()}") from None
        prometheus.wait_until_up(timeout=timeout)
        yield prometheus
    finally:
        prometheus.stop()
        shutil.rmtree(storage, ignore_errors=True)
