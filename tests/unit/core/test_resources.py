from __future__ import annotations

from decimal import Decimal

import pytest

from sandfleet.core.resources import Resources, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250m", Decimal("0.25")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("256Mi", Decimal(256 * 2**20)),
        ("1Gi", Decimal(2**30)),
        ("1e3", Decimal(1000)),
        ("2k", Decimal(2000)),
        ("3M", Decimal(3_000_000)),
    ],
)
def test_parse_quantity(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("lots")


def test_fits_counts_the_scarcest_dimension() -> None:
    node = Resources.from_mapping({"cpu": "8", "memory": "32Gi", "pods": "64"})
    sandbox = Resources.from_mapping({"cpu": "250m", "memory": "1Gi"}, pods=1)
    assert node.fits(sandbox) == 32
    assert (node - Resources(8000, 0, 0)).fits(sandbox) == 0
    assert Resources(0, 0, 3).fits(Resources(pods=1)) == 3
