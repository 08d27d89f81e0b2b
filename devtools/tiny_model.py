"""A tiny local Llama with seeded random weights, for live SGLang servers on machines without a GPU.

    python -m devtools.tiny_model DIR [--layers 2 --hidden 256 --seed 0]

Writes ``config.json`` and ``model.safetensors`` into DIR: no download and no tokenizer (servers run
with ``--skip-tokenizer-init`` and prompts are token ids). The weights are random but not dummy: they
are drawn from a seeded generator with a wide initializer, so the logits are far from uniform and a
greedy output and its logprobs depend on every KV byte a server loads. That is what lets a test tell
a storage hit with the right bytes from one with wrong bytes.

Same arguments, same bytes: the writer skips a directory that already holds this exact model.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# Wide enough that attention and logits are sharp (greedy decoding is stable across runs and a
# corrupted KV page changes the output), small enough that activations stay finite in bfloat16.
_INIT_STD = 0.2
_STAMP = "mooncake_sgl_tiny_model.json"


@dataclass(frozen=True)
class TinyLlama:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    vocab: int = 32000
    context: int = 32768
    seed: int = 0
    dtype: str = "bfloat16"
    # > 0: a hybrid sliding-window model instead (SGLang's Mellum architecture with dense MLPs:
    # every layer but the last attends over this many tokens), so HiCache runs a SWA sidecar pool.
    swa_window: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"tiny model: {name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"tiny model: hidden ({self.hidden}) must divide by heads ({self.heads}) "
                             f"and heads by kv_heads ({self.kv_heads})")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"tiny model: dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        if self.swa_window < 0 or (self.swa_window and self.layers < 2):
            raise ValueError(f"tiny model: swa_window must be 0, or positive with at least 2 layers (one "
                             f"full-attention layer), got {self.swa_window} with {self.layers} layers")

    def parameters(self) -> int:
        head_dim = self.hidden // self.heads
        attention = self.hidden * head_dim * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden

    def kv_bytes_per_token(self) -> int:
        itemsize = 4 if self.dtype == "float32" else 2
        return self.layers * 2 * self.kv_heads * (self.hidden // self.heads) * itemsize

    def describe(self) -> str:
        return (f"tiny random-weight Llama: {self.layers} layers, hidden {self.hidden}, {self.heads} heads "
                f"({self.kv_heads} KV), {self.parameters() / 1e6:.1f}M parameters, "
                f"{self.kv_bytes_per_token() * 64 // 1024} KiB of KV per 64-token page")

    def hf_config(self) -> dict[str, object]:
        """The ``config.json`` of a ``LlamaForCausalLM`` (or of the hybrid SWA model)."""
        if self.swa_window > 0:
            return self._hybrid_swa_config()
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.hidden // self.heads,
            "vocab_size": self.vocab, "max_position_embeddings": self.context,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": self.dtype, "initializer_range": _INIT_STD,
            "bos_token_id": 1, "eos_token_id": 2,
        }


    def _hybrid_swa_config(self) -> dict[str, object]:
        # Mellum's config is Qwen3-MoE's plus per-layer attention/MLP types; SGLang needs at least
        # one (unused) expert declared even when every MLP is dense.
        kinds = ["sliding_attention"] * (self.layers - 1) + ["full_attention"]
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        return {
            "architectures": ["MellumForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "moe_intermediate_size": self.intermediate, "num_experts": 2, "num_experts_per_tok": 1,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.hidden // self.heads,
            "vocab_size": self.vocab, "max_position_embeddings": self.context, "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "attention_bias": False, "sliding_window": self.swa_window,
            "use_sliding_window": True, "layer_types": kinds, "mlp_layer_types": ["dense"] * self.layers,
            "rope_parameters": {"sliding_attention": rope, "full_attention": rope},
            "tie_word_embeddings": False, "torch_dtype": self.dtype, "initializer_range": _INIT_STD,
            "bos_token_id": 1, "eos_token_id": 2,
        }


def write_tiny_llama(directory: Path, spec: TinyLlama = TinyLlama()) -> Path:
    """Write the model into ``directory`` (created); returns it. Idempotent for the same ``spec``."""
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    stamp = directory / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    head_dim = spec.hidden // spec.heads

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * _INIT_STD).to(dtype)

    tensors = {"model.embed_tokens.weight": normal(spec.vocab, spec.hidden),
               "model.norm.weight": torch.ones(spec.hidden, dtype=dtype),
               "lm_head.weight": normal(spec.vocab, spec.hidden)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(spec.hidden, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(spec.hidden, dtype=dtype),
            p + "self_attn.q_proj.weight": normal(spec.heads * head_dim, spec.hidden),
            p + "self_attn.k_proj.weight": normal(spec.kv_heads * head_dim, spec.hidden),
            p + "self_attn.v_proj.weight": normal(spec.kv_heads * head_dim, spec.hidden),
            p + "self_attn.o_proj.weight": normal(spec.hidden, spec.heads * head_dim),
            p + "mlp.gate_proj.weight": normal(spec.intermediate, spec.hidden),
            p + "mlp.up_proj.weight": normal(spec.intermediate, spec.hidden),
            p + "mlp.down_proj.weight": normal(spec.hidden, spec.intermediate),
        }
        if spec.swa_window > 0:  # Qwen3-style attention normalises q and k per head
            tensors |= {p + "self_attn.q_norm.weight": torch.ones(head_dim, dtype=dtype),
                        p + "self_attn.k_norm.weight": torch.ones(head_dim, dtype=dtype)}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(spec.hf_config(), indent=2))
    stamp.write_text(json.dumps(asdict(spec)))
    return directory


def main(argv: list[str] | None = None) -> int:
    d = TinyLlama()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", type=Path)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--intermediate", type=int, default=d.intermediate)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--context", type=int, default=d.context, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--swa-window", type=int, default=d.swa_window,
                   help="> 0: a hybrid sliding-window model (SWA sidecar pool in HiCache)")
    a = p.parse_args(argv)
    try:
        spec = TinyLlama(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                         intermediate=a.intermediate, vocab=a.vocab, context=a.context, seed=a.seed,
                         dtype=a.dtype, swa_window=a.swa_window)
    except ValueError as e:
        p.error(str(e))
    out = write_tiny_llama(a.directory, spec)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
