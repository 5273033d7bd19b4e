"""A scripted harness over the capture state machine, shared by its unit tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from harnessrl.v1 import records_pb2
from services.proxy.capture.state import OurTurn, Part, Plan, Sampled, TrialCapture
from services.proxy.chat.conversation import Conversation, Message, Tool, ToolCall
from services.proxy.chat.render import SampledIds

BASH = Tool("bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}})
EDIT = Tool("edit", "Edit a file", {"type": "object", "properties": {"path": {"type": "string"}}})


def i32(values: list[int]) -> bytes:
    return np.asarray(values, "<i4").tobytes()


def ids(data: bytes) -> list[int]:
    return np.frombuffer(data, "<i4").tolist()


@dataclass
class Harness:
    """A scripted harness over a TrialCapture: it samples fake ids (that no
    re-tokenization would produce), keeps every call's prompt and parts, and
    echoes turns back the way real harnesses do."""

    capture: TrialCapture
    calls: list[tuple[Plan, Sampled]] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    n: int = 0

    def call(
        self,
        conv: Conversation,
        with_tool: bool = True,
        eos: bool = True,
        text: str = "",
        sampling: records_pb2.SegmentSampling | None = None,
    ) -> tuple[Message, Plan]:
        """One model call; the turn says ``text`` (default ``text <n>``)."""
        plan = self.capture.plan(conv)
        self.n += 1
        raw = [40000 + self.n, 41000 + self.n, 42000 + self.n] + ([2] if eos else [])
        sampled = Sampled(i32(raw), np.full(len(raw), -0.5, "<f4").tobytes(), i32([7] * len(raw)), "stop", eos)
        cid = f"call_{self.n}"
        calls = (ToolCall(cid, "bash", json.dumps({"command": f"echo {self.n}"})),) if with_tool else ()
        text = text or f"text {self.n}"
        turn = OurTurn(f"turn{self.n}", tuple(c.id for c in calls), text, SampledIds(sampled.ids, eos))
        self.parts += self.capture.commit(plan, sampled, turn, sampling)
        self.calls.append((plan, sampled))
        return Message("assistant", text, calls), plan

    def segments(self) -> dict[tuple[str, int], dict]:  # type: ignore[type-arg]
        """Rebuilds every segment from its parts, as the capture store would."""
        segs: dict[tuple[str, int], dict] = {}  # type: ignore[type-arg]
        for p in self.parts:
            key = (p.thread.name, p.segment_index)
            if p.part_index == 0:
                assert key not in segs and p.prompt is not None
                # a thread's segments are sequential: no gap, the previous one closed first
                assert p.segment_index == 0 or segs[(p.thread.name, p.segment_index - 1)]["closed"]
                segs[key] = {"prompt": ids(p.prompt), "ids": [], "mask": [], "closed": False, "parts": 1}
                seg = segs[key]
            else:
                seg = segs[key]
                assert p.part_index == seg["parts"] and not seg["closed"], "parts in order, none after close"
                seg["parts"] += 1
            seg["ids"] += ids(p.context)
            seg["mask"] += [0] * (len(p.context) // 4)
            if p.sampled is not None:
                seg["ids"] += ids(p.sampled.ids)
                seg["mask"] += [1] * p.sampled.num_tokens
            seg["closed"] |= p.close
        return segs

    def check_invariants(self) -> None:
        segs = self.segments()
        # 1: each call's sampled ids appear with mask 1 in exactly one segment,
        # right after exactly the prompt the engine saw.
        for plan, sampled in self.calls:
            found = 0
            for seg in segs.values():
                full = seg["prompt"] + seg["ids"]
                p = len(seg["prompt"])
                s = ids(sampled.ids)
                for start in range(len(seg["ids"]) - len(s) + 1):
                    window = seg["ids"][start : start + len(s)]
                    if window == s and all(seg["mask"][start : start + len(s)]):
                        assert full[: p + start] == ids(plan.prompt), "sampled in exactly this context"
                        found += 1
            assert found == 1, f"turn found {found} times"
        # every mask-1 id was sampled by some call
        assert sum(sum(s["mask"]) for s in segs.values()) == sum(s.num_tokens for _, s in self.calls)
        # 2: what the engine saw is the full render of what the harness sent
        renderer = self.capture.renderer
        for plan, _ in self.calls:
            sampled_list = [e.sampled if isinstance(e, OurTurn) else None for e in plan.history]
            assert plan.prompt == renderer.full(plan.conv, sampled_list)


def conv(*messages: Message, system: str = "S", tools: tuple[Tool, ...] = (BASH,)) -> Conversation:
    return Conversation(system, tuple(messages), tools)
