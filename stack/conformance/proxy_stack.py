"""The real services one conformance cell runs against, on 127.0.0.1 free ports
in a background event loop: the gateway with the scripted engine (real
tokenizer, JSONL generation log), the capture store (embedded backend) over
gRPC, and the proxy. Synchronous, so a harness binary can be run beside it;
``check_faithful`` holds a trial's capture against the engine's own log."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import numpy as np

from harnessrl.arrays import F32, I32, U8
from harnessrl.localservers import free_port
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc
from services.capture_store.server import create_server as create_store
from services.capture_store.settings import Settings as StoreSettings
from services.gateway.engines.scripted import read_generation_log
from services.gateway.server import create_server as create_gateway
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.server import RunningProxy
from services.proxy.server import start as start_proxy
from services.proxy.settings import Settings as ProxySettings

T = TypeVar("T")
RUN_ID = "conformance"


class Unfaithful(AssertionError):
    """The capture disagrees with what the engine sampled (invariants 1-2)."""


def write_script(folder: Path, threads: dict[str, list[dict[str, Any]]], **extra: Any) -> Path:
    """A scripted-engine script (services/gateway/engines/scripted.py) in ``folder``."""
    path = folder / "script.json"
    path.write_text(json.dumps({"context_window": 200_000, "threads": threads, **extra}))
    return path


class ProxyStack:
    """Gateway (scripted engine) + capture store + proxy for one scenario."""

    def __init__(self, folder: Path, script_path: Path, **proxy_settings: Any) -> None:
        self.folder = folder
        self.log_path = folder / "engine.jsonl"
        self._admin = secrets.token_urlsafe(16)
        self._capture_token = secrets.token_urlsafe(16)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._run(self._start(script_path, proxy_settings))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout=120)

    async def _start(self, script_path: Path, proxy_settings: dict[str, Any]) -> None:
        gateway = {"engine": f"scripted:{script_path}", "scripted_log_path": self.log_path}
        self.gateway = await create_gateway(GatewaySettings.model_validate(gateway))
        self.store_port = free_port()
        store = {
            "port": self.store_port,
            "store_dir": self.folder / "capture",
            "fsync": False,
            "auth_token": self._capture_token,
        }
        self.capture_server = await create_store(StoreSettings.model_validate(store))
        base: dict[str, Any] = {
            "gateway_target": f"127.0.0.1:{self.gateway.port}",
            "capture_target": f"127.0.0.1:{self.store_port}",
            "capture_token": self._capture_token,
            "admin_token": self._admin,
            "uds_path": self.folder / "proxy.sock",
            "render_check": True,
        }
        self.proxy: RunningProxy = await start_proxy(ProxySettings.model_validate({**base, **proxy_settings}))

    def _admin_call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._admin}"}
        resp = httpx.request(method, f"{self.proxy.url}/admin{path}", headers=headers, timeout=60, **kw)
        if resp.status_code not in (200, 201):
            raise RuntimeError(f"proxy admin {method} {path}: {resp.status_code} {resp.text[:500]}")
        result: dict[str, Any] = resp.json()
        return result

    def new_trial(self, trial_id: str, model: str) -> tuple[str, str]:
        """Registers a trial; returns (OpenAI-style base URL ending in /v1, token)."""
        body = {"trial_id": trial_id, "run_id": RUN_ID, "task_id": "conformance", "group_id": trial_id, "model": model}
        data = self._admin_call("POST", "/trials", json=body)
        return f"{self.proxy.url}{data['base_path']}", data["token"]

    def close_trial(self, trial_id: str) -> dict[str, Any]:
        return self._admin_call("POST", f"/trials/{trial_id}/close")

    def export(self, trial_id: str) -> list[dict[str, Any]]:
        """Every segment of a trial, read back from the capture store."""
        return self._run(read_segments(f"127.0.0.1:{self.store_port}", self._capture_token, RUN_ID, trial_id))

    def engine_log(self) -> list[dict[str, Any]]:
        return read_generation_log(self.log_path) if self.log_path.exists() else []

    def stop(self) -> None:
        async def _stop() -> None:
            await self.proxy.stop()
            await self.capture_server.stop(0)
            await self.gateway.stop(0)

        try:
            self._run(_stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> ProxyStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def read_segments(target: str, token: str, run_id: str, trial_id: str) -> list[dict[str, Any]]:
    """A trial's segments from a capture store (GetTrajectory), as dicts; none when it has no trajectory."""
    async with connect(target, token) as channel:
        stub = capture_pb2_grpc.CaptureStoreStub(channel)
        request = capture_pb2.GetTrajectoryRequest(run_id=run_id, trial_id=trial_id, include_tokens=True)
        try:
            trajectory = await stub.GetTrajectory(request)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise
    return [segment_dict(s) for s in trajectory.segments]


def check_faithful(
    segments: list[dict[str, Any]], log: list[dict[str, Any]], trial_id: str, *, stopped: bool = False
) -> None:
    """Invariants 1-3 against the engine's log: every mask-1 run of every segment
    was sampled by the engine in exactly the context that precedes it (so a
    segment's prompt is exactly what the engine saw), with its logprobs and
    versions, in the thread it was generated for; every finished generation is
    in exactly one segment (no turn lost, none trained twice), whole, or cut where
    the conversation went on from the cut (a stop string; ``_cut_after_finish``).
    ``stopped``: the caller was answered that a stop sequence ended the trial's last
    call, which nothing after it can show: a segment may end in a cut run."""
    gens = [g for g in log if g["trial_id"] == trial_id]
    used = [0] * len(gens)
    for seg in segments:
        ids, mask = seg["response_ids"], seg["response_mask"]
        name = f"{seg['thread']}#{seg['segment_index']}"
        if not len(ids) == len(mask) == len(seg["response_logprobs"]) == len(seg["policy_versions"]):
            raise Unfaithful(f"{name}: response arrays differ in length")
        i = 0
        while i < len(ids):
            if not mask[i]:
                if seg["response_logprobs"][i] != 0.0 or seg["policy_versions"][i] != -1:
                    raise Unfaithful(f"{name}: mask-0 token {i} carries a logprob or version")
                i += 1
                continue
            j = i
            while j < len(ids) and mask[j]:
                j += 1
            context, run = seg["prompt_ids"] + ids[:i], ids[i:j]
            match = [
                k
                for k, g in enumerate(gens)
                if g["prompt_ids"] == context
                and (
                    g["sampled_ids"] == run
                    or (g["finish_reason"] == "abort" and g["sampled_ids"][: len(run)] == run)
                    or _cut_after_finish(g, gens, context, run, ids[j:], stopped)
                )
            ]
            if len(match) != 1:
                raise Unfaithful(f"{name}: sampled run at {i} matches {len(match)} engine generations")
            g = gens[match[0]]
            if g["thread"] != seg["thread"]:
                raise Unfaithful(f"{name}: run at {i} was generated for thread {g['thread']}")
            if seg["response_logprobs"][i:j] != [float(x) for x in g["logprobs"][: j - i]]:
                raise Unfaithful(f"{name}: logprobs of the run at {i} are not the engine's")
            if seg["policy_versions"][i:j] != g["policy_versions"][: j - i]:
                raise Unfaithful(f"{name}: policy versions of the run at {i} are not the engine's")
            used[match[0]] += 1
            i = j
    for g, u in zip(gens, used, strict=True):
        if u not in ((1,) if g["finish_reason"] != "abort" else (0, 1)):
            raise Unfaithful(f"engine generation of thread {g['thread']} captured {u} times")


def _cut_after_finish(
    g: dict[str, Any], gens: list[dict[str, Any]], context: list[int], run: list[int], after: list[int], stopped: bool
) -> bool:
    """A finished generation captured as a strict prefix: the proxy stopped reading
    (a stop string) after the engine had sampled to its end. The engine runs ahead of
    its consumer (the gRPC stream buffers), so whether its record says "abort" or
    "stop" is only which came first, the abort or the last chunk. Accepted only where
    the conversation went on from the prefix and not from the rest of the reply: the
    segment's next (mask-0) token, or a later generation's prompt of the thread, holds
    something else there. A capture that lost the tail of a reply the harness was
    given has the tail there (or nothing: a segment ending at the run proves nothing,
    unless the caller was told a stop sequence ended that call: ``stopped``)."""
    ids = g["sampled_ids"]
    if len(run) >= len(ids) or ids[: len(run)] != run:
        return False
    rest = ids[len(run)]
    if after:
        return after[0] != rest
    head = context + run
    return stopped or any(
        o is not g
        and o["thread"] == g["thread"]
        and len(o["prompt_ids"]) > len(head)
        and o["prompt_ids"][: len(head)] == head
        and o["prompt_ids"][len(head)] != rest
        for o in gens
    )


def segment_dict(seg: Any) -> dict[str, Any]:
    mask = np.frombuffer(seg.response.mask, U8).tolist()
    runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    return {
        "trial_id": seg.key.trial_id,
        "thread": seg.key.thread,
        "thread_kind": seg.thread_kind,
        "trainable": seg.trainable,
        "segment_index": seg.key.segment_index,
        "prompt_ids": np.frombuffer(seg.prompt_ids, I32).tolist(),
        "response_ids": np.frombuffer(seg.response.ids, I32).tolist(),
        "response_mask": mask,
        "response_logprobs": np.frombuffer(seg.response.logprobs, F32).tolist(),
        "policy_versions": np.frombuffer(seg.response.policy_versions, I32).tolist(),
        "num_turns": runs,
        "closed": seg.closed,
        "finish_reason": seg.finish_reason,
        "chat_template_sha256": seg.chat_template_sha256,
    }
