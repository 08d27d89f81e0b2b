"""``mooncake-sgl doctor`` against endpoints that are not the SGLang it expects: each URL is its
own finding, bounded in time and size, and never an exception that takes the other URLs' reports
with it. Every endpoint is a real HTTP server on 127.0.0.1 (``endpoints.py``)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from mooncake_sgl.doctor.evidence import MAX_METRICS_BYTES, MAX_SAMPLES

from .endpoints import (
    HEALTHY_PAGE,
    RANK,
    SERVER_INFO,
    Route,
    doctor,
    endpoint,
    findings_of,
    healthy,
    namespace_info,
    prefill,
)

SIGN_IN = ("<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
           '<body><form action="/login"><input name="user"></form></body></html>\n')


def codes(doc: dict[str, Any], url: str) -> set[str]:
    return {f["code"] for f in findings_of(doc, url)}


def evidence(doc: dict[str, Any], url: str, code: str) -> str:
    return " | ".join(e for f in findings_of(doc, url) if f["code"] == code for e in f["evidence"])


def test_a_sign_in_page_at_metrics_is_that_urls_finding_and_the_other_report_still_comes_out() -> None:
    with endpoint({"/metrics": Route(SIGN_IN, "text/html")}) as html, healthy() as good:
        rc, doc = doctor(html, good, "--window", "0")
    assert rc == 1 and doc["servers"] == [html.split("://")[1], good.split("://")[1]]
    assert codes(doc, html) == {"unreadable"}
    assert "not Prometheus text" in evidence(doc, html, "unreadable"), doc
    assert codes(doc, good) == set(), doc


def test_a_page_size_that_is_not_a_whole_number_is_named_and_no_rule_trips_on_it() -> None:
    page = HEALTHY_PAGE + prefill(8000, 0)  # enough uncomputed traffic for below_threshold to look
    with endpoint({"/metrics": page, "/get_server_info": {**SERVER_INFO, "page_size": "64 tokens"}}) as odd, \
            healthy() as good:
        rc, doc = doctor(odd, good, "--window", "0")
    assert rc == 1 and codes(doc, odd) == {"odd_answers"}, doc
    assert "page_size='64 tokens'" in evidence(doc, odd, "odd_answers")
    assert codes(doc, good) == set()


def _curve(size: str, lookups: float, hits: float, capacity: float) -> str:
    labels = f'tier="host",size="{size}",{RANK}'
    return (f"mooncake_sgl_tier_curve_lookup_pages_total{{{labels}}} {lookups}\n"
            f"mooncake_sgl_tier_curve_hit_pages_total{{{labels}}} {hits}\n"
            f"mooncake_sgl_tier_curve_capacity_bytes{{{labels}}} {capacity}\n")


CURVE_WITH_AN_ODD_SIZE = (HEALTHY_PAGE + _curve("1x", 5000, 2000, 1 << 30) + _curve("2x", 5000, 3000, 1 << 31)
                          + _curve("big", 5000, 4000, 1 << 32))


def test_a_curve_point_with_an_odd_size_is_left_out_and_named_and_the_rest_of_the_curve_read() -> None:
    with endpoint({"/metrics": CURVE_WITH_AN_ODD_SIZE, "/get_server_info": SERVER_INFO}) as odd:
        rc, doc = doctor(odd, "--window", "0")
    assert rc == 1 and codes(doc, odd) == {"odd_answers", "tier_too_small"}, doc
    assert "size='big'" in evidence(doc, odd, "odd_answers")


def test_an_odd_page_size_label_on_a_namespace_series_is_named_and_the_others_still_compared() -> None:
    shared = "pool:10.0.0.1:7480"
    pages = [HEALTHY_PAGE + namespace_info(size, shared) for size in ("64", "32", "sixty-four")]
    with endpoint({"/metrics": pages[0], "/get_server_info": SERVER_INFO}) as a, \
            endpoint({"/metrics": pages[1], "/get_server_info": SERVER_INFO}) as b, \
            endpoint({"/metrics": pages[2], "/get_server_info": SERVER_INFO}) as odd:
        rc, doc = doctor(a, b, odd, "--window", "0")
    assert rc == 1 and codes(doc, odd) == {"odd_answers"}, doc
    assert "page_size='sixty-four'" in evidence(doc, odd, "odd_answers")
    [split] = [f for f in doc["findings"] if f["code"] == "namespace_mismatch"]
    assert "page size 64" in split["says"] and "32" in split["says"] and "sixty" not in split["says"]


def test_an_extra_config_file_is_never_opened_here_and_the_default_it_assumed_is_said(
        tmp_path: Path) -> None:
    # A file of this path exists on this host too: it is not the server's, and must not be read.
    here = tmp_path / "tiers.yaml"
    here.write_text("prefetch_threshold: 64\n")
    info = {**SERVER_INFO, "hicache_storage_backend_extra_config": f"@{here}"}
    with endpoint({"/metrics": HEALTHY_PAGE + prefill(8000, 0), "/get_server_info": info}) as server:
        rc, doc = doctor(server, "--window", "0")
    [f] = [f for f in findings_of(doc, server) if f["code"] == "below_threshold"]
    assert f["evidence"][0].startswith("prefetch_threshold=256 (assumed SGLang's default: its extra "
                                       f"config is the file '{here}' on that server"), f
    assert "(256 tokens)" in f["says"]


def test_an_extra_config_at_dev_stdin_does_not_hang_the_doctor() -> None:
    # The doctor as its own process, its stdin a pipe nobody writes or closes: opening the server's
    # @/dev/stdin here waited for ever.
    info = {**SERVER_INFO, "hicache_storage_backend_extra_config": "@/dev/stdin"}
    with endpoint({"/metrics": HEALTHY_PAGE + prefill(8000, 0), "/get_server_info": info}) as server, \
            healthy() as good, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mooncake_sgl.cli", "doctor", server, good,
                                 "--window", "0", "--timeout", "5"],
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("doctor still running after 30 s with --timeout 5") from None
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
        out.seek(0)
        text = out.read()
    assert rc == 1, text
    assert "its extra config is the file '/dev/stdin' on that server, which the doctor does not open" \
        in text, text


@pytest.mark.parametrize("form", ["{}/", "{}//", "{}//metrics"])
def test_a_trailing_slash_on_a_healthy_servers_url_reads_it(form: str) -> None:
    # SGLang answers //metrics with 404: the URL must be normalised, not joined as given.
    with healthy() as good:
        rc, doc = doctor(form.format(good), "--window", "0")
    assert rc == 0 and doc["findings"] == [], doc
    assert doc["servers"] == [good.split("://")[1]]


def test_a_timeout_or_window_that_is_not_a_finite_number_of_seconds_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    for flag, value in [("--timeout", "inf"), ("--timeout", "nan"), ("--timeout", "-1"),
                        ("--timeout", "1e308"), ("--window", "inf"), ("--window", "nan"),
                        ("--window", "-1")]:
        with pytest.raises(SystemExit) as e:
            doctor("127.0.0.1:9", flag, value)
        assert e.value.code == 2, (flag, value)
        assert f"{flag} needs a number of seconds" in capsys.readouterr().err, (flag, value)


def _stream(total: int) -> Any:
    line = b'sglang:some_total{tp_rank="0",model_name="m",le="0.5"} 1\n'

    def write(out: Any) -> None:
        sent = 0
        while sent < total:
            out.write(line * 4096)
            sent += len(line) * 4096
    return write


def test_a_page_past_the_doctors_body_cap_is_refused_at_the_cap_naming_it() -> None:
    # 16 MiB is within the 64 MiB that `stats` takes; a real SGLang page is well under 1 MiB.
    with endpoint({"/metrics": _stream(16 << 20)}) as big, healthy() as good:
        t = time.monotonic()
        rc, doc = doctor(big, good, "--window", "0", "--timeout", "30")
        took = time.monotonic() - t
    assert rc == 1 and codes(doc, big) == {"unreadable"}, doc
    assert f"its body passed {MAX_METRICS_BYTES} bytes" in evidence(doc, big, "unreadable"), doc
    assert codes(doc, good) == set()
    assert took < 10, f"took {took:.1f} s"


def test_a_page_with_more_samples_than_the_bound_is_refused_naming_the_bound() -> None:
    page = "# a page of tiny samples: small in bytes, costly to parse\n" + "a 1\n" * (MAX_SAMPLES + 10)
    with endpoint({"/metrics": page}) as many:
        rc, doc = doctor(many, "--window", "0")
    assert rc == 1 and codes(doc, many) == {"unreadable"}, doc
    assert f"more than {MAX_SAMPLES} samples" in evidence(doc, many, "unreadable")


def test_all_reads_of_one_server_share_the_timeout() -> None:
    # Each answer comes after 1.5 s, within a 2 s timeout per read: read by read, the doctor took
    # 1.5 s for /metrics, 1.5 s for /get_server_info, the window, and 1.5 s again.
    slow = {path: Route(answer, delay_s=1.5) for path, answer in
            (("/metrics", HEALTHY_PAGE), ("/get_server_info", SERVER_INFO))}
    with endpoint(slow) as server:
        t = time.monotonic()
        rc, doc = doctor(server, "--timeout", "2", "--window", "1")
        took = time.monotonic() - t
    assert took < 2 + 1 + 0.8, f"took {took:.1f} s with --timeout 2 --window 1"
    assert rc == 1 and "within 2 s" in evidence(doc, server, "unreadable"), doc


def test_every_hostile_endpoint_at_once_is_its_own_finding_and_the_healthy_one_is_unharmed() -> None:
    shared = "pool:10.0.0.1:7480"
    deep = Route("[" * 100_000, "application/json")  # deeper than json.loads goes: RecursionError
    with endpoint({"/metrics": Route(SIGN_IN, "text/html")}) as html, \
            endpoint({"/metrics": HEALTHY_PAGE, "/get_server_info": {"page_size": 1.5}}) as page_size, \
            endpoint({"/metrics": CURVE_WITH_AN_ODD_SIZE}) as curve, \
            endpoint({"/metrics": HEALTHY_PAGE + namespace_info("x", shared)}) as namespace, \
            endpoint({"/metrics": HEALTHY_PAGE, "/get_server_info": deep}) as nested, \
            healthy() as good:
        hostile = [html, page_size, curve, namespace, nested, "http://[::1"]
        rc, doc = doctor(*hostile, good + "/", "--window", "0")
    assert rc == 1 and len(doc["servers"]) == 7, doc
    for url in hostile:
        assert findings_of(doc, url), (url, doc)
    assert "/get_server_info is not JSON (RecursionError)" in evidence(doc, nested, "arguments_unread")
    assert codes(doc, good) == set(), doc
