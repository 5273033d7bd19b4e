"""check_faithful on a reply the proxy cut (a stop string) after the engine had
finished it: the engine runs ahead of its consumer, so its record says "stop" with
more ids than were captured. The prefix is faithful only with the engine's evidence
that the conversation went on from the cut; a capture that lost the tail of a reply
the harness was given stays unfaithful."""

from __future__ import annotations

from typing import Any

import pytest

from stack.conformance_stack import Unfaithful, check_faithful


def gen(prompt: list[int], ids: list[int], finish: str = "stop") -> dict[str, Any]:
    return {
        "trial_id": "t",
        "thread": "main",
        "prompt_ids": prompt,
        "sampled_ids": ids,
        "logprobs": [-0.5] * len(ids),
        "policy_versions": [3] * len(ids),
        "finish_reason": finish,
    }


def segment(ids: list[int], mask: list[int]) -> dict[str, Any]:
    return {
        "thread": "main",
        "segment_index": 0,
        "prompt_ids": [1, 2],
        "response_ids": ids,
        "response_mask": mask,
        "response_logprobs": [-0.5 if m else 0.0 for m in mask],
        "policy_versions": [3 if m else -1 for m in mask],
    }


FIRST = gen([1, 2], [7, 8, 9, 0])  # the engine sampled to its eos (0)


def test_a_cut_the_conversation_went_on_from_is_faithful() -> None:
    # Captured 7 8, then the template closed the turn (5 6) and the next call went on from there.
    log = [FIRST, gen([1, 2, 7, 8, 5, 6], [11, 0])]
    check_faithful([segment([7, 8, 5, 6, 11, 0], [1, 1, 0, 0, 1, 1])], log, "t")


def test_a_finished_reply_captured_short_without_evidence_is_unfaithful() -> None:
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8], [1, 1])], [FIRST], "t")


def test_a_lost_tail_of_a_reply_the_harness_was_given_is_unfaithful() -> None:
    # The next call's prompt holds the whole reply (9 0 came back as context): only 7 8 were captured as sampled.
    log = [FIRST, gen([1, 2, 7, 8, 9, 0, 5], [11, 0])]
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8, 9, 0, 5, 11, 0], [1, 1, 0, 0, 0, 1, 1])], log, "t")


def test_the_evidence_must_come_from_the_same_thread() -> None:
    other = gen([1, 2, 7, 8, 5, 6], [11, 0]) | {"thread": "side"}
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8], [1, 1])], [FIRST, other], "t")
