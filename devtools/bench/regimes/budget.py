"""How much KV a workload keeps, and the DRAM and disk each backend gets for it.

The working set is what a perfect storage tier would hold at the end of a run: every whole page
of every prompt and answer, counted once. SGLang stores whole pages only, and never the last token
of a sequence, so a sequence of ``n`` tokens leaves ``(n - 1) // page`` pages. A chat's turns are
prefixes of its last one; a document's questions share the document and nothing after it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mooncake_sgl.units import parse_size

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


def kv_bytes_per_token(config_json: Path) -> int:
    """KV bytes one token takes on one rank (TP 1) of the model whose ``config.json`` is given."""
    cfg = json.loads(Path(config_json).read_text())
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return int(cfg["num_hidden_layers"]) * 2 * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def stored_pages(tokens: int, page: int) -> int:
    """Whole pages SGLang can store of a sequence of ``tokens`` (never its last token)."""
    return max(0, tokens - 1) // page


def thread_pages(lengths: Sequence[int], page: int, shared: int | None) -> int:
    """Distinct pages of one thread's sequences (each a prompt with its answer), in turn order.

    ``shared=None``: each sequence extends the one before (a chat resending its history), so the
    last one holds every page. ``shared=n``: the sequences share their first ``n`` tokens and
    nothing after (questions over one document)."""
    if not lengths:
        return 0
    if shared is None:
        return stored_pages(max(lengths), page)
    common = shared // page
    return common + sum(max(0, stored_pages(n, page) - common) for n in lengths)


@dataclass(frozen=True)
class Budget:
    """What every backend gets in one regime: ``dram`` bytes of L3 memory, ``disk`` bytes of disk."""
    working_set: int
    page_bytes: int
    dram: int
    disk: int

    def describe(self) -> str:
        mib = 1 << 20
        return (f"working set {self.working_set / mib:.1f} MiB ({self.working_set // self.page_bytes} "
                f"pages of {self.page_bytes // 1024} KiB); L3 DRAM {self.dram / mib:.1f} MiB "
                f"({self.dram / self.working_set:.0%}), disk {self.disk / mib:.0f} MiB")


def budget(working_set_pages: int, page_bytes: int, dram_fraction: float, disk: str | int | None,
           disk_factor: float = 2.0) -> Budget:
    """DRAM of ``dram_fraction`` of the working set, in whole pages (one at least); disk ``disk``
    (a size), or ``disk_factor`` times the working set rounded up to a MiB, so that no backend's
    disk is what runs out."""
    if working_set_pages < 1 or page_bytes < 1 or dram_fraction <= 0:
        raise ValueError(f"budget: {working_set_pages} pages of {page_bytes} bytes at {dram_fraction}")
    ws = working_set_pages * page_bytes
    dram = max(1, int(working_set_pages * dram_fraction)) * page_bytes
    mib = 1 << 20
    disk_bytes = parse_size(disk) if disk is not None else -(-int(ws * disk_factor) // mib) * mib
    return Budget(working_set=ws, page_bytes=page_bytes, dram=dram, disk=disk_bytes)
