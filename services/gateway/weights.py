"""In-place weight loading for the local engine.

A checkpoint is a folder of safetensors files (``save_pretrained`` output,
sharded or not) or a single ``.safetensors`` file. Every file's index is read and
checked against the model first (every parameter present under one of its
names, shapes equal, nothing unknown, every file as long as its index says);
only then are the tensors copied into the live parameters, so a bad checkpoint
leaves the old weights untouched. The data is read one tensor at a time while it
is copied (``StoredTensor``): a second model's worth of weights is never held
(the whole file read or mapped at once cost the quickstart 0.5 GB at each sync).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from harnessrl.errors import InvalidArgument

# safetensors' dtype names (the format's header) -> torch's.
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file, read from disk only when ``read``."""

    file: Path
    offset: int  # of its first byte in the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def read(self) -> torch.Tensor:
        data = torch.empty(self.nbytes, dtype=torch.uint8)
        with self.file.open("rb") as f:
            f.seek(self.offset)
            got = f.readinto(data.numpy().data)
        if got != self.nbytes:
            raise InvalidArgument(f"checkpoint {self.file}: ends inside a tensor (read {got} of {self.nbytes} bytes)")
        return data.view(self.dtype).reshape(self.shape)


def read_checkpoint(path: str | Path) -> dict[str, StoredTensor]:
    """Every tensor of a checkpoint folder or file, indexed (its data not read yet)."""
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
    tensors: dict[str, StoredTensor] = {}
    for file in files:
        try:
            tensors.update(index_file(file))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidArgument(f"checkpoint {file}: not a readable safetensors file: {e}") from e
    return tensors


def index_file(file: Path) -> dict[str, StoredTensor]:
    """A safetensors file's tensors from its header (8 bytes of length, then JSON)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 2 <= length <= size - 8:
            raise ValueError(f"header length {length} does not fit a file of {size} bytes")
        header = json.loads(f.read(length))
    found = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in DTYPES:
            raise ValueError(f"{name}: dtype {meta['dtype']} is not one of {', '.join(DTYPES)}")
        start, end = (int(x) for x in meta["data_offsets"])
        dtype, shape = DTYPES[meta["dtype"]], tuple(int(n) for n in meta["shape"])
        if end - start != math.prod(shape) * dtype.itemsize or 8 + length + end > size:
            raise ValueError(f"{name}: bytes {start}..{end} do not hold {shape} {meta['dtype']} in {size} bytes")
        found[name] = StoredTensor(file, 8 + length + start, end - start, dtype, shape)
    return found


Source = torch.Tensor | StoredTensor
Plan = list[tuple[torch.Tensor, Source]]


def plan_update(model: torch.nn.Module, tensors: Mapping[str, Source]) -> Plan:
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
def apply_update(plan: Plan) -> None:
    for param, source in plan:
        param.copy_(source.read() if isinstance(source, StoredTensor) else source)
