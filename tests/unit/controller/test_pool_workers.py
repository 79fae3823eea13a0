"""The running operator takes its knobs from OperatorSettings and its fleet key beside them."""

from __future__ import annotations

import asyncio
from typing import Any

from sandfleet.controller.pool_workers import LEADER_LEASE, Operator
from sandfleet.controller.settings import OperatorSettings


def operator(settings: OperatorSettings, agent_key: bytes | None = None) -> Operator:
    async def build() -> Operator:  # its semaphores and events belong to a running loop
        kube: Any = object()  # nothing is called before start()
        return Operator(kube, "replica-1", settings, agent_key)

    return asyncio.run(build())


def test_the_leader_lease_is_where_and_as_long_as_the_settings_say() -> None:
    lease = operator(OperatorSettings(namespaces=("rl", "eval"), leader_lease_seconds=6)).elector.lease
    assert lease.path == "/apis/coordination.k8s.io/v1/namespaces/rl/leases"
    assert (lease.name, lease.lease_seconds, lease.renew_seconds) == (LEADER_LEASE, 6.0, 2.0)


def test_the_pod_namespace_holds_the_leader_lease_when_set() -> None:
    settings = OperatorSettings(namespaces=("rl",), leader_namespace="sandfleet")
    assert operator(settings).elector.lease.path.endswith("/namespaces/sandfleet/leases")


def test_the_fleet_key_is_handed_over_beside_the_settings() -> None:
    key = b"k" * 32
    running = operator(OperatorSettings(), key)
    assert running.agent_key == key
    assert "agent_key" not in OperatorSettings.model_fields  # the file's name is a setting, its bytes not
