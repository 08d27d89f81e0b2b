"""``mooncake-sgl stats URL`` on pages no exporter of ours writes, and on URLs as people type them:
it shows what it can read and never crashes. Real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import io
import json

import pytest

from mooncake_sgl.metrics.cli import main
from tests.doctor.endpoints import HEALTHY_PAGE, RANK, endpoint


def stats(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


def curve_point(size: str, lookups: float, hits: float) -> str:
    labels = f'tier="host",size="{size}",{RANK}'
    return (f"mooncake_sgl_tier_curve_lookup_pages_total{{{labels}}} {lookups}\n"
            f"mooncake_sgl_tier_curve_hit_pages_total{{{labels}}} {hits}\n"
            f"mooncake_sgl_tier_curve_capacity_bytes{{{labels}}} {1 << 30}\n")


@pytest.mark.parametrize("size", ["big", "nanx", "infx", "-1x", "0x", "2"])
def test_a_curve_point_whose_size_is_not_a_multiplier_is_left_out_of_the_curve(size: str) -> None:
    page = HEALTHY_PAGE + curve_point("1x", 100, 40) + curve_point(size, 100, 90)
    with endpoint({"/metrics": page}) as url:
        rc, text = stats(url)
        assert rc == 0 and "capacity curves" in text, text
        rc, raw = stats(url, "--json")
    assert rc == 0
    [point] = json.loads(raw)["curves"]["host"]
    assert point["multiplier"] == 1.0 and point["hit_ratio"] == pytest.approx(0.4)


@pytest.mark.parametrize("form", ["{}/", "{}//"])
def test_a_url_with_a_trailing_slash_reads_its_metrics(form: str) -> None:
    with endpoint({"/metrics": HEALTHY_PAGE}) as url:
        rc, text = stats(form.format(url))
    assert rc == 0 and text.splitlines()[1].split()[0] == "tier", text
