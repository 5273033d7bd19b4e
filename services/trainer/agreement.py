"""Train/inference agreement: how far the training forward's logprobs are
from the engine's, for the tokens the engine sampled.

Computed every step (and offline by ``harnessrl train agreement``). A broken
chat template, a tokenizer mismatch, a wrong weight sync or a kernel bug all
show up here first: the first thing to look at when a run looks wrong.

Only tokens sampled by the very weights being compared are in ``agreement/*``
(with staleness k > 0 older tokens differ because the weights differ, not
because something is broken); the importance weights over *all* tokens are
reported as ``is/*``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Agreement:
    tokens: int
    pearson: float
    mean_abs_diff: float
    max_abs_diff: float
    log_ratio_quantiles: dict[float, float]
    ess: float  # normalised effective sample size of exp(train - rollout), in (0, 1]

    def as_metrics(self, prefix: str = "agreement") -> dict[str, float]:
        out = {
            f"{prefix}/tokens": float(self.tokens),
            f"{prefix}/pearson": self.pearson,
            f"{prefix}/mean_abs_diff": self.mean_abs_diff,
            f"{prefix}/max_abs_diff": self.max_abs_diff,
            f"{prefix}/ess": self.ess,
        }
        out.update({f"{prefix}/log_ratio_q{int(q * 100):02d}": v for q, v in self.log_ratio_quantiles.items()})
        return out


def pearson(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """Pearson correlation; 1.0 when both are constant and equal (nothing disagrees), NaN if undefined."""
    if len(a) < 2:
        return 1.0 if np.array_equal(a, b) else math.nan
    sa, sb = a.std(), b.std()
    if sa == 0 or sb == 0:
        return 1.0 if np.allclose(a, b) else 0.0
    return float(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb))


def effective_sample_size(log_w: npt.NDArray[np.float64]) -> float:
    """(sum w)^2 / (n sum w^2), computed in log space; 1.0 means all weights equal."""
    if len(log_w) == 0:
        return 1.0
    shifted = np.exp(log_w - log_w.max())
    return float(shifted.sum() ** 2 / (len(log_w) * (shifted**2).sum()))


def compute(train_logprobs: npt.ArrayLike, rollout_logprobs: npt.ArrayLike) -> Agreement:
    """Agreement of two aligned vectors of sampled-token logprobs."""
    t = np.asarray(train_logprobs, dtype=np.float64)
    r = np.asarray(rollout_logprobs, dtype=np.float64)
    if t.shape != r.shape:
        raise ValueError(f"shapes differ: {t.shape} vs {r.shape}")
    if len(t) == 0:
        return Agreement(0, math.nan, math.nan, math.nan, {q: math.nan for q in QUANTILES}, math.nan)
    diff = t - r
    quantiles = {q: float(v) for q, v in zip(QUANTILES, np.quantile(diff, QUANTILES), strict=True)}
    return Agreement(
        tokens=len(t),
        pearson=pearson(t, r),
        mean_abs_diff=float(np.abs(diff).mean()),
        max_abs_diff=float(np.abs(diff).max()),
        log_ratio_quantiles=quantiles,
        ess=effective_sample_size(diff),
    )


def alerts(agreement: Agreement, min_pearson: float, min_ess: float) -> list[str]:
    """The step's alert lines (shown by the dashboard), empty when all is well."""
    out = []
    if agreement.tokens and not agreement.pearson >= min_pearson:
        out.append(f"train/inference agreement low: pearson {agreement.pearson:.4f} < {min_pearson}")
    if agreement.tokens and not agreement.ess >= min_ess:
        out.append(f"importance weights degenerate: ESS {agreement.ess:.3f} < {min_ess}")
    return out
