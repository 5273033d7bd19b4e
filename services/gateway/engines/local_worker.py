"""The local engine's worker thread: it owns the model and runs the step loop
(admit, prefill one chunk, decode one token for every running sequence in one
batched forward) with control operations (weight loads, aborts) between steps,
so pause, abort and weight updates land exactly on token boundaries.
``services/gateway/engines/local.py`` is the Engine in front of it."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from harnessrl import cpu, memory
from harnessrl.torchdevice import device_of
from services.gateway.engines.base import F32, I32, Chunk, GenerateInput
from services.gateway.errors import EngineFailed, EngineUnavailable
from services.gateway.kvcache import BatchCache, PrefixStore
from services.gateway.routes import RouteRecorder
from services.gateway.sampling import sample, top_logprobs
from services.gateway.weights import Plan, apply_update

if TYPE_CHECKING:
    from services.gateway.settings import Settings

log = logging.getLogger(__name__)
Top = tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]  # the k most likely ids and their logprobs


@dataclass(eq=False)
class Seq:
    """One generation inside the worker."""

    request: GenerateInput
    emit: Callable[[Chunk | BaseException], None]
    generator: torch.Generator
    stops: frozenset[int]
    cache: Any = None  # DynamicCache while prefilling
    prefilled: int = 0
    cached_prompt: int = 0
    output: list[int] = field(default_factory=list)
    done: bool = False
    # With routed experts: the last sampled token waits for its route (computed when
    # it is fed back in, the next step) before it is emitted: (id, logprob, version, top).
    wants_routes: bool = False
    held: tuple[int, float, int, Top | None] | None = None

    @property
    def key(self) -> tuple[str, str] | None:
        return (self.request.trial_id, self.request.thread) if self.request.trial_id else None


class Worker:
    """The step loop; every attribute below is touched only under ``cond`` or by the worker thread."""

    def __init__(self, model: Any, settings: Settings, eos_ids: frozenset[int], version: int, name: str) -> None:
        self.model = model
        self.device = device_of(model)
        self.settings = settings
        self.eos_ids = eos_ids
        self.version = version
        self.raw_logprobs = settings.logprobs_mode == "raw"
        self.cond = threading.Condition()
        self.queue: collections.deque[Seq] = collections.deque()
        self.prefilling: list[Seq] = []
        self.decoding: list[Seq] = []
        self.batch = BatchCache()
        self.prefix = PrefixStore(
            settings.prefix_cache_entries, settings.prefix_cache_tokens, settings.prefix_cache_mib * 2**20
        )
        self.ops: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = collections.deque()
        self.paused = False
        self.stopped = False
        self.at_boundary = threading.Event()
        self.routes = RouteRecorder(model)
        self.thread = threading.Thread(target=self._run, name=f"gateway-{name}", daemon=True)

    # --- called from the event loop ---------------------------------------------

    def submit(self, seq: Seq) -> None:
        with self.cond:
            self.queue.append(seq)
            self.cond.notify()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Runs ``fn`` on the worker between two steps (also while paused)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self.cond:
            if self.stopped:
                future.set_exception(EngineUnavailable("the local engine is stopped"))
            else:
                self.ops.append((fn, future))
                self.cond.notify()
        return future

    def in_flight(self) -> int:
        return len(self.queue) + len(self.prefilling) + len(self.decoding)

    def set_paused(self, paused: bool) -> None:
        with self.cond:
            self.paused = paused
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    # --- the worker thread --------------------------------------------------------

    def _run(self) -> None:
        cpu.name_thread("engine")  # before the first forward: its OpenMP workers take the name
        with torch.inference_mode():
            while True:
                with self.cond:
                    while not (self.stopped or self.ops or (not self.paused and self._has_work())):
                        self.at_boundary.set()
                        self.cond.wait()
                    if self.stopped:
                        break
                    ops = list(self.ops)
                    self.ops.clear()
                    if not self.paused:
                        self.at_boundary.clear()
                for fn, future in ops:
                    try:
                        future.set_result(fn())
                    except Exception as e:  # noqa: BLE001 - handed to the caller
                        future.set_exception(e)
                if self.paused or not self._has_work():
                    continue
                try:
                    self._step()
                except Exception as e:  # broad: the engine thread outlives a step; its requests get the error
                    log.exception("local engine step failed")
                    self._fail_running(e)
        self.at_boundary.set()
        for seq in [*self.queue, *self.prefilling, *self.decoding]:
            self._finish(seq, "abort")
        for _, future in self.ops:
            future.set_exception(EngineUnavailable("the local engine stopped"))

    def _has_work(self) -> bool:
        return bool(self.queue or self.prefilling or self.decoding)

    def _step(self) -> None:
        self._admit()
        if self.prefilling:
            self._prefill(self.prefilling[0])
        if self.decoding:
            self._decode()

    def _admit(self) -> None:
        with self.cond:
            while self.queue and len(self.prefilling) + len(self.decoding) < self.settings.max_batch_size:
                seq = self.queue.popleft()
                cache, reuse = (None, 0) if seq.key is None else self.prefix.take(seq.key, seq.request.prompt_ids)
                seq.cache, seq.prefilled, seq.cached_prompt = cache or DynamicCache(), reuse, reuse
                seq.wants_routes = seq.request.sampling.return_routed_experts and self.routes.available
                self.prefilling.append(seq)

    def _prefill(self, seq: Seq) -> None:
        prompt = seq.request.prompt_ids
        start = seq.prefilled
        end = min(prompt.shape[0], start + self.settings.prefill_chunk_tokens)
        out = self.model(
            input_ids=torch.from_numpy(prompt[start:end].astype(np.int64)).unsqueeze(0).to(self.device),
            position_ids=torch.arange(start, end, device=self.device).unsqueeze(0),
            cache=seq.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        seq.cache, seq.prefilled = out.cache, end
        if end < prompt.shape[0]:
            return
        self.prefilling.remove(seq)
        self._sample(seq, out.logits[0, -1].float().cpu())
        if seq.done:
            self._store(seq, seq.cache)
        else:
            self.batch.add(seq.cache)
            self.decoding.append(seq)
        seq.cache = None

    def _decode(self) -> None:
        last = torch.tensor([[seq.output[-1]] for seq in self.decoding], device=self.device)
        positions = torch.tensor([[n] for n in self.batch.lengths], device=self.device)
        record = any(seq.wants_routes for seq in self.decoding)
        with self.routes.recording() if record else contextlib.nullcontext():
            out = self.model(
                input_ids=last,
                attention_mask=self.batch.attention_mask().to(self.device),
                position_ids=positions,
                cache=self.batch.cache,
                use_cache=True,
            )
        self.batch.cache = out.cache
        self.batch.advanced()
        rows = self.routes.rows() if record else None
        logits = out.logits[:, -1].float().cpu()  # one transfer per step, not per sequence
        for i, seq in enumerate(self.decoding):
            if seq.held is not None and rows is not None:
                self._emit(seq, *seq.held, route=rows[i : i + 1])
                seq.held = None
            self._sample(seq, logits[i])
        finished = [i for i, seq in enumerate(self.decoding) if seq.done]
        if finished:
            for i in finished:
                self._store(self.decoding[i], self.batch.row(i))
            keep = [i for i, seq in enumerate(self.decoding) if not seq.done]
            self.batch.keep(keep)
            self.decoding = [self.decoding[i] for i in keep]

    def _sample(self, seq: Seq, logits: torch.Tensor) -> None:
        logits = logits.float()
        token, logprob = sample(logits, seq.request.sampling, seq.generator, self.raw_logprobs)
        top = (
            top_logprobs(logits, seq.request.sampling, self.raw_logprobs) if seq.request.sampling.top_logprobs else None
        )
        seq.output.append(token)
        finish = ""
        if token in seq.stops:
            finish = "stop"
        elif len(seq.output) >= seq.request.budget:
            finish = "length"
        seq.done = bool(finish)
        if seq.wants_routes and not finish:
            seq.held = (token, logprob, self.version, top)
        else:
            self._emit(seq, token, logprob, self.version, top, finish=finish)

    def _emit(
        self,
        seq: Seq,
        token: int,
        logprob: float,
        version: int,
        top: Top | None = None,
        route: Any = None,
        finish: str = "",
    ) -> None:
        if seq.wants_routes and route is None:
            route = self.routes.zeros()  # never fed forward: no route (see routes.py)
        seq.emit(
            Chunk(
                np.asarray([token], I32),
                np.asarray([logprob], F32),
                np.asarray([version], I32),
                route,
                finish,
                seq.cached_prompt if finish else 0,
                None if top is None else top[0][None, :],
                None if top is None else top[1][None, :],
            )
        )

    def _store(self, seq: Seq, cache: Any) -> None:
        """Keeps a finished turn's cache (prompt + all but the last sampled token) for the next turn."""
        if seq.key is None or cache is None:
            return
        tokens = np.concatenate([seq.request.prompt_ids, np.asarray(seq.output[:-1], I32)])
        if int(cache.get_seq_length()) == tokens.shape[0]:
            self.prefix.put(seq.key, tokens, cache)

    def _finish(self, seq: Seq, reason: str) -> None:
        seq.done = True
        if seq.held is not None:  # sampled, so it is sent; it was never fed forward
            self._emit(seq, *seq.held, finish=reason)
            seq.held = None
        else:
            seq.emit(Chunk.empty(reason, seq.cached_prompt))

    def abort(self, seq: Seq) -> bool:
        """(On the worker.) Removes ``seq`` wherever it is and ends it with "abort"."""
        if seq.done:
            return False
        with self.cond:  # the event loop appends to the queue concurrently
            if seq in self.queue:
                self.queue.remove(seq)
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        elif seq in self.decoding:
            index = self.decoding.index(seq)
            if seq.output:
                self._store(seq, self.batch.row(index))
            keep = [i for i in range(len(self.decoding)) if i != index]
            self.batch.keep(keep)
            self.decoding = [self.decoding[i] for i in keep]
        self._finish(seq, "abort")
        return True

    def forget(self, trial_id: str) -> int:
        """(On the worker.) Drops the trial's kept caches; the memory goes back to the system."""
        dropped = self.prefix.forget(trial_id)
        if dropped:
            memory.trim()
        return dropped

    def _fail_running(self, error: BaseException) -> None:
        for seq in [*self.prefilling, *self.decoding]:
            seq.done = True
            if seq.output:
                seq.emit(EngineFailed(f"local engine failed mid-generation: {error}"))
            else:
                seq.emit(EngineUnavailable(f"local engine failed before the first token: {error}"))
        self.prefilling, self.decoding, self.batch = [], [], BatchCache()
        self.prefix.clear()

    def load(self, plan: Plan, version: int) -> None:
        """(On the worker.) Copies new weights in place between two steps."""
        apply_update(plan)
        self.version = version
        self.prefix.clear()
        memory.trim()  # the cleared caches, back to the system
