"""Loading the policy for training, on the device and in the dtype the settings name.

torch and transformers only (no verl, no protobuf): the GPU check loads the
policy through this very function.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from harnessrl.torchdevice import resolve_device, resolve_dtype


def load_model(path: Path, gradient_checkpointing: bool, device: str = "cpu", dtype: str = "fp32") -> torch.nn.Module:
    """The model in train mode on ``device`` (see ``harnessrl.torchdevice``); a
    device that is absent here is refused before the weights are read."""
    where, weights = resolve_device(device), resolve_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=weights)
    model.to(where)  # type: ignore[call-arg,arg-type]  # transformers wraps .to; mypy misreads it
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    return model
