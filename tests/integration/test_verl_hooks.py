"""stack/verl/hooks.py against verl's own classes on CPU: masked rows (harnessrl_valid
False) are out of the loss and out of GRPO's group statistics, and their counts are
in the step metrics verl's trainers compute.

verl's trainer modules (``ray_trainer``, the fully-async trainer's base
``separation.ray_trainer``) import ``torchdata``, which this project does not
install; the estimator is called here exactly as their ``compute_advantage``
calls a registered estimator, and that those modules reach the wrapped metrics
function is checked on their source (``ast``), where verl could drift."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos, metric_utils

from harnessrl import paths
from stack.verl import hooks as verl_hooks
from stack.verl import outputs as vo
from tests.trainer_support import TR, segment, trajectory
from tests.verl_support import compute_advantage, verl_batch, verl_worker

ROOT = Path(__file__).resolve().parents[2]
VERL = Path(core_algos.__file__).resolve().parents[2]


pytestmark = pytest.mark.skipif(
    not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"
)


def trial(tid: str, group: str, reward: float, reason: int = TR.TERMINATION_REASON_COMPLETED, n: int = 2) -> Any:
    return trajectory(tid, group, reward, [segment([1, 2], [3] * n, [1] * n, [-0.5] * n)], reason)


async def group_batch() -> Any:
    """Three groups as verl assembles them: g1 has three valid trials and one whose
    verifier failed (infra, its reward 1.0 is not trained), g2 one valid and one
    over-long, g3 only a failed setup."""
    from transformers import AutoTokenizer

    setup = trajectory("s", "g3", 0.0, [], TR.TERMINATION_REASON_ENV_SETUP_FAILED, has_reward=False)
    trajs = [
        (trial("a", "g1", 1.0), "g1"),
        (trial("b", "g1", 0.0), "g1"),
        (trial("c", "g1", 1.0), "g1"),
        (trial("d", "g1", 1.0, TR.TERMINATION_REASON_VERIFIER_ERROR), "g1"),
        (trial("e", "g2", 1.0), "g2"),
        (trial("f", "g2", 1.0, n=12), "g2"),
        (setup, "g3"),
    ]
    outs = [vo.trajectory_to_output(t, 8, prompt_length=8) for t, _ in trajs]
    batch = await verl_batch(verl_worker(AutoTokenizer.from_pretrained(paths.default_model_dir()), 8, 8), outs)
    batch.non_tensor_batch["uid"] = np.array([g for _, g in trajs], dtype=object)
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    return batch


async def test_masked_rows_are_out_of_the_loss_and_of_grpo_group_statistics() -> None:
    batch = await group_batch()
    valid = batch.non_tensor_batch["harnessrl_valid"].astype(bool)
    assert valid.tolist() == [True, True, True, False, True, False, False]
    # The flag and the mask agree for every row verl assembled: the estimator reads the mask.
    assert verl_hooks.valid_rows(batch.batch["response_mask"]).tolist() == valid.tolist()
    ours = compute_advantage(batch, adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig())
    adv = ours.batch["advantages"]
    assert torch.count_nonzero(adv[~torch.from_numpy(valid)]) == 0, "masked rows weigh 0"
    # Exactly verl's GRPO over the valid rows alone.
    alone = compute_advantage(batch.select_idxs(np.flatnonzero(valid)), adv_estimator="grpo", config=AlgoConfig())
    assert torch.allclose(adv[torch.from_numpy(valid)], alone.batch["advantages"])
    first = adv[:, 0].tolist()
    assert first[:3] == pytest.approx([0.57735, -1.1547, 0.57735], abs=1e-4)  # mean 2/3, std 0.577 of [1, 0, 1]
    assert first[4] == pytest.approx(1.0), "a group with one valid row: verl's mean 0, std 1"
    # verl's own GRPO on the same batch counts the masked rows in the group (what the hook prevents).
    plain = compute_advantage(await group_batch(), adv_estimator="grpo", config=AlgoConfig())
    assert plain.batch["advantages"][0, 0].item() != pytest.approx(first[0], abs=1e-3)


async def test_norm_by_std_off_is_honoured() -> None:
    batch = await group_batch()
    adv = compute_advantage(
        batch, adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig(norm_adv_by_std_in_grpo=False)
    ).batch["advantages"]
    assert adv[:3, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3], abs=1e-5)


def test_verls_trainers_compute_their_metrics_with_the_function_the_hook_wraps() -> None:
    """The fully-async trainer (FullyAsyncTrainer < SeparateRayPPOTrainer) and the classic
    one take ``compute_data_metrics`` from metric_utils by name and call it on the step's
    batch: so a wrapper installed before they are imported is what they call."""
    import ast

    for rel in ("experimental/separation/ray_trainer.py", "trainer/ppo/ray_trainer.py"):
        tree = ast.parse((VERL / rel).read_text())
        imports = {
            a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "verl.trainer.ppo.metric_utils"
            for a in node.names
        }
        calls = [
            n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "compute_data_metrics"
        ]
        assert "compute_data_metrics" in imports and calls, rel
    # ...and hand a registered estimator exactly what tests.verl_support.compute_advantage does.
    dispatch = (VERL / "trainer/ppo/ray_trainer.py").read_text()
    for passed in (
        '"token_level_rewards": data.batch["token_level_rewards"]',
        '"response_mask": data.batch["response_mask"]',
        '"config": config',
        'adv_kwargs["index"] = data.non_tensor_batch["uid"]',
    ):
        assert passed in dispatch, passed
    fully_async = (VERL / "experimental/fully_async_policy/fully_async_trainer.py").read_text()
    assert "class FullyAsyncTrainer(SeparateRayPPOTrainer)" in fully_async
    assert "def _fit_collect_metrics" not in fully_async, "it inherits the separated trainer's"
    assert metric_utils.compute_data_metrics.harnessrl  # type: ignore[attr-defined]


async def test_masked_rows_are_counted_in_verls_step_metrics() -> None:
    batch = compute_advantage(await group_batch(), adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig())
    metrics = metric_utils.compute_data_metrics(batch=batch, use_critic=False)
    assert "critic/score/mean" in metrics, "verl's own metrics are still there"
    ours = {k: v for k, v in metrics.items() if k.startswith("harnessrl/")}
    assert ours == {
        "harnessrl/rows": 7.0,
        "harnessrl/masked_rows": 3.0,
        "harnessrl/masked_fraction": pytest.approx(3 / 7),
        "harnessrl/dropped_segments": 0.0,
        "harnessrl/masked/infra": 2.0,
        "harnessrl/masked/infra/verifier_error": 1.0,
        "harnessrl/masked/infra/env_setup_failed": 1.0,
        "harnessrl/masked/response_too_long": 1.0,
    }


def test_a_batch_without_harnessrl_rows_gets_no_harnessrl_metrics() -> None:
    from verl import DataProto

    plain = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)}, non_tensors={"uid": np.array(["a", "b"])})
    assert verl_hooks.harnessrl_metrics(plain) == {}
    assert verl_hooks.harnessrl_metrics(object()) == {}


def test_verl_loads_the_hooks_in_every_process_through_its_external_modules_variable() -> None:
    """verl's own mechanism (VERL_USE_EXTERNAL_MODULES, read on `import verl`), in a fresh
    interpreter, as in each Ray actor: the estimator is registered and a module that takes
    compute_data_metrics by name afterwards (as verl's trainers do) gets the wrapper."""
    code = (
        "import verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "from verl.trainer.ppo.metric_utils import compute_data_metrics\n"
        "core_algos.get_adv_estimator_fn('harnessrl_grpo')\n"
        "assert compute_data_metrics.harnessrl\n"
        "print('ok')\n"
    )
    # The room's module, and the name users' launch scripts already give (kept stable).
    for module in ("stack.verl.hooks", "stack.verl_hooks"):
        env = os.environ | {"VERL_USE_EXTERNAL_MODULES": module, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "ok", (module, done.stderr[-2000:])


def test_a_module_that_took_the_function_before_the_hook_is_rewired(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    original = metric_utils.compute_data_metrics.__wrapped__  # type: ignore[attr-defined]
    early = types.ModuleType("early_trainer")
    early.compute_data_metrics = original  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "early_trainer", early)
    monkeypatch.setattr(metric_utils, "compute_data_metrics", original)
    verl_hooks.install_metrics()
    assert early.compute_data_metrics.harnessrl and metric_utils.compute_data_metrics.harnessrl  # type: ignore[attr-defined]
    verl_hooks.install_metrics()  # idempotent: no wrapper around the wrapper
    assert metric_utils.compute_data_metrics.__wrapped__ is original  # type: ignore[attr-defined]
