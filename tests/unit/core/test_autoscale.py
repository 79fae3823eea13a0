from __future__ import annotations

from sandfleet.core.autoscale import AutoscaleState, desired_replicas, lease_rate, littles_law_target
from sandfleet.core.model import AutoscalingSpec

SPEC = AutoscalingSpec(
    enabled=True, min_replicas=2, max_replicas=50, headroom=0.2, scale_down_delay_seconds=300
)


def test_littles_law() -> None:
    assert littles_law_target(rate=10.0, spinup_seconds=2.0, headroom=0.0) == 20
    assert littles_law_target(rate=10.0, spinup_seconds=2.0, headroom=0.2) == 24
    assert lease_rate([1.0, 50.0, 59.0, 200.0], now=60.0) == 3 / 60


def test_target_follows_demand_within_bounds() -> None:
    busy = [1000.0 - i * 0.1 for i in range(600)]  # 10 leases/s over the last minute
    target, _ = desired_replicas(SPEC, busy, 2.0, AutoscaleState(), now=1000.0)
    assert target == 24
    idle, _ = desired_replicas(SPEC, [], 2.0, AutoscaleState(), now=1000.0)
    assert idle == 2
    flood, _ = desired_replicas(SPEC, busy * 10, 2.0, AutoscaleState(), now=1000.0)
    assert flood == 50


def test_scale_down_waits_for_the_cool_down() -> None:
    busy = [1000.0 - i * 0.1 for i in range(600)]
    _, state = desired_replicas(SPEC, busy, 2.0, AutoscaleState(), now=1000.0)
    soon, state = desired_replicas(SPEC, [], 2.0, state, now=1100.0)
    assert soon == 24
    late, state = desired_replicas(SPEC, [], 2.0, state, now=1301.0)
    assert late == 2
    assert len(state.recommendations) == 1


def test_scale_up_is_immediate() -> None:
    _, state = desired_replicas(SPEC, [], 2.0, AutoscaleState(), now=1000.0)
    busy = [1010.0 - i * 0.1 for i in range(600)]
    up, _ = desired_replicas(SPEC, busy, 2.0, state, now=1010.0)
    assert up == 24
