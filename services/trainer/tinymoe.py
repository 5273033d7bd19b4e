"""A tiny random-weight Qwen3-MoE built from a config: nothing to download.

The R3 tests and the GPU check (``stack/bench/gpu_check.py``) build their model here.
``tiny`` is sized for CPU tests (a few M parameters; its routers are sharp
enough that a bf16 engine picks other experts than an fp32 trainer on some
tokens, which is what routing replay fixes). ``small`` is the GPU check's
default: more layers and experts, the same shape of problem.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
    },
    "small": {
        "vocab_size": 8192,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "max_position_embeddings": 4096,
    },
}


def config(preset: str = "tiny") -> Qwen3MoeConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny MoE preset {preset!r}; valid: {sorted(PRESETS)}")
    sizes = PRESETS[preset]
    last = sizes["vocab_size"] - 1
    return Qwen3MoeConfig(
        **sizes,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        initializer_range=0.1,
        tie_word_embeddings=False,
        # The local engine needs an end-of-turn id; the last id, sampled now and then.
        bos_token_id=last,
        eos_token_id=last,
        pad_token_id=last,
    )


def build(preset: str = "tiny", seed: int = 0) -> Qwen3MoeForCausalLM:
    """Random weights from ``seed`` (the same model for the same seed), fp32, eval mode."""
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config(preset)).eval()
