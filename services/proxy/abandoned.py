"""A turn whose client left mid-answer: the harness never received it, so it is no
part of the trajectory (invariant 1) and is not trained. What the engine had sampled
is kept for audit in an ``abandoned`` thread (``TrialCapture.abandoned``) and counted
(the trial's ``abandoned_turns``/``abandoned_tokens``,
``harnessrl_tokens_total{kind="abandoned"}``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from harnessrl import metrics
from harnessrl.v1 import records_pb2
from services.proxy.errors import EngineFailure
from services.proxy.replies import sampled_reply, submit_parts

if TYPE_CHECKING:
    from services.proxy.turn import ModelCall


def keep_abandoned(call: ModelCall, versions: list[bytes], routes: list[np.ndarray]) -> None:
    """Captures what ``call``'s engine sampled before its client left, untrainable."""
    trial, plan = call.trial, call.plan
    if not call.received_ids or trial.closed or plan is None:
        return
    try:
        sampled = sampled_reply(
            call.received_ids, call.received_logprobs, versions, routes, "abort", call.core.model.tokenizer.stop_ids
        )
    except EngineFailure:
        return  # arrays that do not line up: nothing to keep (counted by sampled_reply)
    sampling = call.sampling.record() if call.sampling is not None else None
    parts = trial.capture.abandoned(plan, sampled, sampling)
    trial.abandoned_turns += 1
    trial.abandoned_tokens += sampled.num_tokens
    metrics.TOKENS.labels("proxy", "abandoned").inc(sampled.num_tokens)
    usage = records_pb2.Usage(prompt_tokens=plan.prompt_tokens, completion_tokens=sampled.num_tokens)
    submit_parts(call.core, trial, parts, sampled, "abort", usage)
