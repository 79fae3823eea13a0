"""Assembles and runs the Kubernetes gateway: the watch-fed backend, auth, the app, uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from sandfleet.core.agent_tokens import AgentKeyError, parse_fleet_key
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator, parse_token_file
from sandfleet.gateway.fleet import FleetBackend
from sandfleet.gateway.kube import POOL_SIZE, KubeBackend, connect
from sandfleet.gateway.kube_members import ReplicasGauge, default_identity
from sandfleet.gateway.kube_policy import ConfigMapPolicyStore
from sandfleet.gateway.metrics import ClusterUp
from sandfleet.gateway.recycling import AgentResets
from sandfleet.gateway.run_peers import KubePeers
from sandfleet.gateway.serving import guarded_protocol
from sandfleet.gateway.settings import KEEP_ALIVE_SECONDS, CapacitySettings, GatewaySettings, TenantSettings
from sandfleet.kube.config import (
    ApiClient,
    Configuration,
    api_client,
    load_configuration,
    load_configuration_from,
)


def kube_app(
    settings: GatewaySettings,
    connect: Callable[[], Awaitable[ApiClient]] = connect,
    freeze_heap: bool = False,
    capacity: CapacitySettings | None = None,
    tenancy: TenantSettings | None = None,
) -> FastAPI:
    """A gateway app serving the pools of one namespace from the Kubernetes API.

    `capacity` and `tenancy` are read from the environment when not given.
    """
    tokens = parse_token_file(settings.token_file.read_text()) if settings.token_file else {}
    agent_key = load_agent_key(settings)
    resets = AgentResets(agent_key)
    backend: KubeBackend | FleetBackend
    if settings.members:
        # Replicas of a fleet gateway do not split the warm sandboxes among themselves (yet).
        connects = member_connects(settings.members)
        backend = FleetBackend(settings.namespace, connects, resets=resets, weights=settings.member_weights)
    else:
        backend = KubeBackend(
            settings.namespace,
            connect=connect,
            token_audiences=settings.token_audiences,
            replica=(settings.replica or default_identity()) if settings.share_warm else None,
            resets=resets,
        )

    def ready() -> bool:
        return backend.synced.is_set() and backend.connected

    reviews = settings.auth == "kubernetes"
    tenancy = tenancy if tenancy is not None else TenantSettings()
    authenticator = Authenticator(
        static_tokens=tokens,
        review_token=backend.review_token if reviews else None,
        review_access=backend.may_use_pool if reviews else None,
        anonymous_allowed=settings.auth == "none",
        cache_size=tenancy.token_cache_size,
        cache_seconds=tenancy.token_cache_seconds,
        negative_cache_seconds=tenancy.token_negative_cache_seconds,
    )
    runtime = Runtime(
        backend=backend,
        authenticator=authenticator,
        ready=ready,
        start=backend.start,
        stop=backend.stop,
        agent_key=agent_key,
        max_waiting=settings.max_waiting,
        policy_store=ConfigMapPolicyStore(settings.namespace, lambda: backend.kube),
        capacity=capacity if capacity is not None else CapacitySettings(),
        tenancy=tenancy,
        collectors=(
            ReplicasGauge(backend.replicas),
            *resets.metrics(),
            backend.metrics()
            if isinstance(backend, FleetBackend)
            else ClusterUp(lambda: {settings.cluster: ready()}),
        ),
        peers=KubePeers(settings.namespace, lambda: backend.kube, settings.port),
        cluster=settings.cluster,
        freeze_heap=freeze_heap,
    )
    return create_app(runtime)


def member_connects(members: Mapping[str, Path]) -> dict[str, Callable[[], Awaitable[ApiClient]]]:
    """Per member cluster, how to connect to it: its own kubeconfig, read at each (re)connect."""

    def connect_to(kubeconfig: Path) -> Callable[[], Awaitable[ApiClient]]:
        async def connect_member() -> ApiClient:
            return api_client(await load_configuration_from(kubeconfig), POOL_SIZE)

        return connect_member

    return {name: connect_to(path) for name, path in members.items()}


def load_agent_key(settings: GatewaySettings) -> bytes | None:
    """The fleet key agents' tokens derive from; AgentKeyError saying what to do when there is none."""
    path = settings.agent_key_file
    if path is None:
        if settings.insecure_no_agent_key:
            return None
        raise AgentKeyError(
            "no agent key: every sandbox's agent requires a token derived from the fleet key; give its "
            "file with --agent-key-file (SANDFLEET_GATEWAY_AGENT_KEY_FILE; the chart mounts it), or "
            "--insecure-no-agent-key for agents that accept anyone (tests only)"
        )
    try:
        text = path.read_text()
    except OSError as error:
        raise AgentKeyError(f"cannot read the agent key file {path}: {error.strerror}") from None
    return parse_fleet_key(text)


def run(
    settings: GatewaySettings,
    capacity: CapacitySettings | None = None,
    tenancy: TenantSettings | None = None,
) -> None:
    """Serve until stopped; without credentials, KubeConfigError (one line) before anything starts.

    `capacity` and `tenancy` are read from the environment when not given.
    """
    configuration: Configuration | None = None
    tenancy = tenancy if tenancy is not None else TenantSettings()

    async def connect_loaded() -> ApiClient:
        return await connect(configuration)  # the one loaded below, before uvicorn starts

    # The agent key's errors first.
    app = kube_app(settings, connect=connect_loaded, freeze_heap=True, capacity=capacity, tenancy=tenancy)
    if settings.members:  # each member's kubeconfig, checked now: one line naming the bad one
        for kubeconfig in settings.members.values():
            asyncio.run(load_configuration_from(kubeconfig))
    else:
        configuration = asyncio.run(load_configuration())
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        http=guarded_protocol(tenancy),  # header timeout, connections per address
    )
