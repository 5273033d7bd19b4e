"""Teacher-forced logprobs of captured tokens, in micro-batches by token budget.

Rows are left-padded so every response ends at the last position: the model
then only needs the last ``max_response + 1`` logits (``logits_to_keep``),
not a [tokens, vocab] matrix for long prompts.

With ``chunk_tokens`` > 0 (the default, ``optim.logit_chunk_tokens``) not even
those exist for a whole micro-batch: the decoder's last hidden states are
taken, and the output head, the temperature and the log-softmax run on
``chunk_tokens`` positions at a time, each chunk under activation
checkpointing, so its [chunk, vocab] logits are freed after the forward and
recomputed in the backward. The arithmetic is the same as the whole-batch
path's (tests/integration/test_trainer_chunked.py holds the two together);
only the peak memory changes (``harnessrl bench trainer-memory``).

Batches are built on the CPU and moved to the model's device for the forward;
logprobs come back to the CPU (the loss rows are small), gradients of the loss
go back to the device for the backward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

from harnessrl.torchdevice import device_of

if TYPE_CHECKING:
    from services.trainer.inputs import Sample

# A hook for routing replay (R3): given the padded batch, a context manager
# under which forward (and backward) see the captured routes.
RouteContext = Callable[["Batch"], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True)
class Batch:
    """A padded micro-batch: ``samples[i]`` sits in row i, right-aligned."""

    samples: tuple[Sample, ...]
    input_ids: torch.Tensor  # [B, T] int64, left-padded
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    keep: int  # logits kept at the end of each row

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def plan(samples: Sequence[Sample], token_budget: int) -> list[list[int]]:
    """Packs sample indices into micro-batches of at most ``token_budget`` padded
    tokens (longest first; a sample over the budget goes alone). Deterministic."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].input_ids), i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        length = len(samples[i].input_ids)
        if current and max(width, length) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, length)
    if current:
        batches.append(current)
    return batches


def collate(samples: Sequence[Sample], pad_id: int = 0) -> Batch:
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, width - len(s.input_ids) :] = torch.from_numpy(s.input_ids)
        attn[row, width - len(s.input_ids) :] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    keep = max(s.response_len for s in samples) + 1
    return Batch(tuple(samples), ids, attn, positions, keep)


def response_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0, chunk_tokens: int = 0
) -> list[torch.Tensor]:
    """Logprob of every response token of each sample under ``model``, [R] each.

    Each row's logits are divided by the temperature its segment was sampled with
    (``Sample.temperature``; ``temperature``, the run's, where none was recorded), so
    the logprobs are those of the distribution the engine sampled from (its
    "processed" logprobs), and importance ratios compare like with like.
    ``chunk_tokens`` > 0: the output head runs that many positions at a time
    (see the module docstring); 0, or a model whose head is not a plain linear
    layer: the whole micro-batch's logits at once.
    """
    device = device_of(model)
    input_ids = batch.input_ids.to(device)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": batch.attention_mask.to(device),
        "position_ids": batch.position_ids.to(device),
        "use_cache": False,
    }
    targets = input_ids[:, -(batch.keep - 1) :]  # position p predicts token p+1
    temps = [temperature if s.temperature is None else s.temperature for s in batch.samples]
    # One divisor per row ([B, 1]); 1.0 alone where every row was sampled at 1 (no division).
    rows_t: torch.Tensor | float = (
        torch.tensor(temps, device=device).view(-1, 1) if any(t != 1.0 for t in temps) else 1.0
    )
    parts = decoder_and_head(model) if chunk_tokens > 0 else None
    if parts is None:
        logits = model(**inputs, logits_to_keep=batch.keep).logits[:, :-1]
        lp = _token_logprobs(logits, targets, rows_t if isinstance(rows_t, float) else rows_t.unsqueeze(-1))
    else:
        decoder, head = parts
        hidden = decoder(**inputs).last_hidden_state[:, -batch.keep : -1]
        lp = chunked_logprobs(hidden, head, targets, rows_t, chunk_tokens)
    return [lp[row, lp.shape[1] - s.response_len :] for row, s in enumerate(batch.samples)]


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """log softmax(logits / T)[target] at every position: [..., V] logits, [...] targets;
    ``temperature`` a number or a tensor that broadcasts against the logits."""
    logits = logits.float()
    if isinstance(temperature, torch.Tensor) or temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _chunk_logprobs(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: torch.Tensor | float
) -> torch.Tensor:
    return _token_logprobs(head(hidden), targets, temperature)


def chunked_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    temperature: torch.Tensor | float,
    chunk_tokens: int,
) -> torch.Tensor:
    """``_token_logprobs(head(hidden), ...)`` for [B, K, H] hidden states, ``chunk_tokens``
    positions at a time; with gradients on, each chunk is checkpointed: only its
    hidden states are kept for the backward, which recomputes the chunk's logits.
    ``temperature``: a number, or one per row ([B, 1])."""
    rows, width = targets.shape
    flat_hidden, flat_targets = hidden.reshape(rows * width, -1), targets.reshape(-1)
    flat_temps = temperature.expand(rows, width).reshape(-1, 1) if isinstance(temperature, torch.Tensor) else None
    parts = []
    for start in range(0, rows * width, chunk_tokens):
        h, t = flat_hidden[start : start + chunk_tokens], flat_targets[start : start + chunk_tokens]
        temp = temperature if flat_temps is None else flat_temps[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_logprobs, h, head, t, temp, use_reentrant=False)
        else:
            part = _chunk_logprobs(h, head, t, temp)
        parts.append(part)
    return torch.cat(parts).view(rows, width)


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """The decoder and the output layer if the model's logits are exactly
    ``head(decoder(x))`` (no logit scaling or soft-capping after it); None otherwise."""
    config = getattr(model, "config", None)
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if config is None or not callable(get_decoder) or not callable(get_head):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(getattr(text, name, None) not in (None, 1.0) for name in _LOGIT_POSTPROCESSING):
        return None
    decoder, head = get_decoder(), get_head()
    if not isinstance(decoder, torch.nn.Module) or type(head) is not torch.nn.Linear:
        return None
    return decoder, head


# Config fields of models that change the logits after the output layer.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


@contextlib.contextmanager
def _no_context(_batch: Batch) -> Iterator[None]:
    yield


def batches(samples: Sequence[Sample], token_budget: int) -> list[Batch]:
    return [collate([samples[i] for i in group]) for group in plan(samples, token_budget)]


def logprobs_no_grad(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    token_budget: int,
    routes: RouteContext | None = None,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
) -> list[torch.Tensor]:
    """Response logprobs for every sample, in input order, without a graph, fp32 on the CPU."""
    result: list[torch.Tensor | None] = [None] * len(samples)
    index = {id(s): i for i, s in enumerate(samples)}
    with torch.no_grad():
        for batch in batches(samples, token_budget):
            with (routes or _no_context)(batch):
                lps = response_logprobs(model, batch, temperature, chunk_tokens)
                for s, lp in zip(batch.samples, lps, strict=True):
                    result[index[id(s)]] = lp.detach().cpu()
    return [r for r in result if r is not None]


def backward_through(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    grads: Sequence[torch.Tensor],
    token_budget: int,
    routes: RouteContext | None = None,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
) -> None:
    """Accumulates dL/dθ = Σ_t dL/dlp_t · dlp_t/dθ into ``.grad``, one micro-batch at a time.

    ``grads[i]`` is dL/dlp for sample i's policy tokens, taken from the loss
    evaluated on a no-grad pass with the same weights. This is what makes a
    loss that couples tokens across segments and micro-batches (GSPO's
    trajectory ratio, seq-mean aggregation) exact under micro-batching.
    """
    index = {id(s): i for i, s in enumerate(samples)}
    device = device_of(model)
    for batch in batches(samples, token_budget):
        with (routes or _no_context)(batch):
            lps = response_logprobs(model, batch, temperature, chunk_tokens)
            surrogate = torch.zeros((), device=device)
            for s, lp in zip(batch.samples, lps, strict=True):
                g = grads[index[id(s)]].to(device)
                surrogate = surrogate + (lp[torch.from_numpy(s.mask).to(device)] * g).sum()
            surrogate.backward()
