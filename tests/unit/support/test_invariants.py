"""The fault suite's invariants on crafted lease histories: each check passes a clean one, fails a bad one."""

from __future__ import annotations

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.ledger import LedgerEntry, ledger_object
from tests.support.invariants import (
    Call,
    ClientLease,
    Loss,
    ObservedLease,
    PodTruth,
    Reservation,
    check_history,
    double_leases,
    leased_pods_deleted,
    leases_lost_while_alive,
    orphans,
    silent_losses,
    unrecorded_leases,
    warm_sandboxes,
    withdrawn_grants,
)


def ok(kind: str, at: float) -> Call:
    return Call(kind, at, at + 0.05, ok=True)


def released(at: float, answer: bool = True) -> Call:
    return Call("release", at, at + 0.05, ok=True, released=answer)


def error(
    kind: str, at: float, status: int | None, detail: str = "the sandbox is lost", took: float = 0.05
) -> Call:
    return Call(kind, at, at + took, ok=False, status=status, code="sandbox_lost", detail=detail)


def client(key: str, pod: str, start: float, *calls: Call, ttl: float = 10.0) -> ClientLease:
    return ClientLease(key, pod, start, start + ttl, list(calls))


def pod(
    name: str, *leases: tuple[str, float], released_at: float | None = None, gone: float | None = None
) -> PodTruth:
    return PodTruth(
        name, f"uid-{name}", "node-a", 0.0,
        [ObservedLease(key, "actor-0", at, at + 10.0) for key, at in leases],
        released_at=released_at, deleting_at=gone, deleted_at=gone,
    )  # fmt: skip


def clean_history() -> tuple[list[ClientLease], list[PodTruth]]:
    clients = [
        client("k1", "sb-1", 100.0, ok("exec", 100.1), ok("read", 100.2), released(100.3)),
        client("k2", "sb-2", 100.0, ok("exec", 100.1), released(100.4)),
        client("k3", "sb-3", 101.0, ok("exec", 101.1), released(101.2)),
    ]
    pods = [
        pod("sb-1", ("k1", 99.99), released_at=100.35, gone=101.0),
        pod("sb-2", ("k2", 99.99), released_at=100.45, gone=101.0),
        pod("sb-3", ("k3", 100.99), released_at=101.25, gone=102.0),
    ]
    return clients, pods


def test_a_clean_history_breaks_nothing() -> None:
    clients, pods = clean_history()
    assert check_history(clients, pods, [], now=200.0, reap_seconds=12.0) == []


def test_two_holders_of_one_pod_at_once_is_a_double_lease() -> None:
    clients = [
        client("k1", "sb-1", 100.0, ok("exec", 100.5), released(102.0)),
        client("k2", "sb-1", 101.0, ok("exec", 101.1), released(101.5)),
    ]
    (violation,) = double_leases([], clients)
    assert "sb-1" in violation
    assert "at once" in violation


def test_a_pod_carrying_two_leases_is_a_double_lease_even_one_after_the_other() -> None:
    violations = double_leases([pod("sb-1", ("k1", 100.0), ("k2", 105.0))], [])
    assert violations
    assert "2 leases" in violations[0]
    clients = [
        client("k1", "sb-1", 100.0, released(100.5)),
        client("k2", "sb-1", 101.0, released(101.5)),
    ]
    (violation,) = double_leases([], clients)
    assert "one after the other" in violation


def recycled(*episodes: tuple[int, str, float], reserved: tuple[tuple[int, str, float], ...]) -> PodTruth:
    """A recycling pool's Pod: leases (episode, run, acquired at), reservations (episode, run, since)."""
    truth = pod("sb-1")
    truth.leases = [ObservedLease(f"k{e}", "actor-0", at, at + 1.0, e, run) for e, run, at in episodes]
    truth.reservations = [Reservation(e, "actor-0", run, since) for e, run, since in reserved]
    return truth


def test_a_recycled_pod_serves_its_runs_episodes_one_after_another_after_each_reset() -> None:
    clean = recycled(
        (0, "r", 100.0), (1, "r", 102.0), (2, "r", 104.0), reserved=((1, "r", 101.5), (2, "r", 103.5))
    )
    clients = [client(f"k{e}", "sb-1", 100.0 + 2 * e, released(100.5 + 2 * e), ttl=1.0) for e in range(3)]
    for index, lease in enumerate(clients):
        lease.episode = index
    assert double_leases([clean], clients) == []


def test_a_pod_leased_again_unreset_for_another_run_or_before_its_reset_is_a_double_lease() -> None:
    unreset = recycled((0, "r", 100.0), (1, "r", 102.0), reserved=())
    assert "unreset" in double_leases([unreset], [])[0]
    other_run = recycled((0, "r", 100.0), (1, "other", 102.0), reserved=((1, "r", 101.5),))
    assert "went to actor-0/other" in double_leases([other_run], [])[0]
    too_soon = recycled((0, "r", 100.0), (1, "r", 101.0), reserved=((1, "r", 101.5),))
    assert "reset for actor-0/r at 101.500" in double_leases([too_soon], [])[0]
    twice = recycled((0, "r", 100.0), (1, "r", 102.0), (1, "r", 102.5), reserved=((1, "r", 101.5),))
    assert "2 leases in episode 1" in double_leases([twice], [])[0]
    # Two episodes held at once, as their clients saw them, is a double lease whatever the Pod says.
    still_held, next_one = client("k0", "sb-1", 100.0, ttl=5.0), client("k1", "sb-1", 102.0)
    next_one.episode = 1
    assert "at once" in double_leases([], [still_held, next_one])[0]


def test_an_idempotent_retry_handing_back_the_same_lease_is_no_double_lease() -> None:
    clients = [client("k1", "sb-1", 100.0, released(100.5)), client("k1", "sb-1", 100.2)]
    assert double_leases([pod("sb-1", ("k1", 99.9))], clients) == []


def test_a_grant_the_cluster_never_recorded_is_caught_unless_the_recorder_was_blind() -> None:
    clients = [client("k1", "sb-1", 100.0), client("k2", "sb-9", 100.0)]
    pods = [pod("sb-1", ("someone-else", 99.9))]
    violations = unrecorded_leases(clients, pods)
    assert len(violations) == 2
    assert "not the holder's" in violations[0]
    assert "never showed" in violations[1]
    assert unrecorded_leases([clients[1]], pods, gaps=[(99.5, 100.5)]) == []


def test_a_lease_error_while_the_sandbox_lived_is_a_lost_lease() -> None:
    lost = client("k1", "sb-1", 100.0, ok("exec", 100.1), error("exec", 101.0, 404, "no lease"))
    (violation,) = leases_lost_while_alive([lost], [])
    assert "though its sandbox lived" in violation
    assert leases_lost_while_alive([lost], [Loss("sb-1", 100.9, "agent killed")]) == []


def test_a_lease_error_after_the_ttl_is_no_lost_lease() -> None:
    expired = client("k1", "sb-1", 100.0, error("exec", 111.0, 410, "expired"), ttl=10.0)
    assert leases_lost_while_alive([expired], []) == []


def test_a_first_release_that_finds_the_lease_ended_means_someone_else_ended_it() -> None:
    taken = client("k1", "sb-1", 100.0, ok("exec", 100.1), released(100.5, answer=False))
    (violation,) = leases_lost_while_alive([taken], [])
    assert "already ended" in violation
    retried = client(
        "k1", "sb-1", 100.0, error("release", 100.5, None, "gateway died"), released(101.0, False)
    )
    assert leases_lost_while_alive([retried], []) == []


def test_a_lost_sandbox_must_be_a_clear_prompt_error_and_nothing_after_it_works() -> None:
    loss = Loss("sb-1", 100.0, "agent killed")
    told = client("k1", "sb-1", 99.0, ok("exec", 99.5), error("exec", 101.5, 502), released(101.7))
    assert silent_losses([told], [loss]) == []
    worked = client("k1", "sb-1", 99.0, ok("exec", 101.5))
    assert "still succeeded" in silent_losses([worked], [loss])[0]
    vague = client("k1", "sb-1", 99.0, error("exec", 101.5, 500, "internal"))
    assert "no clear error" in silent_losses([vague], [loss])[0]
    hung = client("k1", "sb-1", 99.0, error("exec", 101.5, 502, took=40.0))
    assert "waited 40.0s" in silent_losses([hung], [loss], hang_seconds=15.0)[0]
    unused = client("k1", "sb-1", 99.0, ok("exec", 99.5), released(99.8))
    assert silent_losses([unused], [loss]) == []


def test_a_leased_pod_deleted_under_its_holder_is_caught_unless_it_was_lost() -> None:
    deleted = pod("sb-1", ("k1", 100.0), gone=103.0)  # the lease runs to 110
    (violation,) = leased_pods_deleted([deleted], [])
    assert "while leased" in violation
    assert leased_pods_deleted([deleted], [Loss("sb-1", 102.9, "node deleted")]) == []
    assert leased_pods_deleted([pod("sb-2", ("k2", 100.0), released_at=101.0, gone=102.0)], []) == []


def withdrawn(name: str, key: str, at: float, taken: float, gone: float | None = None) -> PodTruth:
    """A Pod whose claim under `key` (made at `at`) a gateway took back at `taken`."""
    truth = pod(name, gone=gone)
    truth.leases = [ObservedLease(key, "actor-0", at, at + 10.0, withdrawn_at=taken)]
    return truth


def test_a_claim_taken_back_ends_there_so_the_pod_may_be_deleted_or_claimed_again() -> None:
    unclaimed = withdrawn("sb-1", "k1", 100.0, taken=101.0, gone=103.0)
    assert leased_pods_deleted([unclaimed], []) == []
    unclaimed.leases.append(ObservedLease("k2", "actor-0", 102.0, 112.0))
    assert double_leases([unclaimed], [client("k2", "sb-1", 102.0, released(103.0))]) == []
    assert withdrawn_grants([client("k2", "sb-1", 102.0, released(103.0))], [unclaimed]) == []


def test_a_claim_taken_back_from_a_holder_that_was_told_of_it_is_caught() -> None:
    told = client("k1", "sb-1", 100.2, ok("exec", 100.5))  # held to its TTL, 110.2
    (violation,) = withdrawn_grants([told], [withdrawn("sb-1", "k1", 100.0, taken=101.0)])
    assert "taken back" in violation
    # A retry under the same key that claimed the Pod again holds it: no violation.
    again = withdrawn("sb-1", "k1", 100.0, taken=101.0)
    again.leases.append(ObservedLease("k1", "actor-0", 101.5, 111.5))
    assert withdrawn_grants([told], [again]) == []
    # Taken back only after the holder released it: the release ended it first.
    assert (
        withdrawn_grants(
            [client("k1", "sb-1", 100.2, released(100.6))], [withdrawn("sb-1", "k1", 100.0, taken=101.0)]
        )
        == []
    )


def test_a_pod_outliving_its_lease_past_the_reap_time_is_an_orphan() -> None:
    late = pod("sb-1", ("k1", 100.0), released_at=101.0, gone=130.0)
    assert "deleted only 29.0s" in orphans([late], now=200.0, reap_seconds=12.0)[0]
    still = pod("sb-2", ("k2", 100.0))  # expires at 110, never reaped
    assert "still there" in orphans([still], now=200.0, reap_seconds=12.0)[0]
    stuck = PodTruth("sb-3", "u3", deleting_at=100.0)
    assert "terminating" in orphans([stuck], now=200.0, reap_seconds=12.0)[0]
    assert orphans([pod("sb-4", ("k4", 100.0), released_at=101.0, gone=105.0)], 200.0, 12.0) == []


def test_an_apiserver_outage_stops_the_reap_clock() -> None:
    during = pod("sb-1", ("k1", 100.0), released_at=101.0, gone=125.0)
    assert orphans([during], now=200.0, reap_seconds=12.0)
    assert orphans([during], now=200.0, reap_seconds=12.0, outages=[(100.5, 120.0)]) == []


def test_an_outage_soon_after_a_lease_ended_stops_its_reap_clock_for_as_long_as_it_lasts() -> None:
    # Seen in CI: released 0.3 s before the apiserver stopped for 23 s, reaped 1.8 s after it was back.
    just_before = pod("sb-1", ("k1", 100.0), released_at=101.0, gone=125.8)
    assert orphans([just_before], now=200.0, reap_seconds=12.0, outages=[(101.3, 124.3)]) == []
    late = pod("sb-2", ("k2", 100.0), released_at=101.0, gone=140.0)
    assert orphans([late], now=200.0, reap_seconds=12.0, outages=[(101.3, 124.3)])
    # An outage after the reap window had already run out excuses nothing.
    slow = pod("sb-3", ("k3", 100.0), released_at=101.0, gone=130.0)
    assert orphans([slow], now=200.0, reap_seconds=12.0, outages=[(115.0, 120.0)])


def test_warm_sandboxes_count_free_ready_pods_on_ready_nodes_per_region() -> None:
    def pod_object(
        name: str, state: str, ready: str, node: str, deleting: bool = False, shard: str | None = None
    ) -> dict[str, object]:
        labels = {
            "sandfleet.dev/pool": "p",
            "sandfleet.dev/lease-state": state,
            "sandfleet.dev/region": "us-east1",
        }
        if shard is not None:
            labels["sandfleet.dev/shard"] = shard
        metadata: dict[str, object] = {"name": name, "namespace": "ns", "labels": labels}
        if deleting:
            metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {
            "metadata": metadata,
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
        }

    pods = [
        pod_object("a", "free", "True", "n1"),
        pod_object("b", "leased", "True", "n1"),
        pod_object("c", "free", "False", "n1"),
        pod_object("d", "free", "True", "n2"),  # its node is NotReady
        pod_object("e", "free", "True", "n1", deleting=True),
        pod_object("f", "ledger", "True", "n1", shard="03"),  # no entry in its ledger: free
        pod_object("g", "ledger", "True", "n1", shard="03"),  # leased in its ledger
    ]
    held = LedgerEntry("leased", 1, lease=LeaseRecord("ns.g", "p", "alice", 1.0, 61.0, 60))
    ledgers = [
        {
            "metadata": {"namespace": "ns", "name": "sandfleet-ledger-03"},
            "spec": ledger_object("ns", "03", {"g": held})["spec"],
        }
    ]
    assert warm_sandboxes(pods, {"n1"}, ledgers) == {"us-east1": 2}
    assert warm_sandboxes(pods[:5], {"n1"}) == {"us-east1": 1}
