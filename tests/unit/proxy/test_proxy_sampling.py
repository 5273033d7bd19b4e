"""Whose sampling parameters a call gets (the proxy's ``sampling`` setting: pin or
honour), and how the capture records them: one distribution per segment."""

from __future__ import annotations

import pytest

from harnessrl.v1 import records_pb2
from services.proxy.capture.records import append_request
from services.proxy.chat.conversation import Message
from services.proxy.sampling import choose
from services.proxy.settings import Settings
from tests.unit.proxy.capture_harness import Harness, conv

RUN = {"temperature": 0.7, "top_p": 1.0, "top_k": 0}


def test_pin_keeps_the_runs_values_and_names_each_override() -> None:
    c = choose("pin", RUN, {"temperature": 0.2, "top_p": 0.95, "top_k": None})
    assert (c.temperature, c.top_p, c.top_k) == pytest.approx((0.7, 1.0, 0))
    assert c.overridden == ("temperature", "top_p") and c.from_harness == ()
    # asking for the run's own value is no override
    assert choose("pin", RUN, {"temperature": 0.7, "top_p": None, "top_k": None}).overridden == ()


def test_honour_takes_the_harnesss_values_and_the_runs_where_it_names_none() -> None:
    c = choose("honour", RUN, {"temperature": 0.2, "top_p": None, "top_k": 64})
    assert (c.temperature, c.top_p, c.top_k) == pytest.approx((0.2, 1.0, 64))
    assert c.from_harness == ("temperature", "top_k") and c.overridden == ()


def test_a_run_value_of_none_defers_to_the_request_even_when_pinned() -> None:
    run = {"temperature": None, "top_p": None, "top_k": None}
    c = choose("pin", run, {"temperature": 0.3, "top_p": None, "top_k": None})
    assert (c.temperature, c.top_p, c.top_k) == pytest.approx((0.3, 1.0, 0))  # the engine's defaults
    assert c.from_harness == ("temperature",) and c.overridden == ()


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'pin' or 'honour'"):
        choose("obey", RUN, {})
    with pytest.raises(ValueError, match="sampling"):
        Settings.model_validate({"sampling": "obey"})
    assert Settings.model_validate({}).sampling == "pin"  # training runs pin by default


def test_the_record_carries_values_mode_and_provenance() -> None:
    rec = choose("pin", RUN, {"temperature": 0.2}).record()
    assert rec.temperature == pytest.approx(0.7) and rec.min_p == 0 and rec.mode == "pin"
    assert list(rec.overridden) == ["temperature"]


def _sampling(temperature: float) -> records_pb2.SegmentSampling:
    return choose("honour", RUN, {"temperature": temperature}).record()


def test_a_change_of_sampling_opens_the_next_segment_with_the_whole_context(harness: Harness) -> None:
    u = Message("user", "go")
    a1, _ = harness.call(conv(u), sampling=_sampling(0.7))
    t1 = Message("tool", "r1", tool_call_id="call_1")
    a2, p2 = harness.call(conv(u, a1, t1), sampling=_sampling(0.7))
    t2 = Message("tool", "r2", tool_call_id="call_2")
    _, p3 = harness.call(conv(u, a1, t1, a2, t2), sampling=_sampling(0.3))  # the harness changed it
    assert p2.extends is not None
    parts = [(p.segment_index, p.part_index, p.close) for p in harness.parts]
    assert parts == [(0, 0, False), (0, 1, False), (0, 2, True), (1, 0, False)]
    opening = [p for p in harness.parts if p.part_index == 0]
    assert [p.sampling.temperature for p in opening if p.sampling] == pytest.approx([0.7, 0.3])
    assert opening[1].prompt == p3.prompt  # the whole context, the first two turns as mask-0 context
    assert all(p.sampling is None for p in harness.parts if p.part_index > 0)  # one per segment, on part 0
    harness.check_invariants()  # nothing lost, nothing trained twice


def test_same_values_with_other_provenance_keep_the_segment(harness: Harness) -> None:
    u = Message("user", "go")
    pinned = choose("pin", RUN, {"temperature": 0.2}).record()  # overridden to 0.7
    plain = choose("pin", RUN, {}).record()  # 0.7, the harness asked nothing
    a1, _ = harness.call(conv(u), sampling=pinned)
    _, p2 = harness.call(conv(u, a1, Message("tool", "r", tool_call_id="call_1")), sampling=plain)
    assert p2.extends is not None and len(harness.parts) == 2  # the same distribution: one segment
    harness.check_invariants()


def test_append_request_carries_the_sampling_on_part_0_only(harness: Harness) -> None:
    u = Message("user", "go")
    a1, _ = harness.call(conv(u), sampling=_sampling(0.5))
    harness.call(conv(u, a1, Message("tool", "r", tool_call_id="call_1")), sampling=_sampling(0.5))
    usage = records_pb2.Usage()
    reqs = [append_request("r", "t", "task", "g", "m", "sha", p, "stop", usage) for p in harness.parts]
    assert reqs[0].HasField("sampling") and reqs[0].sampling.temperature == pytest.approx(0.5)
    assert list(reqs[0].sampling.from_harness) == ["temperature"] and reqs[0].sampling.mode == "honour"
    assert not reqs[1].HasField("sampling")
