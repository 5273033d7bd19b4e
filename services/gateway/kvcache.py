"""KV caches of the local engine: one left-padded batch cache decoded in a
single forward per step, and per-(trial, thread) caches kept between turns.

Layout: every layer holds keys/values [B, heads, L, head_dim]. Row i's real
tokens are always its last ``lengths[i]`` slots (rows join left-padded, every
decode step appends one real slot to every row), so the attention mask is
derived from the lengths and a row can be cut out without bookkeeping.
Positions (RoPE) are passed explicitly per row, so a row's keys do not depend
on its padding and a cut-out row is a valid cache on its own.

Only plain full-attention layers (``DynamicLayer``) are supported; the engine
checks that at start.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

KV = list[tuple[torch.Tensor, torch.Tensor]]


def _layers(cache: DynamicCache) -> list[Any]:
    return list(cache.layers)  # DynamicLayer only (checked when the model loads)


def layers_of(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in _layers(cache)]


def from_layers(data: KV) -> DynamicCache:
    """A cache holding copies of ``data`` (DynamicLayer.update concatenates, so views are safe to pass)."""
    return DynamicCache(ddp_cache_data=data)


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def _stack_left(batch: torch.Tensor, row: torch.Tensor, width: int) -> torch.Tensor:
    """``batch`` [B, h, w, d] and ``row`` [1, h, n, d] as one [B + 1, h, width, d] tensor, each
    right-aligned (zeros on the left): one allocation, no padded copies on the way."""
    out = batch.new_zeros(batch.shape[0] + 1, batch.shape[1], width, batch.shape[3])
    out[: batch.shape[0], :, width - batch.shape[2] :] = batch
    out[batch.shape[0] :, :, width - row.shape[2] :] = row
    return out


def crop(cache: DynamicCache, length: int) -> DynamicCache:
    """The first ``length`` slots of a single-row cache (a new cache; the input is untouched)."""
    return from_layers([(k[:, :, :length], v[:, :, :length]) for k, v in layers_of(cache)])


class BatchCache:
    """The decode batch: a left-padded cache and the real length of each row."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return cache_length(self.cache) if self.cache is not None else 0

    def add(self, row: DynamicCache) -> int:
        """Appends a single-row cache; returns its row index.

        Layer by layer, in place: while a layer is merged only that layer exists twice (a
        merge of every layer before the old ones were released held the whole batch cache
        twice for a moment)."""
        n = cache_length(row)
        if self.cache is None:
            self.cache, self.lengths = row, [n]
            return 0
        width = max(self.width, n)
        for layer, (rk, rv) in zip(_layers(self.cache), layers_of(row), strict=True):
            layer.keys = _stack_left(layer.keys, rk, width)
            layer.values = _stack_left(layer.values, rv, width)
        self.lengths.append(n)
        return len(self.lengths) - 1

    def attention_mask(self, extra: int = 1) -> torch.Tensor:
        """[B, width + extra] mask for a step that appends ``extra`` slots."""
        width = self.width + extra
        slots = torch.arange(width).unsqueeze(0)
        starts = torch.tensor([width - (n + extra) for n in self.lengths]).unsqueeze(1)
        return (slots >= starts).long()

    def advanced(self) -> None:
        """Records that the last forward appended one slot to every row."""
        self.lengths = [n + 1 for n in self.lengths]

    def row(self, index: int) -> DynamicCache:
        """Row ``index`` without its padding, as a standalone single-row cache."""
        assert self.cache is not None
        n = self.lengths[index]
        return from_layers(
            [(k[index : index + 1, :, -n:], v[index : index + 1, :, -n:]) for k, v in layers_of(self.cache)]
        )

    def keep(self, indices: Sequence[int]) -> None:
        """Keeps only ``indices`` (in that order) and trims padding no row needs."""
        if not indices:
            self.cache, self.lengths = None, []
            return
        assert self.cache is not None
        lengths = [self.lengths[i] for i in indices]
        width = max(lengths)
        index = torch.tensor(list(indices), device=layers_of(self.cache)[0][0].device)
        for layer in _layers(self.cache):  # in place, one layer at a time (see ``add``)
            layer.keys = layer.keys[:, :, -width:].index_select(0, index)
            layer.values = layer.values[:, :, -width:].index_select(0, index)
        self.lengths = lengths


def common_prefix(a: npt.NDArray[np.int32], b: npt.NDArray[np.int32]) -> int:
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def cache_bytes(cache: DynamicCache) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers_of(cache))


class PrefixStore:
    """KV caches of finished turns by (trial, thread), reused when the next turn's
    prompt extends them. LRU, bounded by entries, by total tokens and by bytes
    (a token's keys and values take 46 KB in SmolLM2-135M's 30 fp32 layers: 16
    trials of 1,500 tokens hold 1.1 GB)."""

    def __init__(self, max_entries: int, max_tokens: int, max_bytes: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[Hashable, tuple[npt.NDArray[np.int32], DynamicCache, int]] = (
            collections.OrderedDict()
        )
        self._tokens = 0
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: Hashable, prompt: npt.NDArray[np.int32]) -> tuple[DynamicCache | None, int]:
        """Removes the entry of ``key`` and returns its cache cropped to the part
        ``prompt`` shares (at least one prompt token is left to compute)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None, 0
        tokens, cache, size = entry
        self._tokens -= tokens.shape[0]
        self._bytes -= size
        reuse = min(common_prefix(tokens, prompt), prompt.shape[0] - 1)
        if reuse <= 0:
            return None, 0
        return (cache if reuse == tokens.shape[0] else crop(cache, reuse)), reuse

    def put(self, key: Hashable, tokens: npt.NDArray[np.int32], cache: DynamicCache) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= old[0].shape[0]
            self._bytes -= old[2]
        size = cache_bytes(cache)
        too_big = self.max_bytes is not None and size > self.max_bytes
        if self.max_entries == 0 or tokens.shape[0] > self.max_tokens or too_big:
            return
        self._entries[key] = (tokens, cache, size)
        self._tokens += tokens.shape[0]
        self._bytes += size
        while self._entries and self._over():
            _, (evicted, _, evicted_size) = self._entries.popitem(last=False)
            self._tokens -= evicted.shape[0]
            self._bytes -= evicted_size

    def forget(self, trial_id: str) -> int:
        """Drops every entry of ``trial_id`` (keys ``(trial_id, thread)``): a trial that
        ended calls no more, so its caches can never be reused. Returns how many went."""
        keys = [k for k in self._entries if isinstance(k, tuple) and k and k[0] == trial_id]
        for key in keys:
            tokens, _, size = self._entries.pop(key)
            self._tokens -= tokens.shape[0]
            self._bytes -= size
        return len(keys)

    def _over(self) -> bool:
        over_bytes = self.max_bytes is not None and self._bytes > self.max_bytes
        return len(self._entries) > self.max_entries or self._tokens > self.max_tokens or over_bytes

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
        self._bytes = 0
