"""CPU end-to-end: our backend driven by SGLang's real HiCache machinery on a machine with no GPU.

- ``workload`` long documents with many questions as token ids; deterministic page bytes.
- ``rig``      SGLang's real device/host KV pools and ``HiCacheController`` with our backend attached.
- ``driver``   the radix-cache side of the loop (needs CUDA in SGLang, so played here) and the report.
- ``report``   the report as text.

Entry point: ``scripts/run_e2e_cpu.py``. sglang is imported when a run starts, not here.
"""

from .driver import DEFAULT_PREFILL_TOKENS_PER_S, E2EConfig, run_e2e
from .report import format_report
from .workload import KvShape, WorkloadSpec

__all__ = ["DEFAULT_PREFILL_TOKENS_PER_S", "E2EConfig", "KvShape", "WorkloadSpec", "format_report", "run_e2e"]
