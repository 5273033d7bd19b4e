"""Samples are the captured bytes, untouched; bad input is skipped and counted, never a crash."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from harnessrl import arrays
from services.trainer.forward import collate, plan
from services.trainer.samples import StepCounters, build_rows
from tests.trainer_support import TR, segment, trajectory


def build(*trajs, max_seq_len: int = 1024):  # type: ignore[no-untyped-def]
    counters = StepCounters()
    return build_rows(list(trajs), counters, max_seq_len), counters


def test_sample_is_the_captured_tokens_exactly() -> None:
    seg = segment([7, 8, 9], [10, 11, 12, 13], [1, 1, 0, 1], [-0.5, -1.5, 0.0, -2.5], [3, 4, -1, 4])
    rows, counters = build(trajectory("t", "g", 1.0, [seg]))
    (sample,) = rows[0].samples
    assert sample.input_ids.tolist() == [7, 8, 9, 10, 11, 12, 13]
    assert sample.prompt_len == 3
    assert sample.mask.tolist() == [True, True, False, True]
    assert sample.rollout_logprobs.tolist() == [-0.5, -1.5, 0.0, -2.5]
    assert sample.versions.tolist() == [3, 4, -1, 4]
    assert rows[0].min_version == 3 and rows[0].num_policy_tokens == 3
    assert counters.counts["segments/used"] == 1


def test_routes_come_through() -> None:
    routes = np.arange(2 * 3 * 2, dtype=np.uint8).reshape(2, 3, 2)
    rows, _ = build(trajectory("t", "g", 1.0, [segment([1], [2, 3], [1, 1], [-1, -1], routes=routes)]))
    assert rows[0].samples[0].routes is not None
    assert rows[0].samples[0].routes.tolist() == routes.tolist()


@pytest.mark.parametrize(
    ("seg", "reason"),
    [
        (segment([1, 2], [3, 4], [1, 1], [-1.0]), "bad_lengths"),
        (segment([1, 2], [3, 4], [1, 1], [-1.0, float("nan")]), "bad_logprobs"),
        (segment([1, 2], [3, 4], [1, 1], [-1.0, float("inf")]), "bad_logprobs"),
        (segment([1, 2], [3, 4], [1, 1], [-1.0, float("-inf")]), "bad_logprobs"),
        (segment([1, 2], [3, 4], [1, 1], [-1.0, 0.5]), "bad_logprobs"),
        (segment([1, 2], [3, 4], [0, 0], [0.0, 0.0]), "all_masked"),
        (segment([1, 2], [], [], []), "all_masked"),
        (segment([], [3, 4], [1, 1], [-1.0, -1.0]), "empty_prompt"),
        (segment([1, 2], [3, 4], [1, 1], [-1.0, -1.0], [0, -1]), "bad_versions"),
        (segment([1, 2] * 600, [3, 4], [1, 1], [-1.0, -1.0]), "too_long"),
        (segment([1, -2], [3, 4], [1, 1], [-1.0, -1.0]), "bad_token_ids"),
    ],
)
def test_bad_segments_are_skipped_with_a_counter_and_a_log_line(
    seg: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = segment([1, 2], [3, 4], [1, 1], [-1.0, -1.0], index=1)
    with caplog.at_level(logging.WARNING):
        rows, counters = build(trajectory("t", "g", 1.0, [seg, good]))  # type: ignore[list-item]
    assert counters.counts[f"skipped/{reason}"] == 1
    assert len(rows[0].samples) == 1 and rows[0].samples[0].segment == "main/1"
    assert any(reason in r.getMessage() and "trial=t" in r.getMessage() for r in caplog.records)


def test_misaligned_byte_arrays_are_skipped() -> None:
    seg = segment([1, 2], [3, 4], [1, 1], [-1.0, -1.0])
    seg.response.logprobs = seg.response.logprobs[:-1]  # 7 bytes: not whole float32s
    rows, counters = build(trajectory("t", "g", 1.0, [seg]))
    assert counters.counts["skipped/bad_lengths"] == 1 and rows[0].samples == ()


@pytest.mark.parametrize(
    ("reason", "valid"),
    [
        (TR.TERMINATION_REASON_COMPLETED, True),
        (TR.TERMINATION_REASON_MAX_TURNS, True),
        (TR.TERMINATION_REASON_CONTEXT_OVERFLOW, True),
        (TR.TERMINATION_REASON_AGENT_TIMEOUT, True),
        (TR.TERMINATION_REASON_VERIFIER_TIMEOUT, False),
        (TR.TERMINATION_REASON_ENV_SETUP_FAILED, False),
        (TR.TERMINATION_REASON_VERIFIER_ERROR, False),
        (TR.TERMINATION_REASON_ENGINE_ERROR, False),
        (TR.TERMINATION_REASON_CANCELLED, False),
        (TR.TERMINATION_REASON_UNSPECIFIED, False),
    ],
)
def test_infra_reasons_get_weight_zero_and_are_counted(reason: int, valid: bool) -> None:
    seg = segment([1, 2], [3, 4], [1, 1], [-1.0, -1.0])
    rows, counters = build(trajectory("t", "g", 0.0, [seg], reason))
    assert rows[0].valid is valid
    assert len(rows[0].samples) == (1 if valid else 0)
    name = TR.Name(reason).removeprefix("TERMINATION_REASON_").lower()
    assert counters.counts[f"termination/{name}"] == 1


def test_policy_outcome_without_reward_is_not_turned_into_zero() -> None:
    rows, counters = build(trajectory("t", "g", 0.0, [], has_reward=False))
    assert not rows[0].valid and counters.counts["skipped/missing_reward"] == 1
    rows, counters = build(trajectory("t", "g", float("nan"), []))
    assert not rows[0].valid and counters.counts["skipped/bad_reward"] == 1


def test_non_trainable_threads_are_counted_not_trained() -> None:
    seg = segment([1], [2], [1], [-1.0], trainable=False, thread="title")
    rows, counters = build(trajectory("t", "g", 1.0, [seg]))
    assert rows[0].samples == () and counters.counts["segments/not_trainable"] == 1


def test_micro_batches_respect_the_token_budget_and_left_pad() -> None:
    segs = [segment([1] * n, [2, 3], [1, 1], [-1.0, -1.0], index=i) for i, n in enumerate([10, 2, 6, 3])]
    rows, _ = build(trajectory("t", "g", 1.0, segs))
    samples = rows[0].samples
    groups = plan(samples, token_budget=16)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    for g in groups:
        width = max(len(samples[i].input_ids) for i in g)
        assert width * len(g) <= 16 or len(g) == 1
    batch = collate([samples[1], samples[0]])
    assert batch.input_ids.shape == (2, 12)
    assert batch.input_ids[0].tolist() == [0] * 8 + [1, 1, 2, 3]
    assert batch.attention_mask[0].tolist() == [0] * 8 + [1] * 4
    assert batch.position_ids[0, -4:].tolist() == [0, 1, 2, 3] and batch.keep == 3
    assert arrays.unpack_i32(segs[0].prompt_ids).tolist() == [1] * 10


def test_each_sample_carries_its_segments_sampling_temperature() -> None:
    from harnessrl.v1 import records_pb2

    segs = [segment([1], [2, 3], [1, 1], [-1, -1], index=i) for i in range(4)]
    segs[0].sampling.CopyFrom(records_pb2.SegmentSampling(temperature=0.7, top_p=1.0, mode="pin"))
    segs[1].sampling.CopyFrom(records_pb2.SegmentSampling(temperature=0.0, top_p=1.0, mode="honour"))  # greedy
    segs[2].sampling.CopyFrom(records_pb2.SegmentSampling(temperature=1.0, top_p=0.95, top_k=64, mode="honour"))
    rows, counters = build(trajectory("t", "g", 1.0, segs))
    temps = [s.temperature for s in rows[0].samples]
    # greedy reported raw log-softmax: trained at 1.0; the last recorded none: the run's (None)
    assert temps == [pytest.approx(0.7), 1.0, 1.0, None]
    assert counters.counts["segments/sampling_unrecorded"] == 1
    assert counters.counts["segments/truncated_sampling"] == 1
