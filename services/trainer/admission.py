"""Continuous, group-level admission with bounded staleness.

ONE policy, used by the real ``TrainingLoop`` (services/trainer/loop.py) and by
the simulator behind ``harnessrl bench async`` (services/trainer/simulator.py),
so what the simulator predicts is what the loop does.

Admission (rollout side). Rollout slots stay full: whenever capacity frees, a
new group (G trials of one task) is admitted and tagged with the policy version
the gateway serves at that moment (its *tag*). A group is admitted only if it
cannot exceed staleness k when trained:

    live groups admitted so far  <  (max(tag - start_version, steps) + k + 1) * groups_per_step

where ``steps`` counts the steps finished so far (``step_done``: trained, and
new weights, if any, published). So at most
(s - start_version + 1) * B groups carry a tag <= s - k, and the steps before
the one on weights s consume at least (s - start_version) * B, which leaves at
most B groups whose last chance is that step. ``steps`` keeps admission going
when a step consumes its batch without changing the weights (no trainable
sample: all groups all-pass or all-fail), which would otherwise stall k = 0.

``slots`` bounds the rollout fleet in trials: a group holds G slots from its
admission until it is ready (the loop only learns that a group is done, not
each trial; the simulator models the same). ``max_groups`` stops admission once
the planned steps have every group they will train.

Selection (trainer side), earliest deadline first. A group's deadline is tag +
k: the last version it may be trained on. The step that trains weights of
version v takes the B ready groups of oldest tag (ties: the order they became
ready), unless that would leave, for some deadline d, more groups due by d
than the steps up to d can take ((d - v) * B) - then one of them is still
running and the step waits for it. So nothing admitted is ever dropped, and a
straggler holds a step only when its deadline forces it. k = 0 is synchronous
RL: B groups per version, each step waits for all of them.

Groups the policy did not admit (a redelivery after a restart, or any group
written to the store by someone else) are *foreign*: they join with their
oldest sampled version as tag and are dropped (counted) when staler than k; a
foreign group that is ready before its slot comes up is adopted by ``admit``.
Launchers that start whole batches without telling group ids are handled with
anonymous placeholders: a ready group binds the newest placeholder whose tag is
not newer than its oldest sampled version. Placeholders never hold a step (the
policy cannot know which group one stands for, or whether it was trained before
a restart) and expire after their deadline: with a batch launcher, a straggler
can still become too stale and be dropped - the old batch-level behaviour.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class GroupRecord:
    group_id: str | None  # None: a placeholder of a batch launcher, bound when its group is ready
    tag: int  # the policy version served when the group was admitted
    seq: int  # admission order
    trials: int  # slots held until the group is ready
    admitted: bool = True  # False: a foreign group (not counted in the window)
    ready_seq: int | None = None


@dataclass
class Selection:
    batch: list[str] = field(default_factory=list)  # groups to train now (empty: wait)
    dropped: list[str] = field(default_factory=list)  # foreign groups staler than k
    staleness: list[int] = field(default_factory=list)  # trainer version - tag, per group of ``batch``


class Admission:
    def __init__(
        self,
        groups_per_step: int,
        max_staleness: int,
        group_size: int,
        slots: int | None = None,
        start_version: int = 0,
        max_groups: int | None = None,
        first_step: int | None = None,
    ) -> None:
        if groups_per_step < 1 or max_staleness < 0 or group_size < 1:
            raise ValueError("groups_per_step >= 1, max_staleness >= 0 and group_size >= 1")
        if slots is not None and slots < group_size:
            raise ValueError(f"slots ({slots}) must hold at least one group of {group_size} trials")
        self.b, self.k, self.g = groups_per_step, max_staleness, group_size
        self.slots, self.start_version, self.max_groups = slots, start_version, max_groups
        self.first_step = start_version if first_step is None else first_step
        self.live = 0  # admitted and not dropped (consumed ones included)
        self.steps = 0  # steps finished
        self.admitted = 0  # groups ever admitted (names the next one)
        self.running_trials = 0
        self._seq = itertools.count()
        self._ready_seq = itertools.count()
        self.pending: dict[str, GroupRecord] = {}  # by group id: admitted or ready, not yet consumed
        self.placeholders: list[GroupRecord] = []

    # -- rollout side --------------------------------------------------------------------------

    def admissible(self, version: int) -> int:
        """How many groups may start now if tagged ``version``."""
        window = (max(version - self.start_version, self.steps) + self.k + 1) * self.b - self.live
        if self.max_groups is not None:
            window = min(window, self.max_groups - self.live)
        if self.slots is not None:
            window = min(window, (self.slots - self.running_trials) // self.g)
        return max(window, 0)

    def skip(self) -> None:
        """Passes over the next slot (its group was trained before a restart): nothing starts."""
        self.admitted += 1

    def next_slot(self) -> tuple[int, int]:
        """(step, index) of the next group: the index-th group of the step-th batch since the start."""
        return self.first_step + self.admitted // self.b, self.admitted % self.b

    def admit(self, group_id: str | None, version: int) -> GroupRecord:
        """Records an admitted group (``group_id`` None: a batch launcher's group, id unknown yet).

        A foreign group already known under ``group_id`` (ready before its slot came up, e.g. a
        redelivery after a restart) is adopted: it takes the slot and needs no launch (its
        ``trials`` is 0).
        """
        if self.admissible(version) < 1:
            raise RuntimeError("admission refused: the staleness window or the rollout slots are full")
        known = self.pending.get(group_id) if group_id is not None else None
        if known is not None:
            if known.admitted:
                raise ValueError(f"group {group_id!r} is already admitted")
            known.admitted = True
            self.live += 1
            self.admitted += 1
            return known
        rec = GroupRecord(group_id, version, next(self._seq), self.g)
        self.live += 1
        self.admitted += 1
        self.running_trials += self.g
        if group_id is None:
            self.placeholders.append(rec)
        else:
            self.pending[group_id] = rec
        return rec

    def ready(self, group_id: str, oldest_version: int | None = None) -> GroupRecord:
        """A group is complete: its slots free; foreign groups join with their oldest sampled version."""
        rec = self.pending.get(group_id)
        if rec is None:
            rec = self._bind(group_id, oldest_version)
        elif oldest_version is not None and oldest_version < rec.tag:
            rec.tag = oldest_version  # sampled by older weights than served at admission: the tokens decide
        if rec.ready_seq is not None:
            return rec
        rec.ready_seq = next(self._ready_seq)
        self.running_trials -= rec.trials
        rec.trials = 0
        return rec

    def _bind(self, group_id: str, oldest_version: int | None) -> GroupRecord:
        fits = [p for p in self.placeholders if oldest_version is None or p.tag <= oldest_version]
        if fits:
            rec = max(fits, key=lambda p: (p.tag, -p.seq))
            self.placeholders.remove(rec)
            rec.group_id = group_id
        else:
            tag = oldest_version if oldest_version is not None else self.start_version
            rec = GroupRecord(group_id, tag, next(self._seq), 0, admitted=False)
        self.pending[group_id] = rec
        return rec

    # -- trainer side --------------------------------------------------------------------------

    def select(self, version: int) -> Selection:
        """The batch for the step that trains weights ``version``, or an empty batch: wait."""
        out = Selection()
        for gid, rec in list(self.pending.items()):
            if rec.ready_seq is not None and version - rec.tag > self.k:
                out.dropped.append(gid)
                del self.pending[gid]
                if rec.admitted:
                    self.live -= 1  # its place in the window goes to a replacement
        for rec in [p for p in self.placeholders if p.tag + self.k < version]:
            self.placeholders.remove(rec)  # whatever it stood for can no longer be trained
            self.live -= 1
            self.running_trials -= rec.trials
        ready = [r for r in self.pending.values() if r.ready_seq is not None]
        ready.sort(key=lambda r: (r.tag, r.ready_seq))
        if len(ready) < self.b:
            return out
        if not self._feasible(ready[: self.b], version):
            return out  # a group due by then is still running: taking newer ones now would make it stale
        for rec in ready[: self.b]:
            assert rec.group_id is not None
            out.batch.append(rec.group_id)
            out.staleness.append(version - rec.tag)
            del self.pending[rec.group_id]
        return out

    def step_done(self) -> None:
        """The step of the last selected batch is over and its weights (if it changed them) are
        served: the window moves on even when the version did not."""
        self.steps += 1

    def _feasible(self, batch: list[GroupRecord], version: int) -> bool:
        """After taking ``batch``, can every pending group still be trained by its deadline?"""
        due: dict[int, int] = {}
        for r in self.pending.values():
            if r.tag + self.k >= version:  # past-deadline ones are dropped once ready
                due[r.tag + self.k] = due.get(r.tag + self.k, 0) + 1
        taken: dict[int, int] = {}
        for r in batch:
            taken[r.tag + self.k] = taken.get(r.tag + self.k, 0) + 1
        pending = got = 0
        for d in sorted(due):
            pending += due[d]
            got += taken.get(d, 0)
            if got < min(pending - (d - version) * self.b, self.b):
                return False
        return True
