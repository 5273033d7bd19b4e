"""One training input: a captured segment's arrays, as ``forward`` and ``r3`` read them.

Kept apart from ``samples`` (which decodes capture records, hence protobuf) so
code that only computes logprobs imports numpy and nothing else here: the GPU
check (``stack/bench/gpu_check.py``) runs where only torch and transformers exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Sample:
    """One segment as a training input. Arrays cover the response only, except
    ``input_ids`` (prompt then response)."""

    trial_id: str
    segment: str  # "thread/index", for log lines
    input_ids: npt.NDArray[np.int64]
    prompt_len: int
    mask: npt.NDArray[np.bool_]  # [R] True = sampled by the policy (trainable)
    rollout_logprobs: npt.NDArray[np.float32]  # [R] engine's logprobs (0 where mask is False)
    versions: npt.NDArray[np.int32]  # [R] policy version per token (-1 where mask is False)
    routes: npt.NDArray[np.uint8] | None  # [R, layers, top_k] for R3, rows valid where mask is True
    # The temperature the engine sampled this segment with (its recorded sampling; 1.0 for
    # greedy, whose logprobs are the raw log-softmax); None: not recorded, the run's applies.
    temperature: float | None = None

    @property
    def response_len(self) -> int:
        return len(self.mask)

    @property
    def num_policy_tokens(self) -> int:
        return int(self.mask.sum())
