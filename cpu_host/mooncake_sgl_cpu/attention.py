"""The extend step of SGLang's ``torch_native`` attention backend, for new tokens only.

sglang 0.5.23's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` (the only attention backend a
CPU server without ``sgl_kernel`` can run) gives each sequence a query of its *whole* length,
prefix included (``per_req_query_redudant``, uninitialised rows for the cached tokens), runs a
causal ``scaled_dot_product_attention`` over all of it and keeps the rows of the new tokens. A
cached prefix therefore saves the projections and MLPs of its tokens but none of the attention,
which is quadratic in the whole length: a 12k-token prompt with 12,288 tokens from storage and 128
new ones cost as much attention as computing it cold, and a short hit batched with it waited for
that too (6,890-token hits took 8.1 s against 4.6 s to recompute them).

``sdpa_forward_extend`` computes the same rows from the new tokens' queries alone, against every
key of the sequence, with the causal (and sliding-window) mask offset by the prefix length: work
proportional to new tokens times sequence length. Each output row is the same softmax over the same
keys. torch's CPU kernel splits queries into blocks whose size follows the query length, and a row
in a block of one to three rows can round differently in its last bit; so rows are bit-identical to
SGLang's when neither call leaves such a block (e.g. 64 new tokens of 2,048), and within a rounding
step otherwise (the unit tests show both). A sequence without a prefix and without a window takes
SGLang's exact call (``is_causal``), so cold prefills are unchanged; encoder-decoder batches
(``encoder_lens``) go to SGLang's implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

# The parameters of sglang 0.5.23's method, in order; another list means another contract.
EXTEND_PARAMETERS = (
    "self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
    "extend_prefix_lens", "extend_seq_lens", "encoder_lens", "scaling", "enable_gqa", "causal",
    "is_cross_attn", "sliding_window_size",
)


def new_token_mask(prefix_len: int, new_len: int, kv_len: int, causal: bool,
                   sliding_window_size: int | None) -> torch.Tensor | None:
    """Which keys each new token may attend to (``new_len x kv_len``); ``None``: all of them.

    New token ``i`` sits at position ``prefix_len + i``: causal attention sees keys up to it, a
    sliding window only the last ``sliding_window_size`` before it as well (SGLang's own rule).
    """
    if not causal and sliding_window_size is None:
        return None
    q_pos = torch.arange(prefix_len, prefix_len + new_len).unsqueeze(1)
    k_pos = torch.arange(kv_len).unsqueeze(0)
    mask = k_pos <= q_pos
    if sliding_window_size is not None and sliding_window_size > -1:
        mask &= k_pos >= q_pos - sliding_window_size
    return mask


def make_sdpa_forward_extend(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A drop-in for ``_run_sdpa_forward_extend``; ``original`` serves encoder-decoder batches."""

    def sdpa_forward_extend(self: Any, query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, req_to_token: torch.Tensor,
                            req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                            extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
                            encoder_lens: torch.Tensor | None = None, scaling: float | None = None,
                            enable_gqa: bool = False, causal: bool = False, is_cross_attn: bool = False,
                            sliding_window_size: int | None = None) -> torch.Tensor:
        if encoder_lens is not None:
            return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                            seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling,
                            enable_gqa=enable_gqa, causal=causal, is_cross_attn=is_cross_attn,
                            sliding_window_size=sliding_window_size)
        window = sliding_window_size if sliding_window_size is not None and sliding_window_size > -1 else None
        heads_first = query.movedim(0, query.dim() - 2)  # [heads, tokens, head_dim]
        start_q = 0
        for i in range(seq_lens.shape[0]):
            new_len, prefix_len = int(extend_seq_lens[i]), int(extend_prefix_lens[i])
            kv_len = int(seq_lens[i])
            end_q = start_q + new_len
            tokens = req_to_token[req_pool_indices[i], :kv_len]
            key = k_cache[tokens].movedim(0, query.dim() - 2)
            value = v_cache[tokens].movedim(0, query.dim() - 2)
            q = heads_first[:, start_q:end_q, :]
            if not (q.dtype == key.dtype == value.dtype):
                key, value = key.to(q.dtype), value.to(q.dtype)
            if prefix_len == 0 and window is None:
                mask, is_causal = None, causal  # SGLang's own call: cold prefills stay as they were
            else:
                mask, is_causal = new_token_mask(prefix_len, new_len, kv_len, causal, window), False
            out = scaled_dot_product_attention(q.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                                               attn_mask=mask, enable_gqa=enable_gqa, scale=scaling,
                                               is_causal=is_causal)
            output[start_q:end_q, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
            start_q = end_q
        return output

    sdpa_forward_extend.__wrapped__ = original  # type: ignore[attr-defined]
    return sdpa_forward_extend
