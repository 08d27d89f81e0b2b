"""Clusters of network namespaces need root; elsewhere these tests say why they cannot run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.testing.cluster import Cluster, unavailable_reason

REASON = unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")


@pytest.fixture
def cluster2(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(2, tmp_path / "cluster") as c:
        yield c
