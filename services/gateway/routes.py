"""Routed experts of a mixture-of-experts model, recorded at sampling time (R3).

Forward hooks on the model's top-k router modules (transformers' ``*TopKRouter``,
which return ``(logits, weights, indices)``) record the experts every layer picks
for every token of a forward. A reply token's route is the one computed when that
token is fed back in, one step after it was sampled; the last sampled token is
never fed, so its row is zeros (vLLM's convention too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from services.gateway.errors import EngineFailed


class RouteRecorder:
    def __init__(self, model: Any) -> None:
        self.routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        self.top_k = int(getattr(model.config.get_text_config(), "num_experts_per_tok", 0) or 0)
        self._captured: list[torch.Tensor] = []
        self._enabled = False
        for router in self.routers:
            router.register_forward_hook(self._hook)

    @property
    def available(self) -> bool:
        return bool(self.routers) and self.top_k > 0

    @property
    def layers(self) -> int:
        return len(self.routers)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        if self._enabled and isinstance(output, tuple) and len(output) >= 3:
            self._captured.append(output[2])

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self._captured.clear()
        self._enabled = True
        try:
            yield
        finally:
            self._enabled = False

    def rows(self) -> npt.NDArray[np.uint8]:
        """The last recorded forward's routes, uint8 [tokens, layers, top_k]."""
        if len(self._captured) != self.layers:
            raise EngineFailed(f"recorded routes of {len(self._captured)} router layers, expected {self.layers}")
        stacked = torch.stack([indices.reshape(-1, self.top_k) for indices in self._captured], dim=1)
        if stacked.numel() and int(stacked.max()) > 255:
            raise EngineFailed("expert indices above 255 do not fit the uint8 routed_experts format")
        return stacked.to(torch.uint8).cpu().numpy()

    def zeros(self) -> npt.NDArray[np.uint8]:
        return np.zeros((1, self.layers, self.top_k), np.uint8)
