"""Sampling math of the local engine, kept apart so tests can pin it.

The logprob the engine reports for a sampled token is taken from the very
distribution it sampled from ("processed": temperature, then top-k, then
top-p, renormalised), or from the raw logits ("raw"). Greedy decoding
(temperature 0) reports the raw log-softmax, the only non-degenerate choice.
A trainer recomputing logprobs must apply the same processing to match.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt
import torch

from services.gateway.engines.base import Sampling


def sampling_logprobs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Log-probabilities [V] of the distribution tokens are sampled from; -inf
    where top-k/top-p removed a token. ``logits`` is fp32 [V]."""
    if sampling.temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scores = logits / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if 0 < sampling.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        before = torch.cumsum(probs, dim=-1) - probs
        sorted_scores = sorted_scores.masked_fill(before >= sampling.top_p, float("-inf"))
        scores = torch.empty_like(scores).scatter_(0, order, sorted_scores)
    return torch.log_softmax(scores, dim=-1)


def make_generator(seed: int) -> torch.Generator:
    """A per-request generator: seeded when asked, else from the OS."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed else int.from_bytes(os.urandom(8), "little") >> 1)
    return generator


def sample(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator, raw_logprobs: bool = False
) -> tuple[int, float]:
    """Samples one token from fp32 ``logits`` [V]; returns (id, logprob)."""
    logprobs = sampling_logprobs(logits, sampling)
    if sampling.temperature == 0:
        token = int(torch.argmax(logits))
    else:
        token = int(torch.multinomial(torch.exp(logprobs), 1, generator=generator))
    if raw_logprobs and sampling.temperature != 0:
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    return token, float(logprobs[token])


def top_logprobs(
    logits: torch.Tensor, sampling: Sampling, raw_logprobs: bool = False
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """The ``sampling.top_logprobs`` most likely tokens of fp32 ``logits`` [V] and
    their logprobs, under the distribution ``sample`` reports the sampled token's
    logprob from (so they rank with it). Reported only; sampling never sees them."""
    raw = raw_logprobs and sampling.temperature != 0
    logprobs = torch.log_softmax(logits, dim=-1) if raw else sampling_logprobs(logits, sampling)
    values, ids = torch.topk(logprobs, min(sampling.top_logprobs, logprobs.shape[-1]))
    return ids.numpy().astype(np.int32), values.numpy().astype(np.float32)
