"""A small HTTP client for a live SGLang server: streamed ``/generate`` with TTFT, ``/flush_cache``,
``/hicache/storage-backend/clear``, ``/health``. Standard library only (``http.client``), one
connection per request, so requests run in a thread pool without an event loop.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .workloads import BenchRequest


@dataclass
class RequestResult:
    rid: str
    round: int
    prompt_tokens: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    cached_tokens: int = 0
    device_tokens: int = 0
    host_tokens: int = 0
    storage_tokens: int = 0
    storage_backend: str = ""
    error: str = ""
    # The generated ids, from the last chunk (without --incremental-streaming-output, which the
    # benchmarks' servers never run with, each chunk carries every id so far).
    output_ids: list[int] = field(default_factory=list)
    # The server's own steps of this request (``STEPS``; SGLang sends them with ``--enable-metrics``).
    steps: dict[str, float] = field(default_factory=dict)


# meta_info keys of SGLang's per-request time stats: wall-clock stamps (received, forward entry,
# prefill finished) and durations in seconds (queued, of which waiting for the storage prefetch).
STEPS = ("request_received_ts", "forward_entry_time", "prefill_finished_time", "queue_time",
         "storage_prefetch_wait")


def parse_sse_lines(lines: Iterable[bytes]) -> Iterable[dict[str, Any]]:
    """The JSON objects of SGLang's ``text/event-stream`` (``data: {...}`` lines, then
    ``data: [DONE]``)."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        body = line[5:].strip()
        if body == b"[DONE]":
            return
        yield json.loads(body)


def apply_meta(result: RequestResult, meta: dict[str, Any]) -> None:
    """Fill token counts from a response's ``meta_info``. ``cached_tokens_details`` splits the
    cached prefix into device (L1), host (L2) and storage (L3) tokens; without it, all cached
    tokens count as device hits (what SGLang reports then)."""
    result.prompt_tokens = int(meta.get("prompt_tokens", result.prompt_tokens))
    result.output_tokens = int(meta.get("completion_tokens", result.output_tokens))
    result.cached_tokens = int(meta.get("cached_tokens", 0) or 0)
    details = meta.get("cached_tokens_details") or {}
    if details:
        result.device_tokens = int(details.get("device", 0))
        result.host_tokens = int(details.get("host", 0))
        result.storage_tokens = int(details.get("storage", 0))
        result.storage_backend = str(details.get("storage_backend", ""))
    else:
        result.device_tokens = result.cached_tokens
    result.steps = {k: float(meta[k]) for k in STEPS if isinstance(meta.get(k), (int, float))}


class SglangClient:
    def __init__(self, url: str, timeout_s: float = 600.0):
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"expected a URL like http://127.0.0.1:30000, got {url!r}")
        self.host = parsed.hostname
        self.port = parsed.port or 80
        self.timeout_s = timeout_s

    def _conn(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout_s)

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None
                 ) -> tuple[int, bytes]:
        conn = self._conn(timeout)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if payload else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            status, _ = self._request("GET", "/health", timeout=5.0)
        except OSError:
            return False
        return status == 200

    def wait_healthy(self, timeout_s: float, alive: Any = None) -> None:
        """Poll ``/health`` until it answers 200; ``alive()`` false (server exited) fails fast."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if alive is not None and not alive():
                raise RuntimeError("the server process exited before it became healthy; see its log")
            time.sleep(2.0)
        raise TimeoutError(f"server at {self.host}:{self.port} not healthy after {timeout_s:.0f}s")

    def flush_cache(self, attempts: int = 10) -> None:
        """Drop SGLang's device and host caches (our storage tiers keep their pages). SGLang refuses
        while requests are running, so retry briefly."""
        for _ in range(attempts):
            status, body = self._request("POST", "/flush_cache", timeout=60.0)
            if status == 200:
                return
            time.sleep(1.0)
        raise RuntimeError(f"/flush_cache failed {attempts} times: {status} {body[:200]!r}")

    def clear_storage(self) -> bool:
        """Empty the HiCache storage backend (our tiers), so a variant starts cold; ``False`` when
        the server has no storage backend."""
        status, _ = self._request("POST", "/hicache/storage-backend/clear", timeout=120.0)
        return status == 200

    def generate(self, req: BenchRequest) -> RequestResult:
        """One streamed request; TTFT is the arrival of the first chunk carrying output."""
        result = RequestResult(rid=req.rid, round=req.round, prompt_tokens=len(req.input_ids))
        body = {"input_ids": req.input_ids, "stream": True,
                "sampling_params": {"max_new_tokens": req.max_new_tokens, "temperature": 0.0,
                                    "ignore_eos": True}}
        conn = self._conn()
        start = time.perf_counter()
        try:
            conn.request("POST", "/generate", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
                return result
            meta: dict[str, Any] = {}
            for chunk in parse_sse_lines(resp):
                if not result.ttft_s:
                    result.ttft_s = time.perf_counter() - start
                meta = chunk.get("meta_info", meta)
                if isinstance(chunk.get("output_ids"), list):  # every id so far (SGLang's default)
                    result.output_ids = chunk["output_ids"]
            result.latency_s = time.perf_counter() - start
            apply_meta(result, meta)
        except (OSError, ValueError, http.client.HTTPException) as e:
            result.error = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        return result
