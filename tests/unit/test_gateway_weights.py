"""The local engine's checkpoint reader (services/gateway/weights.py): it indexes a
safetensors file and reads one tensor at a time, byte for byte what safetensors wrote;
a file that is not one, or shorter than its index says, is refused before any copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harnessrl.errors import InvalidArgument
from services.gateway.weights import StoredTensor, apply_update, plan_update, read_checkpoint

TENSORS = {
    "f32": torch.randn(3, 5),
    "bf16": torch.randn(4, 2).to(torch.bfloat16),
    "f16": torch.randn(7).to(torch.float16),
    "i64": torch.arange(6).reshape(2, 3),
    "flags": torch.tensor([True, False, True]),
    "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 4),
}


def test_each_tensor_reads_back_as_safetensors_wrote_it(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(TENSORS, str(path), metadata={"format": "pt"})
    stored = read_checkpoint(path)
    assert set(stored) == set(TENSORS) and all(isinstance(t, StoredTensor) for t in stored.values())
    reference = load_file(str(path))
    for name, tensor in stored.items():
        read = tensor.read()
        assert read.dtype == reference[name].dtype and read.shape == reference[name].shape
        assert torch.equal(read, reference[name]), name


def test_weights_are_copied_in_place_from_the_file(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3)
    new = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    save_file(new, str(tmp_path / "model.safetensors"))
    apply_update(plan_update(model, read_checkpoint(tmp_path)))
    assert torch.equal(model.weight.detach(), new["weight"]) and torch.equal(model.bias.detach(), new["bias"])


def test_a_file_shorter_than_its_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"weight": torch.randn(64, 64)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(InvalidArgument, match=r"not a readable safetensors file: weight: bytes 0\.\.16384 do not hold"):
        read_checkpoint(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(InvalidArgument, match="not a readable safetensors file: header length"):
        read_checkpoint(path)
