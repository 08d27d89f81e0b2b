"""The ``torch_native`` extend adaptation (``mooncake_sgl_cpu.attention``): the rows SGLang's
own extend computes, from the new tokens' queries alone. Without it a cached prefix saves no
attention: SGLang attends from every token of the sequence."""

from __future__ import annotations

import pytest
import torch

from mooncake_sgl_cpu import adaptations
from mooncake_sgl_cpu import attention as cpu_attention
from mooncake_sgl_cpu.touch_points import ATTENTION

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
# (cached prefix, new tokens) per sequence: a cold prefill and two storage hits, lengths whose query
# blocks in torch's CPU kernel all hold four rows or more (see attention.py: then bit-identical).
SEQUENCES = ((0, 96), (640, 70), (257, 40))
# Any lengths: one-token extends and blocks of one to three rows, where rounding may differ.
ANY_SEQUENCES = ((0, 33), (1219, 1), (1280, 3), (300, 130), (5, 2))


def _batch(dtype: torch.dtype = torch.bfloat16, seed: int = 0,
           sequences: tuple[tuple[int, int], ...] = SEQUENCES) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.tensor([p for p, _ in sequences])
    new = torch.tensor([n for _, n in sequences])
    seq_lens = prefix + new
    slots = int(seq_lens.sum()) + 8
    # Every sequence's tokens in scattered KV slots, as a paged allocator leaves them.
    perm = torch.randperm(slots, generator=gen)
    req_to_token = torch.zeros((len(sequences) + 1, int(seq_lens.max())), dtype=torch.int64)
    start = 0
    for i, n in enumerate(seq_lens.tolist()):
        req_to_token[i + 1, :n] = perm[start:start + n]
        start += n
    return {
        "query": torch.randn((int(new.sum()), HEADS, HEAD_DIM), generator=gen).to(dtype),
        "k_cache": torch.randn((slots, KV_HEADS, HEAD_DIM), generator=gen).to(dtype),
        "v_cache": torch.randn((slots, KV_HEADS, HEAD_DIM), generator=gen).to(dtype),
        "req_to_token": req_to_token, "req_pool_indices": torch.arange(1, len(sequences) + 1),
        "seq_lens": seq_lens, "extend_prefix_lens": prefix, "extend_seq_lens": new,
    }


def _run(fn, batch: dict[str, torch.Tensor], **kw: object) -> torch.Tensor:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    b = batch
    output = torch.full_like(b["query"], float("nan"))
    fn(object.__new__(TorchNativeAttnBackend), b["query"], output, b["k_cache"], b["v_cache"],
       b["req_to_token"], b["req_pool_indices"], b["seq_lens"], b["extend_prefix_lens"],
       b["extend_seq_lens"], None, scaling=HEAD_DIM ** -0.5, enable_gqa=True, **kw)
    return output


def _sglang_own():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    installed = TorchNativeAttnBackend._run_sdpa_forward_extend
    return getattr(installed, "__wrapped__", installed)


@pytest.mark.parametrize("kw", [{"causal": True}, {"causal": True, "sliding_window_size": 48},
                                {"causal": False}], ids=["causal", "sliding-window", "bidirectional"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_new_token_rows_are_bit_identical_to_sglangs(kw: dict[str, object], dtype: torch.dtype) -> None:
    batch = _batch(dtype)
    ours = _run(cpu_attention.make_sdpa_forward_extend(_sglang_own()), batch, **kw)
    theirs = _run(_sglang_own(), batch, **kw)
    assert not ours.isnan().any()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("kw", [{"causal": True}, {"causal": True, "sliding_window_size": 48}],
                         ids=["causal", "sliding-window"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_rows_of_any_length_agree_within_rounding(kw: dict[str, object], dtype: torch.dtype) -> None:
    batch = _batch(dtype, seed=3, sequences=ANY_SEQUENCES)
    ours = _run(cpu_attention.make_sdpa_forward_extend(_sglang_own()), batch, **kw)
    theirs = _run(_sglang_own(), batch, **kw)
    step = torch.finfo(dtype).eps
    torch.testing.assert_close(ours, theirs, rtol=2 * step, atol=2 * step)


def test_attention_runs_from_the_new_tokens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the adaptation is for: per sequence, queries = new tokens, not the whole sequence."""
    from sglang.srt.layers.attention import torch_native_backend
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    query_lens: list[int] = []

    def recording(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        query_lens.append(q.shape[-2])
        return torch.nn.functional.scaled_dot_product_attention(q, *args, **kwargs)

    monkeypatch.setattr(cpu_attention, "scaled_dot_product_attention", recording)
    monkeypatch.setattr(torch_native_backend, "scaled_dot_product_attention", recording)
    # As installed by the plug-in in this process (the session fixture ran load_plugins()).
    _run(TorchNativeAttnBackend._run_sdpa_forward_extend, _batch(), causal=True)
    assert query_lens == [n for _, n in SEQUENCES]

    query_lens.clear()
    _run(_sglang_own(), _batch(), causal=True)
    assert query_lens == [p + n for p, n in SEQUENCES]  # SGLang alone: whole sequences


def test_adaptation_is_installed_once_and_only_for_the_checked_signature(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    installed = TorchNativeAttnBackend._run_sdpa_forward_extend
    assert getattr(installed, "__mooncake_sgl_new_tokens__", False)
    assert adaptations.extend_attention_new_tokens(ATTENTION) is False  # already there: not wrapped twice

    def other_contract(self: object, query: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        return output

    monkeypatch.setattr(TorchNativeAttnBackend, "_run_sdpa_forward_extend", other_contract)
    assert adaptations.extend_attention_new_tokens(ATTENTION) is False
    assert TorchNativeAttnBackend._run_sdpa_forward_extend is other_contract


def test_encoder_decoder_batches_go_to_sglangs_implementation() -> None:
    calls: list[object] = []

    def original(*args: object, **kwargs: object) -> str:
        calls.append(args[10])
        return "sglang's"

    patched = cpu_attention.make_sdpa_forward_extend(original)
    encoder_lens = torch.tensor([4])
    assert patched(None, *([None] * 9), encoder_lens, causal=True) == "sglang's"
    assert calls == [encoder_lens]
