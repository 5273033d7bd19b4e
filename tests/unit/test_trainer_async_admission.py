"""The admission policy shared by the loop and the simulator: k = 0 is synchronous,
no admitted group is trained more than k versions behind, slots are never exceeded,
and selection never deadlocks whatever order groups finish in."""

from __future__ import annotations

import numpy as np
import pytest

from services.trainer.admission import Admission


def drive(
    adm: Admission, steps: int, rng: np.random.Generator, slots: int | None, keep_p: float = 0.0
) -> tuple[list[list[str]], dict[str, int], list[tuple[str, int]]]:
    """Admits whatever the policy allows, trains whenever it selects a batch, else finishes a
    random running group (any order: stragglers included); a step keeps the weights with
    probability ``keep_p`` (nothing trainable). Returns batches, tags, admissions."""
    version, running = 0, []
    tags: dict[str, int] = {}
    admissions: list[tuple[str, int]] = []
    batches: list[list[str]] = []

    def admit_all() -> None:
        for _ in range(adm.admissible(version)):
            step, index = adm.next_slot()
            gid = f"s{step}-g{index}"
            adm.admit(gid, version)
            tags[gid] = version
            admissions.append((gid, version))
            running.append(gid)
            assert slots is None or adm.running_trials <= slots
        assert adm.admissible(version) == 0

    def finish_one() -> None:
        gid = running.pop(int(rng.integers(len(running))))
        adm.ready(gid, tags[gid])

    while len(batches) < steps:
        admit_all()
        sel = adm.select(version)
        assert sel.dropped == []  # nothing this policy admitted is ever dropped
        if not sel.batch:
            assert running, "selection waits for nothing that is running: a deadlock"
            finish_one()
            continue
        assert len(sel.batch) == adm.b
        for gid, stale in zip(sel.batch, sel.staleness, strict=True):
            assert stale == version - tags[gid]
            assert 0 <= stale <= adm.k
        batches.append(sel.batch)
        for _ in range(int(rng.integers(0, 4))):  # while the step trains, groups finish and new ones start
            if running:
                finish_one()
                admit_all()
        version += int(rng.random() >= keep_p)
        adm.step_done()
    return batches, tags, admissions


def test_k0_is_synchronous_order() -> None:
    adm = Admission(groups_per_step=3, max_staleness=0, group_size=4, slots=64)
    batches, tags, admissions = drive(adm, 5, np.random.default_rng(0), 64)
    # Batch s is exactly the groups admitted at version s, admitted only once version s is out.
    assert [sorted(b) for b in batches] == [[f"s{s}-g{i}" for i in range(3)] for s in range(5)]
    assert [v for _, v in admissions] == [s for s in range(5) for _ in range(3)]
    assert all(tags[g] == s for s, b in enumerate(batches) for g in b)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("slots", [None, 8, 20, 36])
@pytest.mark.parametrize("seed", range(6))
def test_never_stale_never_over_capacity_never_stuck(k: int, slots: int | None, seed: int) -> None:
    adm = Admission(groups_per_step=4, max_staleness=k, group_size=4, slots=slots)
    keep_p = 0.3 if seed % 2 else 0.0  # odd seeds: some steps find nothing to train and keep the weights
    batches, _, _ = drive(adm, 12, np.random.default_rng(seed), slots, keep_p)
    assert len(batches) == 12
    trained = [g for b in batches for g in b]
    assert len(trained) == len(set(trained))


def test_k_bounds_how_far_rollouts_run_ahead() -> None:
    adm = Admission(groups_per_step=2, max_staleness=1, group_size=8)
    assert adm.admissible(0) == 4  # k + 1 batches at version 0
    for i in range(4):
        adm.admit(f"g{i}", 0)
    assert adm.admissible(0) == 0 and adm.admissible(1) == 2
    with pytest.raises(RuntimeError, match="window"):
        adm.admit("g4", 0)
    capped = Admission(groups_per_step=2, max_staleness=3, group_size=8, slots=24, max_groups=6)
    assert capped.admissible(0) == 3  # 24 slots hold 3 groups of 8
    capped.admit("a", 0)
    capped.admit("b", 0)
    capped.admit("c", 0)
    capped.ready("a", 0)
    assert capped.running_trials == 16 and capped.admissible(0) == 1
    capped.ready("b", 0)
    capped.ready("c", 0)
    assert capped.admissible(5) == 3  # max_groups: 6 in all
    with pytest.raises(ValueError, match="already"):
        capped.admit("a", 0)


def test_a_step_that_keeps_the_weights_still_opens_the_window() -> None:
    adm = Admission(groups_per_step=2, max_staleness=0, group_size=1)
    for gid in ("a", "b"):
        adm.admit(gid, 0)
        adm.ready(gid, 0)
    assert adm.admissible(0) == 0
    assert sorted(adm.select(0).batch) == ["a", "b"]
    assert adm.admissible(0) == 0  # the step is still running
    adm.step_done()
    assert adm.admissible(0) == 2  # the step found nothing to train: version 0 again, and the next batch starts


def test_last_chance_groups_are_waited_for_and_taken_first() -> None:
    adm = Admission(groups_per_step=2, max_staleness=1, group_size=1)
    for i in range(4):
        adm.admit(f"old{i}", 0)
    for gid in ("old2", "old3"):
        adm.ready(gid, 0)
    assert adm.select(0).batch == ["old2", "old3"]  # version 0: nothing is due yet, the ready ones go
    adm.step_done()
    for i in range(2):
        adm.admit(f"new{i}", 1)
    adm.ready("new0", 1)
    adm.ready("new1", 1)
    adm.ready("old0", 0)
    assert adm.select(1).batch == []  # old1 is due at version 1 (tag 0 + k): wait for it
    adm.ready("old1", 0)
    sel = adm.select(1)
    assert sel.batch == ["old0", "old1"] and sel.staleness == [1, 1]


def test_foreign_groups_join_by_their_oldest_version_and_stale_ones_drop() -> None:
    adm = Admission(groups_per_step=1, max_staleness=1, group_size=1)
    adm.ready("redelivered", 0)
    adm.ready("fresh", 3)
    sel = adm.select(3)
    assert sel.dropped == ["redelivered"] and sel.batch == ["fresh"]
    assert adm.live == 0 and adm.admissible(3) == 5  # foreign groups take no room in the window


def test_a_restart_skips_trained_slots_and_adopts_redelivered_groups() -> None:
    adm = Admission(groups_per_step=2, max_staleness=1, group_size=1, start_version=3, first_step=3)
    adm.ready("run-s00004-g0", 3)  # finished before the restart, redelivered before its slot comes up
    assert adm.next_slot() == (3, 0)
    adm.skip()  # s3-g0 was trained before the restart
    assert adm.next_slot() == (3, 1)
    adm.admit("run-s00003-g1", 3)
    rec = adm.admit("run-s00004-g0", 3)
    assert rec.ready_seq is not None and rec.admitted and adm.live == 2 and adm.running_trials == 1
    assert adm.next_slot() == (4, 1)
    with pytest.raises(ValueError, match="already admitted"):
        adm.admit("run-s00003-g1", 3)


def test_batch_launcher_placeholders_bind_to_ready_groups() -> None:
    adm = Admission(groups_per_step=2, max_staleness=0, group_size=1)
    adm.admit(None, 0)
    adm.admit(None, 0)
    adm.ready("x", 0)
    assert adm.select(0).batch == []  # the other placeholder of version 0 is still running
    adm.ready("y", 0)
    assert sorted(adm.select(0).batch) == ["x", "y"]
    assert adm.next_slot() == (1, 0)
    assert adm.placeholders == [] and adm.running_trials == 0


def test_a_group_sampled_by_older_weights_than_its_tag_is_judged_by_its_tokens() -> None:
    adm = Admission(groups_per_step=1, max_staleness=0, group_size=1)
    adm.admit("g", 2)
    adm.ready("g", 1)  # the gateway still served version 1
    sel = adm.select(2)
    assert sel.dropped == ["g"] and adm.live == 0 and adm.admissible(2) == 3  # a replacement may start


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"groups_per_step": 0, "max_staleness": 1, "group_size": 8}, "groups_per_step"),
        ({"groups_per_step": 1, "max_staleness": -1, "group_size": 8}, "max_staleness"),
        ({"groups_per_step": 1, "max_staleness": 1, "group_size": 8, "slots": 4}, "slots"),
    ],
)
def test_bad_parameters(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Admission(**kwargs)


def test_placeholders_never_hold_a_step_and_expire_after_their_deadline() -> None:
    adm = Admission(groups_per_step=1, max_staleness=1, group_size=1)
    adm.admit(None, 0)
    adm.admit(None, 0)  # a batch launcher's group that never shows up (say, trained before a restart)
    adm.ready("a", 0)
    assert adm.select(0).batch == ["a"]
    adm.step_done()
    adm.admit(None, 1)
    adm.ready("b", 1)  # binds the version-1 placeholder
    assert adm.select(1).batch == ["b"]  # the missing version-0 group is due now, but nobody waits for it
    adm.step_done()
    assert adm.select(2).batch == [] and adm.placeholders == []  # expired: version 2 cannot train it
    assert adm.live == 2 and adm.running_trials == 0
