"""Assembles and runs the Kubernetes gateway: the watch-fed backend, auth, the app, uvicorn."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator, parse_token_file
from sandfleet.gateway.kube import KubeBackend
from sandfleet.gateway.kube_policy import ConfigMapPolicyStore
from sandfleet.gateway.serving import guarded_protocol
from sandfleet.gateway.settings import KEEP_ALIVE_SECONDS, CapacitySettings, GatewaySettings, TenantSettings


def kube_app(settings: GatewaySettings) -> FastAPI:
    """A gateway app serving the pools of one namespace from the Kubernetes API."""
    tokens = parse_token_file(settings.token_file.read_text()) if settings.token_file else {}
    agent_token = settings.agent_token_file.read_text().strip() if settings.agent_token_file else None
    backend = KubeBackend(settings.namespace, token_audiences=settings.token_audiences)
    reviews = settings.auth == "kubernetes"
    tenancy = TenantSettings()
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
        ready=lambda: backend.synced.is_set() and backend.connected,
        start=backend.start,
        stop=backend.stop,
        agent_token=agent_token,
        max_waiting=settings.max_waiting,
        policy_store=ConfigMapPolicyStore(settings.namespace, lambda: backend.core),
        capacity=CapacitySettings(),
        tenancy=tenancy,
    )
    return create_app(runtime)


def run(settings: GatewaySettings) -> None:
    uvicorn.run(
        kube_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        http=guarded_protocol(TenantSettings()),  # header timeout, connections per address
    )
