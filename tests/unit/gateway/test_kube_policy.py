"""Run names of any shape map to stable, valid ConfigMap names."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.gateway.kube_policy import configmap_name

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@given(st.text(min_size=1, max_size=300))
def test_configmap_names_are_valid_and_stable(run: str) -> None:
    name = configmap_name(run)
    assert DNS_SUBDOMAIN.match(name)
    assert len(name) <= 253
    assert configmap_name(run) == name


def test_different_runs_get_different_names() -> None:
    assert configmap_name("r1") != configmap_name("R1")
