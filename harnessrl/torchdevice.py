"""Where a service's torch model runs: the ``device`` and ``dtype`` settings of
the trainer and of the gateway's local engine, parsed and resolved in one place.

``device``: ``auto`` (the first CUDA device when torch sees one, else the CPU),
``cpu``, ``cuda`` or ``cuda:N``. ``dtype``: ``fp32`` or ``bf16`` (the weights'
dtype; logprobs are always computed from fp32 logits).

torch is imported only when a value is resolved, so settings modules can use
the patterns without importing it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from harnessrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d{1,2})?)$"
DEVICE_HELP = "'auto' (CUDA when torch sees a GPU, else CPU), 'cpu', 'cuda' or 'cuda:N'"
DTYPES = ("fp32", "bf16")


def check_device_name(name: str) -> str:
    """A settings validator: the name unchanged, or a ValueError that lists the valid forms."""
    if not isinstance(name, str) or not re.match(DEVICE_PATTERN, name):
        raise ValueError(f"device {name!r} is not valid; use {DEVICE_HELP}")
    return name


def resolve_device(name: str) -> torch.device:
    """The torch device a setting names; a clear ConfigError when it is malformed or absent here."""
    import torch

    try:
        check_device_name(name)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r} asked for, but torch sees no CUDA device (torch {torch.__version__}, "
            f"cuda build {torch.version.cuda}); use 'auto' or 'cpu'"
        )
    index = int(name.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device {name!r} asked for, but torch sees {count} CUDA device(s)")
    return torch.device("cuda", index)


def resolve_dtype(name: str) -> torch.dtype:
    import torch

    by_name = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if name not in by_name:
        raise ConfigError(f"dtype {name!r} is not valid; use one of {list(DTYPES)}")
    return by_name[name]


def device_of(module: Any) -> torch.device:
    """The device of a module's first parameter (the CPU for a module without any)."""
    import torch

    for param in module.parameters():
        return torch.device(param.device)
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Waits for queued kernels (before reading a wall clock); a no-op on the CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
