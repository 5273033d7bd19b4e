"""The local engine's KV cache layout: a left-padded batch decodes exactly as
each sequence alone, rows join and leave, and per-trial caches are reused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from services.gateway.kvcache import (
    BatchCache,
    PrefixStore,
    cache_bytes,
    cache_length,
    common_prefix,
    crop,
    layers_of,
)
from tests.test_gateway_support import tiny_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    folder = tiny_llama(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@torch.inference_mode()
def prefill(model, ids: list[int]) -> tuple[DynamicCache, torch.Tensor]:
    out = model(input_ids=torch.tensor([ids]), cache=DynamicCache(), use_cache=True)
    return out.cache, out.logits[0, -1]


@torch.inference_mode()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


@torch.inference_mode()
def test_batched_decode_matches_each_sequence_alone(model) -> None:
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33]]
    batch = BatchCache()
    seqs = []
    for p in prompts[:2]:
        cache, logits = prefill(model, p)
        batch.add(cache)
        seqs.append([*p, int(torch.argmax(logits))])
    for step in range(6):
        if step == 2:  # a third sequence joins mid-way, longer than one row, shorter than the other
            cache, logits = prefill(model, prompts[2])
            batch.add(cache)
            seqs.append([*prompts[2], int(torch.argmax(logits))])
        if step == 4:  # the first leaves
            batch.keep([1, 2])
            seqs = seqs[1:]
        out = model(
            input_ids=torch.tensor([[s[-1]] for s in seqs]),
            attention_mask=batch.attention_mask(),
            position_ids=torch.tensor([[n] for n in batch.lengths]),
            cache=batch.cache,
            use_cache=True,
        )
        batch.cache = out.cache
        batch.advanced()
        for i, s in enumerate(seqs):
            reference = full_logits(model, s)
            assert torch.allclose(out.logits[i, -1], reference, atol=1e-4), (step, i)
            s.append(int(torch.argmax(out.logits[i, -1])))
    # A row cut out of the batch is a valid cache of its own sequence (all but the last token).
    row = batch.row(1)
    assert cache_length(row) == len(seqs[1]) - 1 == batch.lengths[1]
    out = model(
        input_ids=torch.tensor([[seqs[1][-1]]]),
        cache=row,
        use_cache=True,
        position_ids=torch.tensor([[len(seqs[1]) - 1]]),
    )
    assert torch.allclose(out.logits[0, -1], full_logits(model, seqs[1]), atol=1e-4)
    assert batch.width == max(batch.lengths)


def test_attention_mask_marks_each_rows_real_slots() -> None:
    batch = BatchCache()
    batch.lengths = [3, 1]
    batch.cache = DynamicCache(ddp_cache_data=[(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))])
    assert batch.attention_mask().tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]


def test_common_prefix() -> None:
    a = np.asarray([1, 2, 3, 4], np.int32)
    assert common_prefix(a, np.asarray([1, 2, 9], np.int32)) == 2
    assert common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.asarray([], np.int32)) == 0


@torch.inference_mode()
def test_prefix_store_reuses_crops_and_bounds(model) -> None:
    tokens = [5, 6, 7, 8, 9]
    cache, _ = prefill(model, tokens)
    store = PrefixStore(max_entries=2, max_tokens=12)
    store.put("a", np.asarray(tokens, np.int32), cache)
    # The next turn extends the cached tokens: everything is reused.
    got, reuse = store.take("a", np.asarray([*tokens, 10, 11], np.int32))
    assert reuse == 5 and got is not None and cache_length(got) == 5
    assert len(store) == 0  # taken, not shared
    # A rewrite after 3 tokens reuses 3; a prompt equal to the cache keeps one token to compute.
    store.put("a", np.asarray(tokens, np.int32), crop(cache, 5))
    got, reuse = store.take("a", np.asarray([5, 6, 7, 99], np.int32))
    assert reuse == 3 and cache_length(got) == 3
    store.put("a", np.asarray(tokens, np.int32), crop(cache, 5))
    assert store.take("a", np.asarray(tokens, np.int32))[1] == 4
    assert store.take("missing", np.asarray(tokens, np.int32)) == (None, 0)
    # LRU by entries and by tokens.
    for key in ("x", "y", "z"):
        store.put(key, np.asarray(tokens, np.int32), crop(cache, 5))
    assert len(store) == 2
    assert store.take("x", np.asarray(tokens, np.int32)) == (None, 0)
    store.put("big", np.asarray(list(range(13)), np.int32), crop(cache, 5))
    assert store.take("big", np.asarray(tokens, np.int32)) == (None, 0)


@torch.inference_mode()
def test_prefix_store_bounds_bytes(model) -> None:
    tokens = np.asarray([5, 6, 7, 8, 9], np.int32)
    cache, _ = prefill(model, tokens.tolist())
    size = cache_bytes(cache)
    assert size == sum(2 * k.numel() * k.element_size() for k, _ in layers_of(cache)) > 0
    store = PrefixStore(max_entries=10, max_tokens=1000, max_bytes=2 * size)
    for key in ("x", "y", "z"):
        store.put(key, tokens, crop(cache, 5))
    assert len(store) == 2 and store.nbytes == 2 * size  # the least recently used went
    assert store.take("x", tokens) == (None, 0) and store.take("z", tokens)[1] == 4
    assert store.nbytes == size
    small = PrefixStore(10, 1000, max_bytes=size - 1)
    small.put("big", tokens, cache)  # over the bound alone: not kept
    assert len(small) == 0 and small.nbytes == 0


@torch.inference_mode()
def test_prefix_store_forgets_a_trials_threads(model) -> None:
    tokens = np.asarray([5, 6, 7, 8, 9], np.int32)
    cache, _ = prefill(model, tokens.tolist())
    size = cache_bytes(cache)
    store = PrefixStore(max_entries=10, max_tokens=1000)
    for key in (("t1", "main"), ("t1", "sub"), ("t2", "main"), "t1"):
        store.put(key, tokens, crop(cache, 5))
    assert store.forget("t1") == 2  # both threads of t1; a key that is not (trial, thread) stays
    assert len(store) == 2 and store.nbytes == 2 * size
    assert store.take(("t1", "main"), tokens) == (None, 0)
    assert store.take(("t2", "main"), tokens)[1] == 4 and store.take("t1", tokens)[1] == 4
    assert store.forget("t1") == 0 and store.nbytes == 0 and len(store) == 0
