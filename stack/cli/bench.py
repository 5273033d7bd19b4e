"""``harnessrl bench``: benchmarks, each printing a table with a baseline measured in the same run."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

app = typer.Typer(
    help="Benchmarks of each part (sandbox, proxy, gateway, capture, trainer, vLLM path), each against a baseline "
    "measured in the same run.",
    no_args_is_help=True,
)


@app.command()
def sandbox(
    trials: Annotated[int, typer.Option(min=2, help="Trials per measurement.")] = 20,
    backend: Annotated[list[str] | None, typer.Option(help="Backends beside local: docker (repeatable).")] = None,
    docker_host: Annotated[
        str | None, typer.Option(help="Engine of the docker backend (default: a private dockerd the bench starts).")
    ] = None,
) -> None:
    """Sandbox backends: overhead per trial (warm cache) and trials/minute at concurrency 1, 4, 16."""
    from services.sandbox.bench import print_report, run_bench

    kinds = tuple(dict.fromkeys(["local", *(backend or [])]))
    unknown = [k for k in kinds if k not in ("local", "docker")]
    if unknown:
        raise typer.BadParameter(f"unknown backend {unknown[0]!r}; valid: local, docker", param_hint="--backend")
    print_report(*asyncio.run(run_bench(trials, backends=kinds, docker_host=docker_host)))


@app.command()
def proxy(quick: bool = typer.Option(False, help="Fewer turns: a smoke run, not a measurement.")) -> None:
    """Per-turn proxy overhead vs naive re-tokenization; throughput through the proxy vs straight to the engine."""
    from services.proxy.bench import print_tables
    from stack.bench.proxy import run

    print_tables(*run(quick))


@app.command("gateway")
def gateway(
    turns: int = typer.Option(3072, help="Turns per scripted row (split across the sessions)."),
    local: bool = typer.Option(False, help="Also measure the local CPU engine (slow: loads the model)."),
) -> None:
    """Gateway overhead: scripted engine straight vs through gRPC; optionally local engine decode rates."""
    import asyncio

    from harnessrl.benchtable import print_table
    from services.gateway import bench as gateway_bench

    rows = asyncio.run(gateway_bench.bench_scripted([1, 64, 384], [1_000, 32_000], turns))
    if local:
        rows += asyncio.run(gateway_bench.bench_local([1, 4], 32, 256))
    columns = ("path", "sessions", "context", "turns", "seconds", "per second")
    cells = [(r.what, r.concurrency, r.context, r.turns, f"{r.seconds:.2f}", f"{r.rate:.0f}") for r in rows]
    print_table("harnessrl bench gateway", columns, cells, left=("path",))


@app.command()
def capture(
    backends: Annotated[str, typer.Option(help="Comma-separated: embedded,distributed.")] = "embedded,distributed",
    writers: Annotated[int, typer.Option(min=1, help="Concurrent gRPC writers.")] = 64,
    tokens: Annotated[int, typer.Option(min=10_000, help="Tokens appended in the throughput phase.")] = 3_000_000,
    pin: Annotated[bool, typer.Option(help="Pin the server to one core, the load to another.")] = True,
) -> None:
    """Capture store: bytes/token, append throughput, 200k-token read-back vs JSONL per token."""
    from services.capture_store.bench import BenchConfig, print_results
    from stack.bench.capture import run

    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    if not chosen or set(chosen) - {"embedded", "distributed"}:
        raise typer.BadParameter(f"{backends!r}: choose from embedded, distributed")
    cfg = BenchConfig(backends=chosen, writers=writers, tokens=tokens, pin=pin)
    print_results(run(cfg, progress=lambda msg: typer.echo(f"... {msg}", err=True)))


@app.command("e2e")
def e2e(
    trials: Annotated[int, typer.Option(min=1, help="Trials of the loaded row (a multiple of --group-size).")] = 512,
    turns: Annotated[int, typer.Option(min=1, help="Model calls per trial.")] = 4,
    group_size: Annotated[int, typer.Option(min=1, help="Trials per group (FinalizeTrajectory readiness).")] = 8,
    concurrency: Annotated[int, typer.Option(min=0, help="Trials in flight; 0 = all of them.")] = 0,
    distributed: Annotated[bool, typer.Option(help="Capture store on Redis + S3 instead of SQLite + files.")] = False,
    sandbox: Annotated[
        bool, typer.Option(help="Run each trial in a real bubblewrap sandbox (sandbox workers, Redis queue).")
    ] = False,
) -> None:
    """Concurrent trials through proxy, gateway (scripted) and capture store: trials/s, p50/p99
    latency of a model call vs one trial at a time, and zero lost records (exit 1 otherwise;
    failed trials, finalized with their infrastructure reason, are reported, not lost)."""
    from stack.bench.loadtest import LoadConfig, print_report, run_load

    cfg = LoadConfig(trials, turns, group_size, concurrency, distributed, sandbox=sandbox)
    rows = asyncio.run(run_load(cfg, progress=lambda msg: typer.echo(f"... {msg}", err=True)))
    print_report(rows, distributed, sandbox)
    if any(r.lost_records for r in rows):
        raise typer.Exit(1)


@app.command("async")
def async_(
    steps: Annotated[int, typer.Option(min=6, help="Trainer steps simulated per row (4 are warm-up).")] = 30,
    tasks: Annotated[int, typer.Option(min=1, help="Tasks (groups) per step.")] = 64,
    group_size: Annotated[int, typer.Option(min=1, help="Rollouts per task.")] = 8,
    workers: Annotated[int, typer.Option(min=1, help="Rollout slots: trials the fleet runs at once.")] = 1024,
    train_s: Annotated[float, typer.Option(min=0, help="Seconds per optimizer step.")] = 300.0,
    sync_s: Annotated[float, typer.Option(min=0, help="Seconds per weight sync.")] = 30.0,
    tail: Annotated[str, typer.Option(help="Read the reference p99 (928 s) as the trial's or the verification's.")] = (
        "trial"
    ),
    seed: int = 0,
    check: Annotated[
        bool,
        typer.Option(help="Also run a scaled-down real async loop (with --tail's trials) and compare (~1 min)."),
    ] = False,
) -> None:
    """Simulated step throughput and trainer idle: sync vs async, staleness 0-3, partial rollout on/off."""
    from services.trainer import bench as trainer_bench

    if tail not in ("trial", "verify"):
        raise typer.BadParameter(f"{tail!r}: choose trial or verify", param_hint="--tail")
    if workers < group_size:
        raise typer.BadParameter(f"{workers} slots cannot hold a group of {group_size}", param_hint="--workers")
    trials = trainer_bench.TrialDistribution(tail=tail)  # type: ignore[arg-type]
    cfg = trainer_bench.SimConfig(tasks, group_size, workers, steps, train_s, sync_s, seed=seed, trials=trials)
    trainer_bench.print_async(cfg)
    if check:
        from dataclasses import replace

        from stack.bench.async_check import DEFAULT_CHECK, check_table

        check_table(replace(DEFAULT_CHECK, trials=trials))


@app.command("trainer")
def trainer(
    samples: Annotated[int, typer.Option(min=2, help="Samples per step (one group).")] = 2,
) -> None:
    """CPU training tokens/s and peak memory of the default model at 1k and 4k tokens per sample."""
    from services.trainer import bench as trainer_bench

    trainer_bench.print_trainer(samples)


@app.command("engine")
def engine(
    concurrency: Annotated[int, typer.Option(min=1, help="Requests at once (the quickstart: 16 trials).")] = 16,
    prompt: Annotated[int, typer.Option(min=1, help="Prompt tokens per request.")] = 500,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per request.")] = 64,
) -> None:
    """The local engine's tokens/s at the quickstart's concurrency beside plain batched transformers generate."""
    from services.gateway.bench_engine import print_engine

    print_engine(concurrency, prompt, new_tokens)


@app.command("trainer-memory")
def trainer_memory(
    samples: Annotated[int, typer.Option(min=2, help="Samples in the step (the quickstart: 16 trials).")] = 16,
    prompt: Annotated[int, typer.Option(min=1, help="Prompt tokens per sample.")] = 900,
    response: Annotated[int, typer.Option(min=1, help="Response tokens per sample.")] = 600,
    token_budget: Annotated[int, typer.Option(min=16, help="Padded tokens per micro-batch.")] = 2048,
    checkpointing: Annotated[bool, typer.Option(help="Gradient checkpointing (the quickstart: off).")] = False,
    chunk_tokens: Annotated[int, typer.Option(min=1, help="Positions per chunk of the chunked row.")] = 256,
) -> None:
    """A trainer step's peak memory: the output head over whole micro-batches beside the chunked head."""
    from services.trainer.bench_memory import Shape, print_memory

    print_memory(Shape(samples, prompt, response, token_budget, checkpointing), chunk_tokens)


@app.command("vllm-path")
def vllm_path(
    short_calls: Annotated[
        int, typer.Option(min=0, help="Calls per path of the short rows (9-call chats, 32 tokens).")
    ] = 45,
    long_calls: Annotated[int, typer.Option(min=0, help="Calls per path of the long rows (1024-token replies).")] = 3,
    stream: Annotated[str, typer.Option(help="Which rows: both, no (whole replies) or yes (SSE).")] = "both",
    vllm_url: Annotated[
        str | None, typer.Option(help="A running vLLM server of the default model (default: start one).")
    ] = None,
    stream_interval: Annotated[
        int | None,
        typer.Option(min=1, help="The gateway's vllm_stream_interval (tokens per vLLM event; default: its own)."),
    ] = None,
    wide_interval: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The gateway's vllm_stream_interval_wide (tokens per vLLM event of a streamed reply "
            "without stop strings, as every row here; default: its own). Its value as --stream-interval "
            "measures the narrow events a stop-watching call gets.",
        ),
    ] = None,
    concurrency: Annotated[
        list[int] | None,
        typer.Option(
            min=1,
            max=64,
            help="Conversations each path runs at once; repeat for a row per level, e.g. "
            "--concurrency 1 --concurrency 8 (default 1: the worst case per turn; see the report's note).",
        ),
    ] = None,
) -> None:
    """The hot path over a real vLLM CPU server (scripts/setup_vllm.sh): direct vLLM vs gateway only vs
    proxy + gateway + capture store, interleaved; overhead per call, TTFT, CPU per turn and per token."""
    from stack.bench.vllm import print_report, run_bench
    from stack.bench.vllm_server import vllm_python

    modes = {"both": (False, True), "no": (False,), "yes": (True,)}
    if stream not in modes:
        raise typer.BadParameter(f"{stream!r}: choose both, no or yes", param_hint="--stream")
    if not short_calls and not long_calls:
        raise typer.BadParameter("nothing to measure: --short-calls and --long-calls are both 0")
    if vllm_url is not None and not vllm_url.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{vllm_url!r} is not an http(s) URL", param_hint="--vllm-url")
    if vllm_url is None and not vllm_python().exists():
        raise typer.BadParameter(f"no vLLM venv at {vllm_python().parent.parent}: run scripts/setup_vllm.sh")
    progress = lambda msg: typer.echo(f"... {msg}", err=True)  # noqa: E731
    more = {} if stream_interval is None else {"vllm_stream_interval": stream_interval}
    more |= {} if wide_interval is None else {"vllm_stream_interval_wide": wide_interval}
    levels = tuple(sorted(set(concurrency or [1])))
    rows = run_bench(short_calls, long_calls, modes[stream], progress, vllm_url, gateway=more, concurrency=levels)
    print_report(rows)
