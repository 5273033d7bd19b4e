"""Helpers shared by the gateway tests: a tiny random Llama folder (fast to load,
same tokenizer as the default model) and teacher-forced reference logprobs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harnessrl import paths
from services.gateway.engines.base import Sampling
from services.gateway.sampling import sampling_logprobs

# ChatML: system / user "What is 2+2?" / assistant header, tokenized by the default model's tokenizer.
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 28, 34, 47, 2, 198]
PROMPT += [1, 520, 9531, 198]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A 2-layer random Llama with the default model's tokenizer, saved as a plain HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    source = paths.default_model_dir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@torch.inference_mode()
def teacher_forced(model: Any, prompt: list[int], output: list[int], sampling: Sampling) -> np.ndarray:
    """Logprobs of ``output`` given ``prompt`` from one fp32 forward over the whole
    sequence, processed exactly as the engine's sampling distribution."""
    ids = torch.tensor([prompt + output])
    logits = model(input_ids=ids).logits[0].float()
    start = len(prompt) - 1
    return np.asarray(
        [float(sampling_logprobs(logits[start + i], sampling)[token]) for i, token in enumerate(output)],
        dtype=np.float64,
    )


def tiny_moe(folder: Path, seed: int = 0) -> Path:
    """A 2-layer random Qwen3-MoE (4 experts, top-2) with the default model's tokenizer."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(folder)
    source = paths.default_model_dir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder
