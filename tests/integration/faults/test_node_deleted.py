"""A node holding leased sandboxes is deleted: its holders get a clear error, the others go on.

The machine goes with the Node object (the loopback kubelet kills its agents); the operator
replaces the node's sandboxes at once (force-deleting them: no kubelet is left to confirm).
Bounded: about 20 s (the deletion, the holders told, the pool refilled elsewhere).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.integration.faults.conftest import Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster


def test_a_deleted_node_is_a_clear_error_for_its_holders_only(steady: Run) -> None:
    fleet = steady.fleet
    assert fleet.kubelet is not None
    held = steady.load.hold(4)
    wait_until(
        lambda: all(sum(c.ok for c in h.calls) >= 3 for h in held), 20, "the holders to use their sandboxes"
    )
    placed = fleet.kubelet.agent_pods()
    node, _ = Counter(placed[h.pod] for h in held).most_common(1)[0]
    victims = [h for h in held if placed[h.pod] == node]
    others = [h for h in held if placed[h.pod] != node]

    losses = fleet.kubelet.lose_node(node)
    fleet.cluster.kubectl("delete", "node", node, "--wait=false")
    wait_until(
        lambda: all(h.first_lease_error is not None for h in victims),
        20,
        "the holders on the node to be told",
        0.1,
    )
    for holder in victims:
        error = holder.first_lease_error
        assert error is not None
        assert error.clear_error, error
        assert error.ended - losses[0].at < 15, (
            f"{holder.pod}: told only after {error.ended - losses[0].at:.1f}s"
        )
    calls = {h.key: len(h.calls) for h in others}
    wait_until(
        lambda: all(len(h.calls) >= calls[h.key] + 3 for h in others), 20, "the other holders to go on"
    )
    assert all(h.first_lease_error is None for h in others), "a lease on another node was lost"
    steady.load.release_holders()
    # The operator clears what the node held at once (and replaces it), not after the pod GC's 40 s.
    wait_until(
        lambda: not [p for p in fleet.pods() if p["spec"].get("nodeName") == node],
        20,
        f"no Pod left on {node}",
    )
    steady.finish()
