"""What we use of SGLang's ``HiCacheStorageConfig``, read once at attach into a frozen record.

sglang 0.5.23 declares every field read here (``sglang/srt/mem_cache/hicache_storage.py``), so they
are read with plain attribute access: a field a later SGLang renames or drops is a ``ConfigError``
at attach naming it, never a silent default. (``getattr(cfg, "should_split_heads", False)`` would
have stored pages whole, shared with no other TP size, without a word.) Everything in ``hicache/``
below the backend's constructor takes this record, not SGLang's object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class StorageRank:
    """One rank's storage config: its place in the deployment and how SGLang shares pages."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    dcp_rank: int  # decode context parallel (MLA only)
    dcp_size: int
    dp_rank: int  # with DP attention, tp_rank is local to the attention group
    is_mla_model: bool
    is_storage_writer: bool  # SGLang's own rule: MLA replicas share one writer per DCP shard
    tp_lcm_size: int  # 0 where not set
    should_split_heads: bool
    model_name: str
    enable_storage_metrics: bool
    extra_config: Mapping[str, Any] | None

    @classmethod
    def read(cls, cfg: Any) -> StorageRank:
        """The record of SGLang's ``cfg``.

        Raises:
            ConfigError: ``cfg`` lacks a field sglang 0.5.23's ``HiCacheStorageConfig`` has.
        """
        try:
            return cls(
                tp_rank=int(cfg.tp_rank), tp_size=int(cfg.tp_size), pp_rank=int(cfg.pp_rank),
                pp_size=int(cfg.pp_size), attn_cp_rank=int(cfg.attn_cp_rank),
                attn_cp_size=int(cfg.attn_cp_size), dcp_rank=int(cfg.dcp_rank), dcp_size=int(cfg.dcp_size),
                dp_rank=int(cfg.dp_rank), is_mla_model=bool(cfg.is_mla_model),
                is_storage_writer=bool(cfg.is_storage_writer), tp_lcm_size=int(cfg.tp_lcm_size or 0),
                should_split_heads=bool(cfg.should_split_heads), model_name=str(cfg.model_name or ""),
                enable_storage_metrics=bool(cfg.enable_storage_metrics), extra_config=cfg.extra_config)
        except AttributeError as e:
            raise ConfigError(f"SGLang's storage config has no field {e.name!r}: this backend reads the "
                              "fields of sglang 0.5.23's HiCacheStorageConfig", key=e.name,
                              source=type(cfg).__name__) from None
