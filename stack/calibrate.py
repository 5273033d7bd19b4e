"""A few seconds' calibration of the machine, printed by ``harnessrl run`` at its
start and kept in run.json: the default model's plain transformers ``generate``
tokens/s (fp32, on the CPU, batch 1), so a run's times can be read against the
machine it ran on (the same kind of machine gave 7.5 and 13-18 tok/s here).

It runs in the run's process (a child would import torch and transformers a
second time: minutes on a loaded machine) before the run's services start, so
nothing else of the run competes with it; its model copy is dropped at once.
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROMPT_TOKENS, NEW_TOKENS, WARMUP_TOKENS = 128, 16, 2


def measure(model_dir: Path) -> dict[str, Any]:
    """Tokens/s of ``generate`` on ``model_dir`` (greedy, a fixed random prompt, exactly NEW_TOKENS)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    try:
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, int(model.config.vocab_size), (1, PROMPT_TOKENS), generator=gen)
        fixed = {"do_sample": False, "pad_token_id": 0}
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=WARMUP_TOKENS, min_new_tokens=WARMUP_TOKENS, **fixed)
            started = time.perf_counter()
            model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **fixed)
            seconds = time.perf_counter() - started
    finally:
        del model
        gc.collect()
    return {
        "generate_tokens_per_s": round(NEW_TOKENS / seconds, 4),
        "model": Path(model_dir).name,
        "dtype": "fp32",
        "threads": torch.get_num_threads(),
        "batch": 1,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
    }


def line(result: dict[str, Any]) -> str:
    return (
        f"calibration: plain generate of {result['model']} ({result['dtype']}, {result['threads']} threads, "
        f"batch {result['batch']}, {result['prompt_tokens']}-token prompt): "
        f"{result['generate_tokens_per_s']:.3g} tokens/s"
    )


def calibrate(model_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """(the result for run.json, the line to print); a failure is a line, never the run's end."""
    if not (model_dir / "config.json").exists():
        return None, f"calibration: skipped ({model_dir} holds no model; scripts/setup prepares it)"
    try:
        result = measure(model_dir)
    except (OSError, RuntimeError, ValueError) as e:  # an unreadable or odd model folder
        log.warning("calibration failed: %s", e)
        return None, f"calibration: failed ({type(e).__name__}: {str(e)[:200]})"
    return result, line(result)
