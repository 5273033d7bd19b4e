"""Checkpoints: a plain Hugging Face folder (config + safetensors weights +
tokenizer) that the gateway's engines load as is, plus the optimizer state
(safetensors) and counters (JSON) that make a resume bit-exact.

A checkpoint is written to ``<name>.tmp`` and renamed into place, so a reader
never sees a half-written folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harnessrl.errors import InvalidArgument, NotFound

FORMAT = "harnessrl-trainer-checkpoint/1"
# Trainer-only state lives in a subfolder: the checkpoint root stays a plain HF
# folder whose every *.safetensors file is model weights (engines load them all).
STATE_DIR = "trainer_state"
STATE_FILE = f"{STATE_DIR}/trainer_state.json"
OPTIM_FILE = f"{STATE_DIR}/optimizer.safetensors"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclass(frozen=True)
class State:
    step: int
    policy_version: int


def step_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step-{step:08d}"


def save(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    source_dir: Path,
    step: int,
    policy_version: int,
) -> Path:
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]
    for name in TOKENIZER_FILES:
        if (source_dir / name).exists() and not (tmp / name).exists():
            shutil.copy2(source_dir / name, tmp / name)
    (tmp / STATE_DIR).mkdir()
    names = _param_names(model)
    tensors = {"rng.cpu": torch.get_rng_state()}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            # No copy on the CPU (the optimizer's state is not stepped while it is saved, on the
            # trainer's own thread): a copy held Adam's two moments twice, 1 GB for the quickstart.
            tensors[f"state.{names[id(param)]}.{key}"] = torch.as_tensor(value).detach().to("cpu")
    save_file(tensors, str(tmp / OPTIM_FILE))
    meta = {"format": FORMAT, "step": step, "policy_version": policy_version, "params": list(names.values())}
    (tmp / STATE_FILE).write_text(json.dumps(meta, indent=1))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def load(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> State:
    """Restores weights, optimizer state and RNG; errors name the folder and what is wrong."""
    if not directory.is_dir():
        raise NotFound(f"{directory}: not a trainer checkpoint (no such folder)")
    meta_path = directory / STATE_FILE
    if not meta_path.exists():
        raise NotFound(f"{directory}: not a trainer checkpoint (no {STATE_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise InvalidArgument(f"{meta_path}: unknown format {meta.get('format')!r}, expected {FORMAT}")
        weights = load_file(str(directory / WEIGHTS_FILE))
        tensors = load_file(str(directory / OPTIM_FILE))
    except (OSError, ValueError, json.JSONDecodeError) as e:
        raise InvalidArgument(f"{directory}: unreadable checkpoint: {e}") from e
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise InvalidArgument(f"{directory}: weights do not fit the model: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()  # type: ignore[operator]
    by_name = {name: p for p_id, name in _param_names(model).items() for p in model.parameters() if id(p) == p_id}
    optimizer.state.clear()
    for key, value in tensors.items():
        if not key.startswith("state."):
            continue
        name, field = key[len("state.") :].rsplit(".", 1)
        if name not in by_name:
            raise InvalidArgument(f"{directory}: optimizer state for unknown parameter {name}")
        param = by_name[name]
        # Moments live with their parameter (a CUDA policy); AdamW keeps its step count on the CPU.
        optimizer.state[param][field] = value.to(param.device) if value.dim() else value
    torch.set_rng_state(tensors["rng.cpu"])
    return State(int(meta["step"]), int(meta["policy_version"]))


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    """id(param) -> name, one name per tensor (tied weights appear once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def latest(output_dir: Path) -> Path | None:
    folder = output_dir / "checkpoints"
    found = sorted(p for p in folder.iterdir() if STEP_DIR.match(p.name)) if folder.exists() else []
    return found[-1] if found else None


def prune(output_dir: Path, keep: int) -> None:
    folder = output_dir / "checkpoints"
    found = sorted(p for p in folder.iterdir() if STEP_DIR.match(p.name)) if folder.exists() else []
    for old in found[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
