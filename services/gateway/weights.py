"""In-place weight loading for the local engine.

A checkpoint is a folder of safetensors files (``save_pretrained`` output,
sharded or not) or a single ``.safetensors`` file. Everything is read and
checked against the model first (every parameter present under one of its
names, shapes equal, nothing unknown); only then are the tensors copied into
the live parameters, so a bad checkpoint leaves the old weights untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from harnessrl.errors import InvalidArgument


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder or file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not str(path):
        raise InvalidArgument("checkpoint_path is required by this engine")
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise InvalidArgument(f"checkpoint {root}: no .safetensors file in the folder")
    else:
        raise InvalidArgument(f"checkpoint {root}: no such file or folder")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file), device="cpu"))
        except (SafetensorError, OSError, ValueError) as e:
            raise InvalidArgument(f"checkpoint {file}: not a readable safetensors file: {e}") from e
    return tensors


def plan_update(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs (live parameter, new tensor) for every parameter of ``model``.

    Tied parameters (one tensor under several names, like embeddings and the LM
    head) need only one of their names in the checkpoint."""
    names_by_param: dict[int, list[str]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names_by_param.setdefault(id(tensor), []).append(name)
        params[id(tensor)] = tensor
    known = {name for names in names_by_param.values() for name in names}
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise InvalidArgument(f"checkpoint has {len(unknown)} tensor(s) the model does not: {unknown[:5]}")
    plan, missing, bad_shape = [], [], []
    for key, names in names_by_param.items():
        source = next((tensors[n] for n in names if n in tensors), None)
        if source is None:
            missing.append(names[0])
        elif tuple(source.shape) != tuple(params[key].shape):
            bad_shape.append(f"{names[0]}: {tuple(source.shape)} != {tuple(params[key].shape)}")
        elif not source.is_floating_point():
            bad_shape.append(f"{names[0]}: dtype {source.dtype} is not floating point")
        else:
            plan.append((params[key], source))
    if missing:
        raise InvalidArgument(f"checkpoint lacks {len(missing)} tensor(s) of the model: {missing[:5]}")
    if bad_shape:
        raise InvalidArgument(f"checkpoint tensors do not fit the model: {bad_shape[:5]}")
    return plan


@torch.no_grad()
def apply_update(plan: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for param, source in plan:
        param.copy_(source)
