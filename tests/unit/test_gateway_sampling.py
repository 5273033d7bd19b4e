"""Sampling math of the local engine: temperature, top-k, top-p, greedy, seeds,
and that the reported logprob is the sampled distribution's."""

from __future__ import annotations

import math

import pytest
import torch

from services.gateway.engines.base import Sampling
from services.gateway.sampling import make_generator, sample, sampling_logprobs

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_one_without_filters_is_log_softmax() -> None:
    got = sampling_logprobs(LOGITS, Sampling(temperature=1.0))
    assert torch.allclose(got, torch.log_softmax(LOGITS, -1))


def test_temperature_scales_logits() -> None:
    got = sampling_logprobs(LOGITS, Sampling(temperature=0.5))
    assert torch.allclose(got, torch.log_softmax(LOGITS / 0.5, -1))
    assert math.isclose(float(torch.logsumexp(got, -1)), 0.0, abs_tol=1e-6)


def test_top_k_keeps_k_best_renormalised() -> None:
    got = sampling_logprobs(LOGITS, Sampling(temperature=1.0, top_k=2))
    assert torch.isinf(got[2:]).all() and torch.isfinite(got[:2]).all()
    assert torch.allclose(got[:2], torch.log_softmax(LOGITS[:2], -1))


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    probs = torch.softmax(LOGITS, -1)  # ~[0.57, 0.21, 0.13, 0.08, 0.03, 0.004]
    p = float(probs[0] + probs[1]) - 1e-4
    got = sampling_logprobs(LOGITS, Sampling(temperature=1.0, top_p=p))
    assert torch.isfinite(got[:2]).all() and torch.isinf(got[2:]).all()
    # p just above the first two tokens' mass keeps a third.
    got = sampling_logprobs(LOGITS, Sampling(temperature=1.0, top_p=float(probs[0] + probs[1]) + 1e-4))
    assert torch.isfinite(got[:3]).all() and torch.isinf(got[3:]).all()
    # A tiny p still keeps the top token.
    got = sampling_logprobs(LOGITS, Sampling(temperature=1.0, top_p=1e-6))
    assert float(got[0]) == 0.0 and torch.isinf(got[1:]).all()


def test_top_p_applies_to_unsorted_logits() -> None:
    shuffled = LOGITS[torch.tensor([3, 0, 5, 1, 4, 2])]
    got = sampling_logprobs(shuffled, Sampling(temperature=1.0, top_p=0.7))
    kept = {int(i) for i in torch.nonzero(torch.isfinite(got)).flatten()}
    assert kept == {1, 3}  # logits 2.0 and 1.0


def test_greedy_takes_argmax_and_reports_raw_logprob() -> None:
    token, logprob = sample(LOGITS, Sampling(temperature=0.0), make_generator(1))
    assert token == 0
    assert math.isclose(logprob, float(torch.log_softmax(LOGITS, -1)[0]), rel_tol=1e-6)


def test_sampled_logprob_is_from_the_sampling_distribution() -> None:
    s = Sampling(temperature=0.7, top_k=3)
    expected = sampling_logprobs(LOGITS, s)
    for seed in range(1, 30):
        token, logprob = sample(LOGITS, s, make_generator(seed))
        assert token < 3 and logprob == pytest.approx(float(expected[token]), abs=1e-6)
        _, raw = sample(LOGITS, s, make_generator(seed), raw_logprobs=True)
        assert raw == pytest.approx(float(torch.log_softmax(LOGITS, -1)[token]), abs=1e-6)


def test_seeded_sampling_is_reproducible_and_matches_the_distribution() -> None:
    s = Sampling(temperature=1.0)
    a = [sample(LOGITS, s, g)[0] for g in [make_generator(7)] for _ in range(50)]
    b = [sample(LOGITS, s, g)[0] for g in [make_generator(7)] for _ in range(50)]
    assert a == b
    generator = make_generator(11)
    counts = torch.zeros(6)
    for _ in range(4000):
        counts[sample(LOGITS, s, generator)[0]] += 1
    assert torch.allclose(counts / 4000, torch.softmax(LOGITS, -1), atol=0.03)
