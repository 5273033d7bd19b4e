"""The GPU check: the local engine and the trainer's code path on one device, on a
tiny random-weight Qwen3-MoE built from a config (nothing downloaded).

    scripts/gpu_check [--device auto|cpu|cuda|cuda:N] [--out gpu_check.json] [sizes...]

It samples with the gateway's ``LocalEngine`` (bf16 by default, routes captured),
scores the same tokens with the trainer's ``forward.logprobs_no_grad`` (fp32 by
default) without and with R3 replay (``r3.route_context``), reports their
agreement (``agreement.compute``: Pearson, mean and max |Δ|, ESS), then times
training steps through ``forward.backward_through`` + gradient clipping + AdamW
and the in-process weight sync back into the engine. One JSON file holds it all.

The training step's gradient is the policy gradient of a token-mean loss at
ratio 1 (advantages ±1), not the trainer's verl loss: verl is not on the GPU
host. Everything a step does with the model (forward, replay, backward,
clipping, the optimizer) is the trainer's own code.

Runs where only torch and transformers are installed: it imports them, numpy,
the standard library and project modules that import nothing else
(``tests/integration/test_gpu_check.py`` runs it on such a path). The one
exception is ``harnessrl.errors``, whose classes name gRPC status codes: without
grpcio they get a stand-in holding only that enum (``json["grpc_stand_in"]``).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import math
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

STATUS_CODES = (
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED "
    "RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
    "UNAUTHENTICATED"
).split()


def grpc_stand_in() -> bool:
    """Gives ``harnessrl.errors`` a ``grpc.StatusCode`` where grpcio is absent; True if it had to.
    Nothing here makes an RPC; anything that tried would fail on the missing attribute."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        module = types.ModuleType("grpc", "stand-in from stack.bench.gpu_check: StatusCode only")
        codes = enum.Enum("StatusCode", STATUS_CODES)  # type: ignore[misc]  # names known at run time
        setattr(module, "StatusCode", codes)  # noqa: B010 - a module attribute mypy cannot see
        sys.modules["grpc"] = module
        return True
    return False


STAND_IN = grpc_stand_in()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from harnessrl import torchdevice  # noqa: E402
from harnessrl.errors import ConfigError  # noqa: E402
from services.gateway.engines.base import GenerateInput, Sampling  # noqa: E402
from services.gateway.engines.local import LocalEngine, merge_chunks  # noqa: E402
from services.trainer import agreement, forward, r3, tinymoe  # noqa: E402
from services.trainer.inputs import Sample  # noqa: E402
from services.trainer.policy import load_model  # noqa: E402

if TYPE_CHECKING:
    from services.gateway.settings import Settings as GatewaySettings

T = TypeVar("T")


@dataclass(frozen=True)
class EngineOptions:
    """The gateway settings ``LocalEngine`` reads (pydantic, which the real ones need,
    is not on the GPU host). The test pins these names and defaults to the gateway's."""

    model_path: Path
    device: str = "cpu"
    dtype: str = "fp32"
    max_batch_size: int = 8
    model_name: str | None = None
    context_window: int | None = None
    initial_version: int = 0
    torch_threads: int | None = None
    prefill_chunk_tokens: int = 512
    prefix_cache_entries: int = 16
    prefix_cache_tokens: int = 131_072
    prefix_cache_mib: int = 1024
    logprobs_mode: str = "processed"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help=torchdevice.DEVICE_HELP)
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON file written")
    p.add_argument("--preset", choices=sorted(tinymoe.PRESETS), default="small", help="model size")
    p.add_argument("--engine-dtype", choices=torchdevice.DTYPES, default="bf16")
    p.add_argument("--train-dtype", choices=torchdevice.DTYPES, default="fp32")
    p.add_argument("--rows", type=_positive, default=32, help="sequences sampled together (≤ 256)")
    p.add_argument("--prompt-tokens", type=_positive, default=256)
    p.add_argument("--response-tokens", type=_positive, default=128)
    p.add_argument("--train-steps", type=_positive, default=4, help="the first one warms up, the rest are timed")
    p.add_argument("--token-budget", type=_positive, default=16384, help="padded tokens per micro-batch")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=_seconds, default=450, help="stop (and say so) past this")
    args = p.parse_args(argv)
    if args.rows > 256:
        p.error(f"--rows {args.rows}: the local engine batches at most 256 sequences")
    if not 0 < args.temperature <= 5:
        p.error(f"--temperature {args.temperature}: must be in (0, 5]")
    size = tinymoe.PRESETS[args.preset]["max_position_embeddings"]
    if args.prompt_tokens + args.response_tokens > size:
        p.error(f"--prompt-tokens + --response-tokens exceed the {args.preset} model's {size} positions")
    try:
        torchdevice.resolve_device(args.device)
    except ConfigError as e:  # a malformed device, or one this host lacks
        p.error(str(e))
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number of seconds")
    return value


class Clock:
    """Wall time of the whole check, per phase, and the limit it must end within."""

    def __init__(self, limit_s: float) -> None:
        self.start, self.limit_s = time.monotonic(), limit_s
        self.phases: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return max(0.0, self.limit_s - self.elapsed())

    def check(self, what: str) -> None:
        if self.elapsed() > self.limit_s:
            raise TimeoutError(f"time limit {self.limit_s:g} s passed before {what}")

    def phase(self, name: str | None) -> None:
        """Ends the current phase (its seconds go to ``phases``) and starts ``name``."""
        now = time.monotonic()
        if self._current is not None:
            self.phases[self._current[0]] = now - self._current[1]
        self._current = (name, now) if name else None
        if name:
            self.check(name)


async def within(clock: Clock, what: str, work: Awaitable[T]) -> T:
    try:
        return await asyncio.wait_for(work, clock.remaining())
    except TimeoutError as e:
        raise TimeoutError(f"time limit {clock.limit_s:g} s passed during {what}") from e


async def sample(engine: LocalEngine, args: argparse.Namespace, vocab: int, rows: int) -> list[Sample]:
    """``rows`` prompts of random ids, sampled together; each reply as a training sample."""
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, vocab - 1, args.prompt_tokens, dtype=np.int32) for _ in range(rows)]
    sampling = [
        Sampling(
            temperature=args.temperature,
            max_tokens=args.response_tokens,
            seed=args.seed * 1000 + i + 1,
            return_routed_experts=True,
        )
        for i in range(rows)
    ]

    async def one(i: int) -> Sample:
        request = GenerateInput(f"r{i}", "", "main", prompts[i], sampling[i], args.response_tokens)
        chunk = merge_chunks([c async for c in engine.generate(request)])
        n = len(chunk)
        return Sample(
            trial_id=f"r{i}",
            segment=f"main/{i}",
            input_ids=np.concatenate([prompts[i], chunk.ids]).astype(np.int64),
            prompt_len=args.prompt_tokens,
            mask=np.ones(n, dtype=np.bool_),
            rollout_logprobs=chunk.logprobs.astype(np.float32),
            versions=chunk.versions.astype(np.int32),
            routes=chunk.routed_experts,
        )

    return list(await asyncio.gather(*(one(i) for i in range(rows))))


def agreement_of(model: torch.nn.Module, samples: list[Sample], args: argparse.Namespace, replay: bool) -> dict:
    routes = r3.route_context(model) if replay else None
    device = torchdevice.device_of(model)
    torchdevice.synchronize(device)
    started = time.monotonic()
    train = forward.logprobs_no_grad(model, samples, args.token_budget, routes, args.temperature)
    torchdevice.synchronize(device)
    seconds = time.monotonic() - started
    result = agreement.compute(
        np.concatenate([lp.numpy()[s.mask] for s, lp in zip(samples, train, strict=True)]),
        np.concatenate([s.rollout_logprobs[s.mask] for s in samples]),
    )
    tokens = sum(len(s.input_ids) for s in samples)
    return {
        "tokens": result.tokens,
        "pearson": result.pearson,
        "mean_abs_diff": result.mean_abs_diff,
        "max_abs_diff": result.max_abs_diff,
        "ess": result.ess,
        "scoring_tokens_per_s": tokens / seconds,
    }


def train(model: torch.nn.Module, samples: list[Sample], args: argparse.Namespace, clock: Clock) -> dict:
    """Steps of the trainer's path: no-grad logprobs, backward through them, clip, AdamW."""
    routes = r3.route_context(model) if r3.routers(model) else None
    device = torchdevice.device_of(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    total = sum(s.num_policy_tokens for s in samples)
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(samples))]
    seconds, losses, norms = [], [], []
    for step in range(args.train_steps):
        clock.check(f"train step {step}")
        torchdevice.synchronize(device)
        started = time.monotonic()
        lps = forward.logprobs_no_grad(model, samples, args.token_budget, routes, args.temperature)
        # d(-Σ A·lp / N)/dlp: the policy gradient of a token-mean loss at ratio 1.
        grads = [torch.full((s.num_policy_tokens,), -a / total) for s, a in zip(samples, advantages, strict=True)]
        forward.backward_through(model, samples, grads, args.token_budget, routes, args.temperature)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torchdevice.synchronize(device)
        seconds.append(time.monotonic() - started)
        losses.append(
            -sum(a * float(lp[s.mask].sum()) for s, a, lp in zip(samples, advantages, lps, strict=True)) / total
        )
        norms.append(float(norm))
    timed = seconds[1:] or seconds
    tokens = sum(len(s.input_ids) for s in samples)
    return {
        "steps": args.train_steps,
        "tokens_per_step": tokens,
        "policy_tokens_per_step": total,
        "seconds_per_step": seconds,
        "tokens_per_s": tokens / (sum(timed) / len(timed)),
        "policy_tokens_per_s": total / (sum(timed) / len(timed)),
        "loss": losses,
        "grad_norm": norms,
        "routing_replay": routes is not None,
    }


async def run(args: argparse.Namespace, clock: Clock, report: dict[str, Any], workdir: Path) -> None:
    clock.phase("build")
    device = torchdevice.resolve_device(args.device)
    report["device"] = str(device)
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    model = tinymoe.build(args.preset, args.seed)
    config = model.config
    report["model"] = {
        "preset": args.preset,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "experts": config.num_experts,
        "top_k": config.num_experts_per_tok,
        "vocab": config.vocab_size,
        "routers": len(r3.routers(model)),
    }
    model.save_pretrained(workdir / "model")
    del model

    clock.phase("engine_start")
    options = EngineOptions(workdir / "model", args.device, args.engine_dtype, max_batch_size=args.rows)
    engine = LocalEngine(cast("GatewaySettings", options), name="gpu-check")
    await engine.start()
    try:
        vocab = engine.info().vocab_size
        warm_up = argparse.Namespace(**{**vars(args), "response_tokens": 4})
        await within(clock, "the warm-up", sample(engine, warm_up, vocab, 2))
        clock.phase("generate")
        torchdevice.synchronize(device)
        started = time.monotonic()
        samples = await within(clock, "generation", sample(engine, args, vocab, args.rows))
        seconds = time.monotonic() - started
        generated = sum(s.response_len for s in samples)
        report["engine"] = {
            "dtype": args.engine_dtype,
            "sequences": len(samples),
            "prompt_tokens": args.prompt_tokens * len(samples),
            "generated_tokens": generated,
            "seconds": seconds,
            "tokens_per_s": generated / seconds,
            "routes_captured": all(s.routes is not None for s in samples),
        }

        clock.phase("trainer_load")
        policy = load_model(workdir / "model", True, args.device, args.train_dtype)
        clock.phase("agreement")
        report["agreement"] = {
            "engine_dtype": args.engine_dtype,
            "train_dtype": args.train_dtype,
            "without_r3": agreement_of(policy, samples, args, replay=False),
            "with_r3": agreement_of(policy, samples, args, replay=True),
        }
        clock.phase("train")
        report["train"] = train(policy, samples, args, clock)

        clock.phase("weight_sync")
        torchdevice.synchronize(device)
        started = time.monotonic()
        await engine.load_state_dict(1, policy.state_dict())
        torchdevice.synchronize(device)
        report["weight_sync"] = {"seconds": time.monotonic() - started, "engine_version": engine.info().policy_version}
        if device.type == "cuda":
            report["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    finally:
        clock.phase(None)
        await engine.close()


def verdict(report: dict[str, Any]) -> dict[str, bool]:
    """What a healthy run shows; ``ok`` in the JSON is all of them."""
    a = report.get("agreement", {})
    without, with_r3 = a.get("without_r3", {}), a.get("with_r3", {})
    numbers = [v for part in (without, with_r3) for v in part.values()] + report.get("train", {}).get("loss", [])
    return {
        "routes_captured": bool(report.get("engine", {}).get("routes_captured")),
        "r3_lowers_mean_abs_diff": with_r3.get("mean_abs_diff", math.inf) < without.get("mean_abs_diff", -math.inf),
        "r3_raises_pearson": with_r3.get("pearson", -math.inf) >= without.get("pearson", math.inf),
        "finite": bool(numbers) and all(math.isfinite(float(v)) for v in numbers),
        "weights_synced": report.get("weight_sync", {}).get("engine_version") == 1,
    }


def imported() -> list[str]:
    """The top-level modules loaded from outside the standard library (the stand-in is not grpc)."""
    names = {n.partition(".")[0] for n in sys.modules if not n.startswith("_")} - set(sys.stdlib_module_names)
    if STAND_IN:
        names.discard("grpc")
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    clock = Clock(args.time_limit_s)
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "grpc_stand_in": STAND_IN,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    code = 0
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            asyncio.run(run(args, clock, report, Path(tmp)))
    except Exception as e:  # noqa: BLE001 - the JSON says what broke; the exit code too
        clock.phase(None)
        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc().splitlines()[-16:]
        code = 1
    report["phases_s"] = clock.phases
    report["imported"] = imported()
    report["checks"] = verdict(report)
    report["ok"] = code == 0 and all(report["checks"].values())
    report["elapsed_s"] = clock.elapsed()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(json.dumps({"ok": report["ok"], "out": str(args.out), "checks": report["checks"]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
