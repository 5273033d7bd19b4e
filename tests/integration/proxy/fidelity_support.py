"""The check of the real-model fidelity tests: a teacher-forced fp32 forward pass
of the default model over every exported segment, beside the captured logprobs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harnessrl.paths import default_model_dir


def forward_pass_agreement(segments: list[dict[str, Any]]) -> tuple[int, float, float]:
    """(mask-1 tokens, Pearson, max |Δ|) of the captured logprobs against the model's own."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    captured, recomputed = [], []
    for seg in segments:
        ids = seg["prompt_ids"] + seg["response_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        p = len(seg["prompt_ids"])
        for i, m in enumerate(seg["response_mask"]):
            if m:
                recomputed.append(float(logprobs[p + i - 1, ids[p + i]]))
                captured.append(seg["response_logprobs"][i])
    a, b = np.asarray(captured), np.asarray(recomputed)
    if len(a) < 2:
        return len(a), float("nan"), float("nan")
    return len(a), float(np.corrcoef(a, b)[0, 1]), float(np.abs(a - b).max())
