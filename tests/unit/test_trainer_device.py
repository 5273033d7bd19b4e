"""The trainer's device and dtype settings, on the CPU: naming the CPU changes
nothing (same losses, gradient norms, agreement and weights as the default),
bf16 trains in bf16, and a bad or absent device is refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from harnessrl.errors import ConfigError
from harnessrl.torchdevice import device_of, resolve_device, resolve_dtype
from services.trainer import r3, tinymoe
from services.trainer.cpu_trainer import CpuTrainer, Group
from services.trainer.settings import Settings
from tests.trainer_support import segment, trajectory

ROWS, LENGTH, PROMPT = 4, 24, 8
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("moe")
    tinymoe.build("tiny").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def groups() -> list[Group]:
    """One group of captured trajectories with routes and slightly-off engine logprobs."""
    model = tinymoe.build("tiny")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1023, (ROWS, LENGTH), generator=gen)
    with torch.no_grad(), r3.record(model) as recorded:
        logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    lp = lp - 0.02 * torch.rand(lp.shape, generator=gen)  # an engine is never exact
    routes = torch.stack(recorded, 1).view(ROWS, LENGTH, 4, 2).to(torch.uint8).numpy()
    n = LENGTH - PROMPT
    trajs = [
        trajectory(
            f"t{row}",
            "g",
            float(row % 2),
            [
                segment(
                    ids[row, :PROMPT].tolist(),
                    ids[row, PROMPT:].tolist(),
                    [1] * n,
                    lp[row, PROMPT - 1 :].tolist(),
                    routes=routes[row, PROMPT:],
                )
            ],
        )
        for row in range(ROWS)
    ]
    return [("g", trajs)]


def trainer(model_dir: Path, tmp_path: Path, **fields: object) -> CpuTrainer:
    settings = Settings(
        model_path=model_dir,
        output_dir=tmp_path / "out",
        algo={"loss_mode": "vanilla", "tis_cap": 2.0},
        optim={"lr": 1e-3, "token_budget": 48, "gradient_checkpointing": True},  # several micro-batches
        **fields,  # type: ignore[arg-type]
    )
    return CpuTrainer(settings)


def steps(t: CpuTrainer, groups: list[Group], n: int = 2) -> list[dict[str, float]]:
    out = []
    for _ in range(n):
        result = t.train_step(groups)
        assert result.updated, result.alerts
        out.append({k: v for k, v in result.metrics.items() if k != "step/seconds"})
    return out


def test_explicit_cpu_trains_exactly_like_the_default(model_dir: Path, groups: list[Group], tmp_path: Path) -> None:
    default = trainer(model_dir, tmp_path / "a")
    cpu = trainer(model_dir, tmp_path / "b", device="cpu")
    assert device_of(default.model).type == ("cuda" if HAS_CUDA else "cpu")
    assert device_of(cpu.model).type == "cpu" and default.routes is not None
    if HAS_CUDA:
        pytest.skip("the default is CUDA here; this host's equality check is the GPU check's job")
    a, b = steps(default, groups), steps(cpu, groups)
    assert a == b
    assert a[0]["optim/grad_norm"] > 0 and a[0]["agreement/tokens"] == ROWS * (LENGTH - PROMPT)
    for (name, p), q in zip(default.model.named_parameters(), cpu.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_bf16_policy_trains_in_bf16_close_to_fp32(model_dir: Path, groups: list[Group], tmp_path: Path) -> None:
    fp32 = trainer(model_dir, tmp_path / "a", device="cpu")
    bf16 = trainer(model_dir, tmp_path / "b", device="cpu", dtype="bf16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    (m32,), (m16,) = steps(fp32, groups, 1), steps(bf16, groups, 1)
    state = next(iter(bf16.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.bfloat16
    assert m16["agreement/mean_abs_diff"] != m32["agreement/mean_abs_diff"]  # really another dtype
    assert m16["agreement/pearson"] > 0.99 and np.isfinite(m16["optim/grad_norm"])
    assert abs(m16["agreement/mean_abs_diff"] - m32["agreement/mean_abs_diff"]) < 0.05


@pytest.mark.parametrize("field, value", [("device", "gpu"), ("device", "cuda:x"), ("device", ""), ("dtype", "fp16")])
def test_settings_refuse_a_bad_device_or_dtype(field: str, value: str) -> None:
    with pytest.raises(
        ValidationError, match=f"{field}\n.*(is not valid; use 'auto'|Input should be 'fp32' or 'bf16')"
    ):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_env_var_with_a_bad_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TRAINER_DEVICE", "tpu")
    with pytest.raises(ValidationError, match="device"):
        Settings()


def test_resolve_names_the_problem() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("fp32") is torch.float32
    with pytest.raises(ConfigError, match=r"'gpu' is not valid; use 'auto'"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match=r"dtype 'fp16' is not valid; use one of \['fp32', 'bf16'\]"):
        resolve_dtype("fp16")
    with pytest.raises(ConfigError, match="sees"):
        resolve_device("cuda:99")


@pytest.mark.skipif(HAS_CUDA, reason="this host has a GPU")
def test_cuda_is_refused_where_there_is_none(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="torch sees no CUDA device"):
        trainer(model_dir, tmp_path, device="cuda")


@pytest.mark.parametrize(
    "section, cls_path",
    [("trainer", "services.trainer.settings"), ("gateway", "services.gateway.settings")],
)
def test_a_config_file_with_a_bad_device_names_file_and_field(section: str, cls_path: str, tmp_path: Path) -> None:
    import importlib

    from harnessrl.config import load_section

    cls = importlib.import_module(cls_path).Settings
    path = tmp_path / "run.toml"
    path.write_text(f'[{section}]\ndevice = "gpu0"\n')
    with pytest.raises(ConfigError, match=rf"{path}: \[{section}\]: device: .*'gpu0' is not valid; use 'auto'"):
        load_section(cls, path, section)
    path.write_text(f'[{section}]\ndevice = "cuda:1"\ndtype = "bf16"\n')
    settings = load_section(cls, path, section)
    assert (settings.device, settings.dtype) == ("cuda:1", "bf16")  # parsed; resolved (and refused) at start
