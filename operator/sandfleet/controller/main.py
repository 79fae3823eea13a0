"""`sandfleet operator`: build the Operator and hand it to kopf, with kubeconfig or in-cluster config.

What it runs with is an `OperatorSettings` (`controller/settings.py`), read from flags and the
environment before `run` is called; here only the fleet key is read, from the file it names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from pathlib import Path

import kopf
from prometheus_client import start_http_server

from sandfleet.controller import handlers  # noqa: F401  (registers the kopf handlers)
from sandfleet.controller.kube import Kube, connect
from sandfleet.controller.metrics import cluster_registry
from sandfleet.controller.pool_workers import Operator
from sandfleet.controller.settings import OperatorSettings
from sandfleet.core.agent_tokens import AgentKeyError, parse_fleet_key


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


def run(settings: OperatorSettings) -> None:
    """Run the operator until SIGINT/SIGTERM; watch `settings.namespaces`, or every namespace when empty.

    Without the fleet key, OperatorConfigError before anything starts; without credentials,
    KubeConfigError (from kube/) as it connects: each one line saying what to set.
    """
    agent_key = read_agent_key(settings.agent_key_file)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handled event at INFO: thousands a minute at scale, none of them news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if settings.metrics_port:
        # Every series gets cluster=<name>.
        start_http_server(settings.metrics_port, registry=cluster_registry(settings.cluster))
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    asyncio.run(_operate(settings, identity, agent_key))


async def _operate(settings: OperatorSettings, identity: str, agent_key: bytes) -> None:
    kube = Kube(await connect())
    operator = Operator(kube, identity, settings, agent_key)
    try:
        await kopf.operator(
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            memo=kopf.Memo(operator=operator),
            liveness_endpoint=settings.liveness,
        )
    finally:
        await kube.close()
