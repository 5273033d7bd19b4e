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
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from harnessrl import paths
from harnessrl.errors import ConfigError
from harnessrl.torchdevice import resolve_device, resolve_dtype
from services.gateway import modelfiles
from services.gateway.engines.base import Chunk, Engine, EngineInfo, GenerateInput
from services.gateway.engines.local_worker import Seq, Worker
from services.gateway.errors import EngineUnavailable
from services.gateway.sampling import make_generator
from services.gateway.weights import Source, plan_update, read_checkpoint

if TYPE_CHECKING:  # settings need pydantic; the GPU check drives the engine without it
    from services.gateway.settings import Settings

log = logging.getLogger(__name__)
Top = tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]  # the k most likely ids and their logprobs


class LocalEngine(Engine):
    """See the module docstring."""

    kind = "local"

    def __init__(self, settings: Settings, name: str = "local-0") -> None:
        super().__init__(name)
        self.settings = settings
        self.model_dir = (settings.model_path or paths.default_model_dir()).expanduser()
        self.model_name = settings.model_name or self.model_dir.name
        self._worker: Worker | None = None
        self._running: dict[str, Seq] = {}
        self._context_window = 0
        self._vocab = 0
        self._eos: frozenset[int] = frozenset()

    @property
    def worker(self) -> Worker:
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
        self._worker = Worker(model, self.settings, self._eos, self.settings.initial_version, self.name)
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
        seq = Seq(request, emit, make_generator(s.seed), frozenset(self._eos | set(s.stop_token_ids)))
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

    async def forget_trial(self, trial_id: str) -> int:
        worker = self.worker
        return int(await asyncio.wrap_future(worker.call(lambda: worker.forget(trial_id))))

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

    async def load_state_dict(self, version: int, tensors: Mapping[str, Source]) -> None:
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
