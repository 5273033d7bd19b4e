"""The CPU training path: real optimizer steps on a Hugging Face causal LM.

One step = ready groups in, one policy version out:
1. samples from the captured segments (``samples.py``), advantages (verl);
2. a no-grad pass with the step-start weights: the proximal logprobs, and the
   train/inference agreement against the engine's logprobs;
3. the loss on [trajectory, policy token] rows (verl's functions), its
   gradient with respect to each token's logprob, then one micro-batched
   backward pass that pushes those gradients into the weights
   (``forward.backward_through``); gradient clipping; AdamW.
A non-finite loss or gradient skips the update and raises an alert.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from harnessrl.v1 import records_pb2
from services.trainer import agreement, checkpoint, forward, r3
from services.trainer.advantages import ScoredRow, score_groups
from services.trainer.losses import LossInputs, RowLayout, policy_loss
from services.trainer.policy import load_model as load_model  # re-exported: offline.py and tests use it
from services.trainer.samples import Sample, StepCounters, build_rows
from services.trainer.settings import AlgoSettings, Settings

log = logging.getLogger(__name__)

Group = tuple[str, Sequence[records_pb2.Trajectory]]


@dataclass
class StepResult:
    step: int
    policy_version: int
    metrics: dict[str, float]
    alerts: list[str] = field(default_factory=list)
    updated: bool = False


class CpuTrainer:
    """Holds the policy, its optimizer and its version; ``train_step`` is one version."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.source_dir = settings.resolved_model_path()
        torch.manual_seed(settings.optim.seed)
        self.model = load_model(self.source_dir, settings.optim.gradient_checkpointing, settings.device, settings.dtype)
        self.ref_model = self._frozen_copy() if settings.algo.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=settings.optim.lr,
            betas=settings.optim.betas,
            weight_decay=settings.optim.weight_decay,
        )
        self.routes: forward.RouteContext | None = None
        if settings.algo.routing_replay and r3.routers(self.model):
            self.routes = r3.route_context(self.model)
        self.step = 0
        self.policy_version = 0

    def _frozen_copy(self) -> torch.nn.Module:
        ref = copy.deepcopy(self.model)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # -- one step ---------------------------------------------------------------

    def train_step(self, groups: Sequence[Group]) -> StepResult:
        started = time.monotonic()
        counters = StepCounters()
        opt = self.settings.optim
        grouped = [(gid, build_rows(trajs, counters, opt.max_seq_len)) for gid, trajs in groups]
        scored = [r for r in score_groups(grouped, self.settings.algo, counters) if r.row.samples]
        self.step += 1
        result = StepResult(self.step, self.policy_version, {})
        rewards = [r.reward for _, rows in grouped for r in rows if r.valid]
        if rewards:  # every valid trajectory of the batch, used by the loss or not
            result.metrics["reward/mean"] = float(np.mean(rewards))
        all_flat = bool(groups) and counters.counts["skipped/zero_variance_groups"] == len(groups)
        if not scored and all_flat:
            log.info("step %d: every group has equal rewards (dropped); no optimizer step", self.step)
        elif not scored:
            result.alerts.append(f"step {self.step}: no trainable sample in {len(groups)} group(s)")
        else:
            self._train_on(scored, result)
        result.metrics.update(counters.as_metrics())
        result.metrics["step/seconds"] = time.monotonic() - started
        result.metrics["step/policy_version"] = float(self.policy_version)
        result.policy_version = self.policy_version
        for line in result.alerts:
            log.warning("alert: %s", line)
        return result

    def _train_on(self, scored: list[ScoredRow], result: StepResult) -> None:
        opt = self.settings.optim
        chunks = [c for c in np.array_split(np.arange(len(scored)), opt.mini_batches) if len(c)]
        samples_by_chunk = [[s for i in chunk for s in scored[i].row.samples] for chunk in chunks]
        all_samples = [s for chunk in samples_by_chunk for s in chunk]
        old = [lp for chunk in samples_by_chunk for lp in self._logprobs(self.model, chunk)]
        old_by_sample = {id(s): lp for s, lp in zip(all_samples, old, strict=True)}
        result.metrics.update(self._agreement(all_samples, old, result))
        result.metrics["batch/samples"] = float(len(all_samples))
        result.metrics["batch/trajectories"] = float(len(scored))
        result.metrics["batch/policy_tokens"] = float(sum(s.num_policy_tokens for s in all_samples))
        updated = True
        for j, chunk in enumerate(chunks):
            samples = samples_by_chunk[j]
            current = [old_by_sample[id(s)] for s in samples] if j == 0 else self._logprobs(self.model, samples)
            metrics = self._update([scored[i] for i in chunk], samples, current, old_by_sample, result)
            updated = updated and metrics is not None
            if metrics is None:
                break
            result.metrics.update(metrics)
        if updated:
            self.policy_version += 1
            result.updated = True

    def _logprobs(self, model: torch.nn.Module, samples: Sequence[Sample]) -> list[torch.Tensor]:
        opt = self.settings.optim
        return forward.logprobs_no_grad(
            model, samples, opt.token_budget, self.routes, self.settings.rollout.temperature, opt.logit_chunk_tokens
        )

    def _agreement(self, samples: Sequence[Sample], train: Sequence[torch.Tensor], result: StepResult) -> dict:
        """Agreement on tokens sampled by exactly these weights; IS and staleness over all tokens."""
        algo = self.settings.algo
        t_all, r_all, t_now, r_now, stale = [], [], [], [], []
        for s, lp in zip(samples, train, strict=True):
            t, r, v = lp.numpy()[s.mask], s.rollout_logprobs[s.mask], s.versions[s.mask]
            t_all.append(t)
            r_all.append(r)
            t_now.append(t[v == self.policy_version])
            r_now.append(r[v == self.policy_version])
            stale.append(self.policy_version - v)
        now = agreement.compute(np.concatenate(t_now), np.concatenate(r_now))
        every = agreement.compute(np.concatenate(t_all), np.concatenate(r_all))
        result.alerts += agreement.alerts(now, algo.agreement_min_pearson, algo.agreement_min_ess)
        staleness = np.concatenate(stale)
        out = now.as_metrics("agreement") | every.as_metrics("is")
        out["staleness/mean"] = float(staleness.mean())
        out["staleness/max"] = float(staleness.max())
        return out

    def _update(
        self,
        scored: list[ScoredRow],
        samples: list[Sample],
        current: list[torch.Tensor],
        old: dict[int, torch.Tensor],
        result: StepResult,
    ) -> dict[str, float] | None:
        """One optimizer step on ``samples``; None (and an alert) if it was skipped."""
        algo, opt = self.settings.algo, self.settings.optim
        layout, inputs = self._loss_inputs(scored, samples, current, [old[id(s)] for s in samples])
        log_prob = inputs.log_prob
        loss, metrics = policy_loss(inputs, algo)
        loss.backward()
        grad = log_prob.grad
        if not math.isfinite(float(loss.detach())) or grad is None or not torch.isfinite(grad).all():
            result.alerts.append(f"step {self.step}: non-finite loss {float(loss.detach())}; update skipped")
            result.metrics["step/skipped_nan"] = 1.0
            return None
        forward.backward_through(
            self.model,
            samples,
            layout.gather(grad),
            opt.token_budget,
            self.routes,
            self.settings.rollout.temperature,
            opt.logit_chunk_tokens,
        )
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), opt.grad_clip)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            result.alerts.append(f"step {self.step}: non-finite gradient norm; update skipped")
            result.metrics["step/skipped_nan"] = 1.0
            return None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics["optim/grad_norm"] = float(norm)
        metrics["optim/lr"] = opt.lr
        return metrics

    def _loss_inputs(
        self, scored: list[ScoredRow], samples: list[Sample], current: list[torch.Tensor], old: list[torch.Tensor]
    ) -> tuple[RowLayout, LossInputs]:
        """[trajectory, policy token] rows (see ``losses``); ``log_prob`` is a leaf that collects dL/dlp."""
        row_of = {id(s): i for i, r in enumerate(scored) for s in r.row.samples}
        layout = RowLayout.build([row_of[id(s)] for s in samples], [s.num_policy_tokens for s in samples], len(scored))

        def rows(values: Sequence[torch.Tensor]) -> torch.Tensor:
            return layout.scatter([v[torch.from_numpy(s.mask)] for s, v in zip(samples, values, strict=True)])

        ref = self._logprobs(self.ref_model, samples) if self.ref_model is not None else None
        inputs = LossInputs(
            log_prob=rows(current).requires_grad_(),
            old_log_prob=rows(old),
            rollout_log_prob=rows([torch.from_numpy(s.rollout_logprobs) for s in samples]),
            advantages=rows([torch.full((s.response_len,), scored[row_of[id(s)]].advantage) for s in samples]),
            mask=layout.mask(),
            ref_log_prob=rows(ref) if ref is not None else None,
        )
        return layout, inputs

    def evaluate(self, groups: Sequence[Group], algo: AlgoSettings | None = None) -> dict[str, float]:
        """The loss of ``groups`` under the current weights, without updating anything.

        By default against the engine's logprobs as the old policy and without
        clipping: after a step, this is the surrogate objective it improved.
        """
        algo = algo or self.settings.algo.model_copy(
            update={"proximal": "rollout", "clip_ratio_low": 1.0, "clip_ratio_high": 10.0, "clip_ratio_c": 1e9}
        )
        counters = StepCounters()
        grouped = [(gid, build_rows(trajs, counters, self.settings.optim.max_seq_len)) for gid, trajs in groups]
        scored = [r for r in score_groups(grouped, algo, counters) if r.row.samples]
        samples = [s for r in scored for s in r.row.samples]
        if not samples:
            return {}
        current = self._logprobs(self.model, samples)
        _, inputs = self._loss_inputs(scored, samples, current, current)
        _, metrics = policy_loss(inputs, algo)
        return metrics

    # -- checkpoints ------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        return checkpoint.save(directory, self.model, self.optimizer, self.source_dir, self.step, self.policy_version)

    def restore(self, directory: Path) -> None:
        """Loads weights, optimizer state and counters written by ``save``; resumes bit-exact."""
        state = checkpoint.load(directory, self.model, self.optimizer)
        self.step, self.policy_version = state.step, state.policy_version
