"""The local engine: a transformers causal LM, on CPU in fp32 by default (the
embedded default); ``device`` and ``dtype`` settings put it on a GPU or in bf16.

One worker thread owns the model and runs a step loop: admit queued requests
(up to ``max_batch_size``), prefill one chunk of one new prompt, then decode
one token for every running sequence in a single batched forward. Between
steps it runs control operations (weight loads, aborts), which is what makes
pause, abort and weight updates land exactly on token boundaries:

- Pause stops the loop at the next boundary; running sequences keep their KV
  cache and continue after Resume (nothing is lost or recomputed).
- A weight update applied while a sequence runs changes the version stamped on
  its later tokens: a partial rollout carries both versions, token by token.
- A finished turn's KV cache is kept per (trial, thread); the next turn reuses
  the longest common prefix and prefills only the rest. A weight update drops
  these caches (they were computed with the old weights).

On a GPU the model, its inputs and its KV caches live on the device; each
step's last-position logits come back to the CPU, where sampling (seeded CPU
generators) happens exactly as on a CPU-only host.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from harnessrl import paths
from harnessrl.errors import ConfigError
from harnessrl.torchdevice import device_of, resolve_device, resolve_dtype
from services.gateway import modelfiles
from services.gateway.engines.base import F32, I32, Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.errors import EngineFailed, EngineUnavailable
from services.gateway.kvcache import BatchCache, PrefixStore
from services.gateway.routes import RouteRecorder
from services.gateway.sampling import make_generator, sample, top_logprobs
from services.gateway.weights import apply_update, plan_update, read_checkpoint

if TYPE_CHECKING:  # settings need pydantic; the GPU check drives the engine without it
    from services.gateway.settings import Settings

log = logging.getLogger(__name__)
Top = tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]  # the k most likely ids and their logprobs


@dataclass(eq=False)
class _Seq:
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


class _Worker:
    """The step loop; every attribute below is touched only under ``cond`` or by the worker thread."""

    def __init__(self, model: Any, settings: Settings, eos_ids: frozenset[int], version: int, name: str) -> None:
        self.model = model
        self.device = device_of(model)
        self.settings = settings
        self.eos_ids = eos_ids
        self.version = version
        self.raw_logprobs = settings.logprobs_mode == "raw"
        self.cond = threading.Condition()
        self.queue: collections.deque[_Seq] = collections.deque()
        self.prefilling: list[_Seq] = []
        self.decoding: list[_Seq] = []
        self.batch = BatchCache()
        self.prefix = PrefixStore(settings.prefix_cache_entries, settings.prefix_cache_tokens)
        self.ops: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = collections.deque()
        self.paused = False
        self.stopped = False
        self.at_boundary = threading.Event()
        self.routes = RouteRecorder(model)
        self.thread = threading.Thread(target=self._run, name=f"gateway-{name}", daemon=True)

    # --- called from the event loop ---------------------------------------------

    def submit(self, seq: _Seq) -> None:
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
                except Exception as e:
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

    def _prefill(self, seq: _Seq) -> None:
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

    def _sample(self, seq: _Seq, logits: torch.Tensor) -> None:
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
        seq: _Seq,
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

    def _store(self, seq: _Seq, cache: Any) -> None:
        """Keeps a finished turn's cache (prompt + all but the last sampled token) for the next turn."""
        if seq.key is None or cache is None:
            return
        tokens = np.concatenate([seq.request.prompt_ids, np.asarray(seq.output[:-1], I32)])
        if int(cache.get_seq_length()) == tokens.shape[0]:
            self.prefix.put(seq.key, tokens, cache)

    def _finish(self, seq: _Seq, reason: str) -> None:
        seq.done = True
        if seq.held is not None:  # sampled, so it is sent; it was never fed forward
            self._emit(seq, *seq.held, finish=reason)
            seq.held = None
        else:
            seq.emit(Chunk.empty(reason, seq.cached_prompt))

    def abort(self, seq: _Seq) -> bool:
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

    def _fail_running(self, error: BaseException) -> None:
        for seq in [*self.prefilling, *self.decoding]:
            seq.done = True
            if seq.output:
                seq.emit(EngineFailed(f"local engine failed mid-generation: {error}"))
            else:
                seq.emit(EngineUnavailable(f"local engine failed before the first token: {error}"))
        self.prefilling, self.decoding, self.batch = [], [], BatchCache()
        self.prefix.clear()

    def load(self, plan: list[tuple[torch.Tensor, torch.Tensor]], version: int) -> None:
        """(On the worker.) Copies new weights in place between two steps."""
        apply_update(plan)
        self.version = version
        self.prefix.clear()


class LocalEngine(Engine):
    """See the module docstring."""

    kind = "local"

    def __init__(self, settings: Settings, name: str = "local-0") -> None:
        super().__init__(name)
        self.settings = settings
        self.model_dir = (settings.model_path or paths.default_model_dir()).expanduser()
        self.model_name = settings.model_name or self.model_dir.name
        self._worker: _Worker | None = None
        self._running: dict[str, _Seq] = {}
        self._context_window = 0
        self._vocab = 0
        self._eos: frozenset[int] = frozenset()

    @property
    def worker(self) -> _Worker:
        if self._worker is None:
            raise EngineUnavailable(f"local engine {self.name} is not started")
        return self._worker

    @property
    def model(self) -> Any:
        return self.worker.model

    async def start(self) -> None:
        modelfiles.check_model_dir(self.model_dir)
        if self.settings.torch_threads:
            torch.set_num_threads(self.settings.torch_threads)
        device, dtype = resolve_device(self.settings.device), resolve_dtype(self.settings.dtype)
        model = await asyncio.to_thread(load_model, self.model_dir, device, dtype)
        self._context_window = self.settings.context_window or modelfiles.context_window(self.model_dir)
        self._vocab = int(model.config.get_text_config().vocab_size)
        self._eos = eos_ids(model, self.model_dir)
        self._worker = _Worker(model, self.settings, self._eos, self.settings.initial_version, self.name)
        self._worker.thread.start()

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            await asyncio.to_thread(self._worker.thread.join, 30)

    def info(self) -> EngineInfo:
        return EngineInfo(
            model=self.model_name,
            context_window=self._context_window,
            vocab_size=self._vocab,
            policy_version=self.worker.version if self._worker else self.settings.initial_version,
            in_flight=self._worker.in_flight() if self._worker else 0,
            capacity=self.settings.max_batch_size,
            eos_token_id=min(self._eos) if self._eos else None,
        )

    async def check_health(self) -> None:
        if not self.worker.thread.is_alive():
            raise EngineUnavailable(f"local engine {self.name}: worker thread is not running")

    async def generate(self, request: GenerateInput) -> AsyncGenerator[Chunk, None]:
        worker = self.worker
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()

        def emit(item: Chunk | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop closed under a shutting-down worker
                pass

        s = request.sampling
        seq = _Seq(request, emit, make_generator(s.seed), frozenset(self._eos | set(s.stop_token_ids)))
        self._running[request.request_id] = seq
        worker.submit(seq)
        finished = False
        try:
            while not finished:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                chunks = [item for item in items if isinstance(item, Chunk)]
                errors = [item for item in items if not isinstance(item, Chunk)]
                if chunks:
                    merged = merge_chunks(chunks)
                    finished = bool(merged.finish_reason)
                    yield merged
                if errors and not finished:
                    raise errors[0]
        finally:
            self._running.pop(request.request_id, None)
            if not finished and not seq.done:
                worker.call(lambda: worker.abort(seq))

    async def abort(self, request_id: str) -> bool:
        seq = self._running.get(request_id)
        if seq is None:
            return False
        worker = self.worker
        return bool(await asyncio.wrap_future(worker.call(lambda: worker.abort(seq))))

    async def pause(self, timeout_s: float) -> int:
        worker = self.worker
        worker.set_paused(True)
        await asyncio.to_thread(worker.at_boundary.wait, timeout_s)
        return worker.in_flight()

    async def resume(self) -> int:
        worker = self.worker
        held = worker.in_flight() if worker.paused else 0
        worker.set_paused(False)
        return held

    async def load_weights(self, version: int, checkpoint_path: str, options: Mapping[str, str]) -> None:
        tensors = await asyncio.to_thread(read_checkpoint, checkpoint_path)
        await self.load_state_dict(version, tensors)

    async def load_state_dict(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """In-process weight update (the embedded trainer hands tensors over directly)."""
        worker = self.worker
        plan = plan_update(worker.model, tensors)
        await asyncio.wrap_future(worker.call(lambda: worker.load(plan, version)))


def merge_chunks(chunks: list[Chunk]) -> Chunk:
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    routes = [c.routed_experts for c in chunks if c.routed_experts is not None]
    sampled = [c for c in chunks if len(c)]
    tops = [(c.top_ids, c.top_logprobs) for c in sampled if c.top_ids is not None and c.top_logprobs is not None]
    whole = bool(tops) and len(tops) == len(sampled) and len({t[0].shape[1] for t in tops}) == 1
    return Chunk(
        np.concatenate([c.ids for c in chunks]),
        np.concatenate([c.logprobs for c in chunks]),
        np.concatenate([c.versions for c in chunks]),
        np.concatenate(routes) if routes else None,
        last.finish_reason,
        last.cached_prompt_tokens,
        np.concatenate([t[0] for t in tops]) if whole else None,
        np.concatenate([t[1] for t in tops]) if whole else None,
    )


def load_model(model_dir: Any, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> Any:
    """The model in eval mode (fp32 on the CPU unless told otherwise); refuses
    models whose KV cache is not plain full attention."""
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicLayer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device or torch.device("cpu"))  # type: ignore[call-arg,arg-type]  # transformers wraps .to
    model.eval()
    layers = DynamicCache(config=model.config).layers
    if any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise ConfigError(
            f"{model_dir}: the local engine batches plain full-attention KV caches; this model uses {kinds}"
        )
    return model


def eos_ids(model: Any, model_dir: Any) -> frozenset[int]:
    ids = {modelfiles.eos_token_id(model_dir)}
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(i for i in configured if isinstance(i, int))
    return frozenset(ids)
