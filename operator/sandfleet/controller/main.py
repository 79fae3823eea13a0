"""`sandfleet operator`: build the Operator and hand it to kopf, with kubeconfig or in-cluster config."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path

import kopf
from prometheus_client import start_http_server

from sandfleet.controller import handlers  # noqa: F401  (registers the kopf handlers)
from sandfleet.controller.kube import Kube, connect
from sandfleet.controller.metrics import cluster_registry
from sandfleet.controller.pool_workers import Operator, OperatorSettings
from sandfleet.core.agent_tokens import AgentKeyError, parse_fleet_key
from sandfleet.core.api import DEFAULT_CLUSTER
from sandfleet.core.ledger import DEFAULT_SHARDS


class OperatorConfigError(Exception):
    """Settings the operator cannot start with; the message says what to set."""


def read_agent_key(path: Path | None) -> bytes:
    """The fleet key from its file: without one, sandboxes' agents would have no token, so refuse."""
    if path is None:
        raise OperatorConfigError(
            "no agent key: pass --agent-key-file (or SANDFLEET_OPERATOR_AGENT_KEY_FILE) naming a file "
            "with the fleet key the gateway holds too; the chart mounts its Secret there"
        )
    try:
        return parse_fleet_key(path.read_text())
    except OSError as error:
        raise OperatorConfigError(f"cannot read the agent key file {path}: {error.strerror}") from None
    except AgentKeyError as error:
        raise OperatorConfigError(f"the agent key file {path}: {error}") from None


def _leader_namespace(namespaces: Sequence[str]) -> str:
    explicit = os.environ.get("SANDFLEET_LEADER_NAMESPACE") or os.environ.get("POD_NAMESPACE")
    if explicit:
        return explicit
    return namespaces[0] if namespaces else "default"


def run(
    namespaces: Sequence[str] = (),
    metrics_port: int | None = None,
    lease_seconds: float | None = None,
    liveness_endpoint: str | None = None,
    *,
    agent_key: bytes,
    runtime_classes: Sequence[str] = ("gvisor",),
    cluster: str = DEFAULT_CLUSTER,
) -> None:
    """Run the operator until SIGINT/SIGTERM; watch `namespaces`, or every namespace when empty."""
    logging.basicConfig(
        level=os.environ.get("SANDFLEET_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf logs every handled event at INFO: thousands a minute at scale, none of them news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    port = metrics_port if metrics_port is not None else int(os.environ.get("SANDFLEET_METRICS_PORT", "8080"))
    if port:
        start_http_server(port, registry=cluster_registry(cluster))  # every series: cluster=<name>
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    settings = OperatorSettings(
        namespaces=tuple(namespaces),
        leader_namespace=_leader_namespace(namespaces),
        lease_seconds=lease_seconds or float(os.environ.get("SANDFLEET_LEADER_LEASE_SECONDS", "15")),
        runtime_classes=frozenset(runtime_classes),
        agent_key=agent_key,
        ledger_shards=int(os.environ.get("SANDFLEET_LEDGER_SHARDS", str(DEFAULT_SHARDS))),
    )
    asyncio.run(_operate(settings, identity, liveness_endpoint))


async def _operate(settings: OperatorSettings, identity: str, liveness_endpoint: str | None) -> None:
    kube = Kube(await connect())
    operator = Operator(kube, identity, settings)
    try:
        await kopf.operator(
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            memo=kopf.Memo(operator=operator),
            liveness_endpoint=liveness_endpoint,
        )
    finally:
        await kube.close()
