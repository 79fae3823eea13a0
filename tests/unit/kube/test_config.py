"""The client configuration: the kubeconfig, else the in-cluster identity, else one clear line."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandfleet.cli import app
from sandfleet.core.agent_tokens import new_fleet_key
from sandfleet.kube.config import (
    ENVIRONMENT_PROXY_VARIABLES,
    Configuration,
    api_client,
    kubeconfig_paths,
    load_configuration,
    uses_environment_proxies,
)
from sandfleet.kube.errors import KubeConfigError

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: secret-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No kubeconfig (KUBECONFIG names a missing file, HOME is empty) and no in-cluster identity."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("environ", "uses"),
    [
        ({}, False),
        ({"KUBECONFIG": "/k", "HOME": "/root"}, False),
        ({"HTTPS_PROXY": "http://proxy:3128"}, True),
        ({"https_proxy": "http://proxy:3128"}, True),
        ({"ALL_PROXY": "socks5://proxy"}, True),
        ({"NETRC": "/root/.netrc"}, True),
        ({"HTTPS_PROXY": ""}, False),  # set but empty: aiohttp ignores it too
    ],
)
def test_environment_proxies_are_told_apart(environ: dict[str, str], uses: bool) -> None:
    assert uses_environment_proxies(environ) is uses


@pytest.mark.parametrize(("proxy", "trusted"), [(None, False), ("http://proxy:3128", True)])
def test_the_client_trusts_the_environment_only_when_it_names_a_proxy(
    monkeypatch: pytest.MonkeyPatch, proxy: str | None, trusted: bool
) -> None:
    for name in [n for n in os.environ if n.lower() in ENVIRONMENT_PROXY_VARIABLES]:
        monkeypatch.delenv(name)
    if proxy is not None:
        monkeypatch.setenv("HTTPS_PROXY", proxy)

    async def made() -> bool:
        client = api_client(Configuration(), pool_size=4)
        try:
            return bool(client.rest_client.pool_manager.trust_env)
        finally:
            await client.close()

    assert asyncio.run(made()) is trusted


def test_kubeconfig_paths_keep_only_files_that_exist(tmp_path: Path) -> None:
    present = tmp_path / "a"
    present.write_text(KUBECONFIG)
    listed = f"{tmp_path / 'missing'}:{present}"
    assert kubeconfig_paths({"KUBECONFIG": listed}) == [str(present)]


def test_a_kubeconfig_is_loaded(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = nowhere / "config"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    configuration = asyncio.run(load_configuration())
    assert configuration.host == "https://127.0.0.1:6443"


def test_neither_kubeconfig_nor_cluster_is_one_clear_line(nowhere: Path) -> None:
    with pytest.raises(KubeConfigError) as caught:
        asyncio.run(load_configuration())
    message = str(caught.value)
    assert "no Kubernetes credentials" in message
    assert "KUBECONFIG" in message
    assert "\n" not in message


def test_a_broken_kubeconfig_names_its_file(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = nowhere / "config"
    path.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(KubeConfigError, match=str(path)):
        asyncio.run(load_configuration())


@pytest.mark.parametrize(
    "command", [["gateway", "--insecure-no-agent-key"], ["operator", "--metrics-port", "0"]]
)
def test_the_cli_prints_the_line_and_exits_non_zero(nowhere: Path, command: list[str]) -> None:
    key = nowhere / "agent.key"
    key.write_text(new_fleet_key().hex())
    result = CliRunner().invoke(app, [*command, "--agent-key-file", str(key)])
    assert result.exit_code == 2, result.output
    assert "no Kubernetes credentials" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
