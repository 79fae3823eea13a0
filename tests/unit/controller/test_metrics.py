"""The operator's /metrics: every series of the wrapped registry carries the operator's cluster."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sandfleet.controller.metrics import ClusterLabelled, cluster_registry


def source() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("sandfleet_sandboxes", "Sandboxes.", ["pool", "state"], registry=registry).labels(
        "python", "warm"
    ).set(3)
    Counter("sandfleet_operator_reconciles_total", "Passes.", ["result"], registry=registry).labels("ok").inc(
        2
    )
    Histogram(
        "sandfleet_operator_reconcile_duration_seconds", "Time.", buckets=(1,), registry=registry
    ).observe(0.5)
    Gauge("sandfleet_operator_leader", "Leads.", registry=registry).set(1)
    return registry


def test_every_sample_gets_the_cluster_label_and_keeps_its_own() -> None:
    families = list(ClusterLabelled(source(), "eu1").collect())
    assert {f.name for f in families} == {
        "sandfleet_sandboxes",
        "sandfleet_operator_reconciles",
        "sandfleet_operator_reconcile_duration_seconds",
        "sandfleet_operator_leader",
    }
    samples = [s for f in families for s in f.samples]
    assert samples
    assert all(s.labels["cluster"] == "eu1" for s in samples)
    by_name = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    assert by_name[("sandfleet_sandboxes", (("cluster", "eu1"), ("pool", "python"), ("state", "warm")))] == 3
    assert by_name[("sandfleet_operator_reconciles_total", (("cluster", "eu1"), ("result", "ok")))] == 2
    assert (
        by_name[("sandfleet_operator_reconcile_duration_seconds_bucket", (("cluster", "eu1"), ("le", "1.0")))]
        == 1
    )
    assert by_name[("sandfleet_operator_leader", (("cluster", "eu1"),))] == 1


def test_families_keep_their_type_help_and_unit() -> None:
    original = {f.name: f for f in source().collect()}
    for family in ClusterLabelled(source(), "eu1").collect():
        before = original[family.name]
        assert (family.type, family.documentation, family.unit) == (
            before.type,
            before.documentation,
            before.unit,
        )
        assert len(family.samples) == len(before.samples)


def test_the_operator_name_wins_over_a_cluster_label_already_there() -> None:
    registry = CollectorRegistry()
    Gauge("g", "A gauge.", ["cluster"], registry=registry).labels("elsewhere").set(1)
    ((sample,),) = [f.samples for f in ClusterLabelled(registry, "eu1").collect()]
    assert sample.labels == {"cluster": "eu1"}


def test_the_served_registry_is_valid_exposition_with_the_label() -> None:
    text = generate_latest(cluster_registry("us2", source())).decode()
    assert 'sandfleet_sandboxes{cluster="us2",pool="python",state="warm"} 3.0' in text
    parsed = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert parsed
    assert all(s.labels.get("cluster") == "us2" for s in parsed)


def test_it_reads_the_source_at_each_scrape() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("sandfleet_operator_leader", "Leads.", registry=registry)
    served = cluster_registry("eu1", registry)
    gauge.set(1)
    assert 'sandfleet_operator_leader{cluster="eu1"} 1.0' in generate_latest(served).decode()
    gauge.set(0)
    assert 'sandfleet_operator_leader{cluster="eu1"} 0.0' in generate_latest(served).decode()
