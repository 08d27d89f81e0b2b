"""Each tier's ``stats()`` report flattens into the one namespace of its JSON entry: every field
once, in declaration order, with no two nested shapes sharing a name."""

from __future__ import annotations

import dataclasses
import itertools
import typing
from typing import Any

import pytest

from mooncake_sgl.api import TierReport, TierReportError
from mooncake_sgl.tiers.hbm import HbmTierReport
from mooncake_sgl.tiers.host import HostTierReport
from mooncake_sgl.tiers.mooncake_store import MooncakeStoreTierReport
from mooncake_sgl.tiers.pool import PoolTierReport
from mooncake_sgl.tiers.ssd.tier import SsdTierReport

REPORTS = [HostTierReport, HbmTierReport, PoolTierReport, MooncakeStoreTierReport, SsdTierReport]


def build(shape: type, numbers: itertools.count) -> tuple[Any, list[str]]:
    """``shape`` with a different number in every leaf field, and the leaf names in order."""
    hints = typing.get_type_hints(shape)
    values: dict[str, Any] = {}
    leaves: list[str] = []
    for f in dataclasses.fields(shape):
        if dataclasses.is_dataclass(hints[f.name]):
            values[f.name], names = build(hints[f.name], numbers)
            leaves += names
        else:
            values[f.name] = next(numbers)
            leaves.append(f.name)
    return shape(**values), leaves


@pytest.mark.parametrize("shape", REPORTS, ids=lambda s: s.__name__)
def test_a_report_flattens_every_field_once_in_order(shape: type[TierReport]) -> None:
    report, leaves = build(shape, itertools.count(1))
    flat = report.as_dict()
    assert list(flat) == leaves  # a name shared by two nested shapes would be lost here
    assert sorted(flat.values()) == list(range(1, len(leaves) + 1))


def test_a_failed_report_is_its_error() -> None:
    assert TierReportError("gone").as_dict() == {"error": "gone"}
    assert TierReport().as_dict() == {}
