"""check_faithful on a reply the proxy cut (a stop string) after the engine had
finished it: the engine runs ahead of its consumer, so its record says "stop" with
more ids than were captured. The prefix is faithful only where the conversation went
on from the cut (the segment's next token, or a later call's prompt); a capture that
lost the tail of a reply the harness was given stays unfaithful."""

from __future__ import annotations

from typing import Any

import pytest

from stack.conformance.proxy_stack import Unfaithful, check_faithful


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


def test_a_cut_last_turn_the_proxy_closed_at_the_cut_is_faithful() -> None:
    # The trial's last call: the template closed the turn (5, mask 0) right after 7 8.
    check_faithful([segment([7, 8, 5], [1, 1, 0])], [FIRST], "t")


def test_a_finished_reply_captured_short_without_evidence_is_unfaithful() -> None:
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8], [1, 1])], [FIRST], "t")


def test_a_lost_tail_of_a_reply_the_harness_was_given_is_unfaithful() -> None:
    # The next call's prompt holds the whole reply (9 0 came back as context): only 7 8 were captured as sampled.
    log = [FIRST, gen([1, 2, 7, 8, 9, 0, 5], [11, 0])]
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8, 9, 0, 5, 11, 0], [1, 1, 0, 0, 0, 1, 1])], log, "t")
    # The segment alone shows it too: the rest of the reply follows the run as mask 0.
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8, 9, 0], [1, 1, 0, 0])], [FIRST], "t")


def test_the_evidence_must_come_from_the_same_thread() -> None:
    other = gen([1, 2, 7, 8, 5, 6], [11, 0]) | {"thread": "side"}
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8], [1, 1])], [FIRST, other], "t")


def test_a_segment_ending_at_the_cut_is_faithful_when_a_later_call_went_on_from_it() -> None:
    later = segment([11, 0], [1, 1]) | {"segment_index": 1, "prompt_ids": [1, 2, 7, 8, 5, 6]}
    log = [FIRST, gen([1, 2, 7, 8, 5, 6], [11, 0])]
    check_faithful([segment([7, 8], [1, 1]), later], log, "t")


def test_a_segment_ending_at_the_cut_needs_the_callers_word_that_a_stop_sequence_ended_it() -> None:
    with pytest.raises(Unfaithful, match="matches 0"):
        check_faithful([segment([7, 8], [1, 1])], [FIRST], "t")
    check_faithful([segment([7, 8], [1, 1])], [FIRST], "t", stopped=True)
    with pytest.raises(Unfaithful, match="matches 0"):  # the word covers a cut, not a changed token
        check_faithful([segment([7, 9], [1, 1])], [FIRST], "t", stopped=True)
