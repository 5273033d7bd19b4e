"""Which sampling parameters a call is sent with: the run's or the harness's.

The proxy's ``sampling`` setting decides per field. ``pin`` (the default, for
training): a value the run sets wins; a harness that asked for another value is
overridden and the override counted. ``honour``: the harness's value wins; the
run's value applies where the request names none. A run value of None always
defers to the request (the per-field settings' meaning before ``sampling``).

What was chosen is recorded with the segment (``records_pb2.SegmentSampling``):
a logprob only means something beside the distribution it was sampled from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from harnessrl.v1 import records_pb2

FIELDS = ("temperature", "top_p", "top_k")
# What the engine does when neither the run nor the harness names a value.
ENGINE_DEFAULTS: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


class _Counts(Protocol):  # the trial a capped max_tokens is counted on
    def count_overrides(self, fields: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class Chosen:
    """The values a call is sampled with, and where each came from."""

    temperature: float
    top_p: float
    top_k: int
    mode: str
    from_harness: tuple[str, ...]
    overridden: tuple[str, ...]  # asked for by the harness, replaced by the run's value

    @property
    def values(self) -> tuple[float, float, int, float]:
        """What the engine samples with (min_p last, always 0): equal values, same distribution."""
        return (self.temperature, self.top_p, self.top_k, 0.0)

    def record(self) -> records_pb2.SegmentSampling:
        return records_pb2.SegmentSampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=0.0,
            mode=self.mode,
            from_harness=self.from_harness,
            overridden=self.overridden,
        )


def choose(mode: str, run: Mapping[str, float | int | None], asked: Mapping[str, float | int | None]) -> Chosen:
    """Each field's value under ``mode`` ("pin" or "honour") from the run's settings and
    the harness's request (None: not set)."""
    if mode not in ("pin", "honour"):
        raise ValueError(f"sampling must be 'pin' or 'honour', got {mode!r}")
    values: dict[str, float] = {}
    from_harness: list[str] = []
    overridden: list[str] = []
    for name in FIELDS:
        mine, theirs = run.get(name), asked.get(name)
        if theirs is not None and (mine is None or mode == "honour"):
            values[name] = float(theirs)
            from_harness.append(name)
        elif mine is not None:
            values[name] = float(mine)
            if theirs is not None and float(theirs) != float(mine):
                overridden.append(name)
        else:
            values[name] = ENGINE_DEFAULTS[name]
    return Chosen(
        values["temperature"], values["top_p"], int(values["top_k"]), mode, tuple(from_harness), tuple(overridden)
    )


def max_tokens(asked: int | None, default: int, cap: int | None, room: int, trial: _Counts) -> int:
    """A call's max_tokens: the harness's (``default`` where it names none), at most ``cap``
    (lowering the harness's own value is an override, counted on the trial), then at most the
    ``room`` its prompt leaves in the window."""
    value = asked or default
    if cap is not None and value > cap:
        value = cap
        if asked:
            trial.count_overrides(("max_tokens",))
    return min(value, room)
