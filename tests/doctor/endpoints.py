"""Stand-in SGLang endpoints for ``doctor`` and ``stats``: real HTTP servers on 127.0.0.1, each
serving what a test gives it per path (SGLang's own 404 for any other path, ``//metrics`` too)."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mooncake_sgl.doctor.cli import main as doctor_main

RANK = 'tp_rank="0",pp_rank="0",dp_rank="0"'
# A healthy server's page: SGLang's series and ours, so no rule speaks.
HEALTHY_PAGE = ("# TYPE sglang:realtime_tokens_total counter\n"
                'sglang:realtime_tokens_total{mode="prefill_compute"} 100\n'
                f'mooncake_sgl_tier_hits_total{{tier="host",{RANK}}} 5\n')
SERVER_INFO = {"page_size": 64, "enable_metrics": True, "hicache_storage_backend": "mooncake"}


def prefill(input_tokens: int, lookup_pages: int) -> str:
    """Series for ``below_threshold``: ``input_tokens`` computed, ``lookup_pages`` asked of storage."""
    return (f'sglang:prefill_effective_tokens_total{{mode="input"}} {input_tokens}\n'
            'sglang:prefill_effective_tokens_total{mode="device_hit"} 0\n'
            'sglang:prefill_effective_tokens_total{mode="host_hit"} 0\n'
            f"mooncake_sgl_lookup_pages_total{{{RANK}}} {lookup_pages}\n")


def namespace_info(page_size: str, shared: str) -> str:
    labels = (f'role="colocated",model="m",weights="w",dtype="bf16",layout="page_first",'
              f'page_size="{page_size}",key_tp="1",pp_size="1",cp_size="1",tag="",shared="{shared}",'
              f"{RANK}")
    return f"mooncake_sgl_namespace_info{{{labels}}} 1\n"


# What one path answers: a body (a page, or JSON for a mapping), or a function that writes the
# body itself to the socket's file (a stream without a length, say).
Answer = str | Mapping[str, Any] | Callable[[Any], None]


@dataclass(frozen=True)
class Route:
    answer: Answer
    content_type: str = "text/plain; version=0.0.4"
    delay_s: float = 0.0  # before the headers


@contextlib.contextmanager
def endpoint(routes: Mapping[str, Answer | Route]) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server answering ``routes`` (path -> answer)."""
    table = {path: r if isinstance(r, Route) else Route(r, "application/json" if isinstance(r, Mapping)
                                                           else "text/plain; version=0.0.4")
             for path, r in routes.items()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            # The path as sent: http.server turns a leading "//" into "/" (``self.path``); SGLang
            # does not, and answers //metrics with 404.
            route = table.get(self.requestline.split(" ")[1])
            if route is None:
                self.send_error(404)
                return
            time.sleep(route.delay_s)
            with contextlib.suppress(OSError):  # the reader may have given up (its deadline, a cap)
                self.send_response(200)
                self.send_header("Content-Type", route.content_type)
                if callable(route.answer):
                    self.end_headers()  # no length: the body ends when the connection does
                    route.answer(self.wfile)
                    return
                body = (json.dumps(route.answer) if isinstance(route.answer, Mapping)
                        else route.answer).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def healthy(**info: Any) -> contextlib.AbstractContextManager[str]:
    return endpoint({"/metrics": HEALTHY_PAGE, "/get_server_info": {**SERVER_INFO, **info}})


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    """``mooncake-sgl doctor ARGS --json`` in this process: exit status and its document."""
    out = io.StringIO()
    rc = doctor_main([*args, "--json"], out=out)
    return rc, json.loads(out.getvalue())


def findings_of(doc: Mapping[str, Any], url: str) -> list[dict[str, Any]]:
    name = url.split("://", 1)[-1].rstrip("/")
    return [f for f in doc["findings"] if f["server"] == name]
