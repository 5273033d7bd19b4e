"""R3, routing replay for mixture-of-experts models.

At sampling time the engine records which experts the router chose for each
token (``RoutedExperts``: uint8 [tokens, layers, top_k]). In the training
forward those choices are forced: a forward hook on each router (a module
named ``*.mlp.gate`` returning ``(logits, weights, top-k indices)``, as
transformers' Qwen3-MoE router does) swaps in the captured indices and
recomputes their weights from the training router's own probabilities,
renormalised the way the router does it. The routing weights still carry
gradient to the router; only the discrete choice is replayed. Without this, a
bf16 engine and an fp32 trainer pick different experts on near-ties and the
importance ratios of those tokens are noise.

Tokens without captured routes (prompt tokens: ``records.proto`` carries
routes for response tokens only; mask-0 rows, which are zero-filled) are
routed naturally.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from harnessrl.torchdevice import device_of
from services.trainer.forward import Batch

log = logging.getLogger(__name__)


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MoE routers in layer order (modules named ``...mlp.gate`` with a ``top_k``)."""
    return [m for name, m in model.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]


@contextlib.contextmanager
def record(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects each router's top-k indices, per forward call: ``out[l]`` is [tokens, top_k] of layer l
    (concatenated over calls, in call order)."""
    layers = routers(model)
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    out: list[torch.Tensor] = []

    def hook(index: int) -> Any:
        def fn(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            seen[index].append(output[2].detach().clone())

        return fn

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(layers)]
    try:
        yield out
    finally:
        for h in handles:
            h.remove()
        out.extend(torch.cat(s) for s in seen)


def stack(per_layer: list[torch.Tensor]) -> npt.NDArray[np.uint8]:
    """Recorded per-layer indices -> the capture layout [tokens, layers, top_k], uint8."""
    return torch.stack(per_layer, dim=1).to(torch.uint8).cpu().numpy()


@contextlib.contextmanager
def replay(model: torch.nn.Module, routes: torch.Tensor, force: torch.Tensor) -> Iterator[None]:
    """Forces ``routes`` ([tokens, layers, top_k], tokens as the router sees them:
    batch-major, flattened) where ``force`` ([tokens] bool) is set. Keep the
    context open across backward when gradient checkpointing recomputes the forward."""
    layers = routers(model)
    if routes.shape[1] != len(layers):
        raise ValueError(f"routes have {routes.shape[1]} layers, the model has {len(layers)} routers")
    device = device_of(model)
    routes, force = routes.long().to(device), force.to(device)

    def hook(index: int) -> Any:
        def fn(module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
            logits, _weights, indices = output
            if logits.shape[0] != routes.shape[0]:
                raise ValueError(f"router saw {logits.shape[0]} tokens, routes cover {routes.shape[0]}")
            chosen = torch.where(force[:, None], routes[:, index], indices)
            probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
            top = probs.gather(-1, chosen)
            if getattr(module, "norm_topk_prob", False):
                top /= top.sum(dim=-1, keepdim=True)
            return logits, top.to(logits.dtype), chosen

        return fn

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def batch_routes(
    batch: Batch, num_layers: int, top_k: int, num_experts: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Captured routes of a left-padded micro-batch, flattened as the routers see tokens."""
    rows, width = batch.input_ids.shape
    routes = torch.zeros((rows, width, num_layers, top_k), dtype=torch.long)
    force = torch.zeros((rows, width), dtype=torch.bool)
    for row, s in enumerate(batch.samples):
        if s.routes is None:
            continue
        if s.routes.shape[1:] != (num_layers, top_k) or int(s.routes[s.mask].max(initial=0)) >= num_experts:
            # Bad input never crashes a step: this sample is routed naturally.
            log.warning("routes do not fit the model; not replayed", extra={"kv": {"segment": s.segment}})
            continue
        start = width - s.response_len
        routes[row, start:] = torch.from_numpy(s.routes.astype(np.int64))
        force[row, start:] = torch.from_numpy(s.mask)
    return routes.view(rows * width, num_layers, top_k), force.view(-1)


def route_context(model: torch.nn.Module) -> Any:
    """A ``forward.RouteContext`` for ``CpuTrainer``: replays captured routes in each micro-batch."""
    layers = routers(model)
    top_k = int(getattr(layers[0], "top_k")) if layers else 0  # noqa: B009
    experts = int(getattr(layers[0], "num_experts", 256)) if layers else 0

    @contextlib.contextmanager
    def context(batch: Batch) -> Iterator[None]:
        if not layers or all(s.routes is None for s in batch.samples):
            yield
            return
        routes, force = batch_routes(batch, len(layers), top_k, experts)
        with replay(model, routes, force):
            yield

    return context
