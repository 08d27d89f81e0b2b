"""Starting an SGLang server for a benchmark variant, and the variants themselves.

A *variant* is one server configuration of a side-by-side run:

- ``no-hicache``          plain SGLang (device radix cache only);
- ``hicache-l2``          ``--enable-hierarchical-cache`` (device + host pool, no storage);
- ``ours:PATH.yaml``      HiCache with our backend (``--hicache-storage-backend mooncake``) over the
                          tier set in PATH (``--hicache-storage-backend-extra-config @PATH``).

``small_llama_config`` writes a local model directory (``config.json`` only) so a server can start
with ``--load-format dummy --skip-tokenizer-init``: random weights, token-id prompts, no download.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .client import SglangClient


@dataclass(frozen=True)
class Variant:
    label: str
    args: tuple[str, ...]


def parse_variant(spec: str) -> Variant:
    """``no-hicache`` | ``hicache-l2`` | ``ours:PATH`` | ``LABEL=<one of those>``."""
    label, _, body = spec.partition("=") if "=" in spec else ("", "", spec)
    if body == "no-hicache":
        return Variant(label or body, ())
    if body == "hicache-l2":
        return Variant(label or body, ("--enable-hierarchical-cache",))
    if body.startswith("ours:"):
        path = Path(body[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"variant {spec!r}: tier config {path} does not exist")
        return Variant(label or f"ours:{path.stem}", (
            "--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake",
            "--hicache-storage-backend-extra-config", f"@{path.resolve()}"))
    raise ValueError(f"unknown variant {spec!r}: use no-hicache, hicache-l2 or ours:TIERS.yaml "
                     "(optionally LABEL=...)")


def small_llama_config(directory: Path, *, layers: int = 4, hidden: int = 1024, heads: int = 16,
                       kv_heads: int = 4, vocab: int = 32000, context: int = 135168) -> Path:
    """A Llama-architecture ``config.json`` for dummy weights (GQA like Llama-3). The context fits
    the longest default document (128k tokens) plus a question and an answer, and no more: SGLang
    sizes its request-to-token table by it."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": hidden * 4, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "vocab_size": vocab,
        "max_position_embeddings": context, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(model_path: str, port: int, variant: Variant, *, dummy: bool,
                   extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init"]
    if dummy:
        cmd += ["--load-format", "dummy"]
    return cmd + list(variant.args) + list(extra)


class LaunchedServer:
    """``python -m sglang.launch_server`` in its own process group; waits for ``/health``;
    stops the whole group (scheduler and detokenizer children included) on exit."""

    def __init__(self, cmd: list[str], port: int, log_path: Path, health_timeout_s: float = 900.0):
        self.cmd = cmd
        self.port = port
        self.log_path = log_path
        self.health_timeout_s = health_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LaunchedServer:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=dict(os.environ))
        try:
            SglangClient(self.url).wait_healthy(self.health_timeout_s, alive=lambda: self.proc.poll() is None)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
