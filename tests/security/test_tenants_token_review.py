"""Kubernetes auth: unknown tokens are refused, and a flood of them cannot grow the TokenReview cache.

Against a real gateway process reviewing tokens with the real local kube-apiserver.
"""

from __future__ import annotations

import re
import secrets

import pytest

from tests.integration.gateway.conftest import GatewayFactory, start_gateway
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster
__all__ = ["start_gateway"]

CACHE_SIZE = 20


def cache_entries(metrics: str) -> float:
    found = re.search(r"^sandfleet_gateway_token_cache_entries (\S+)$", metrics, re.MULTILINE)
    assert found, "the gateway does not report sandfleet_gateway_token_cache_entries"
    return float(found.group(1))


def test_unknown_tokens_are_refused_and_never_grow_the_review_cache_past_its_bound(
    start_gateway: GatewayFactory, kube: Kubectl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFLEET_GATEWAY_TOKEN_CACHE_SIZE", str(CACHE_SIZE))
    kube("create", "serviceaccount", "learner")
    good = kube("create", "token", "learner", "--duration=10m").strip()
    gateway = start_gateway(auth="kubernetes")
    for _ in range(10 * CACHE_SIZE):
        with gateway.client(token=secrets.token_urlsafe(24)) as stranger:
            refused = stranger.get("/v1/pools")
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"] == "unauthenticated"
    with gateway.client(token=good) as learner:
        assert learner.get("/v1/pools").status_code == 200
        entries = cache_entries(learner.get("/metrics").text)
    assert 0 < entries <= CACHE_SIZE
