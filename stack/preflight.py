"""``harnessrl preflight CONFIG`` (also the first thing ``harnessrl run`` does):
catch in seconds what would otherwise fail an hour into training.

Static checks (nothing started): harness binary and version, chat template vs
tool-call parser (the template's own format is detected and named), model
folder, context window vs max tokens, group size vs batch, free disk, bubblewrap,
Redis / S3 reachable when configured, every task loads. Live checks (services up,
``live_checks``): the engine answers with the model loaded, the sandbox backend
runs a no-op trial, and each task's oracle scores 1 and a no-op scores 0
(results cached by the task's content digest, so a second run is fast).

Each failed check says what to change. Warnings are printed, never fatal.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc

from harnessrl import paths
from harnessrl.errors import ConfigError, HarnessError
from harnessrl.rpc import connect
from harnessrl.v1 import gateway_pb2, gateway_pb2_grpc, records_pb2, sandbox_pb2_grpc
from stack.runconfig import RunConfig

# Harness -> (kind, install folder under tools/, package, version variable of scripts/setup_harnesses.sh).
HARNESS_PACKAGES: dict[str, tuple[str, str, str, str]] = {
    "claude-code": ("npm", "npm", "@anthropic-ai/claude-code", "CLAUDE_CODE_VERSION"),
    "opencode": ("npm", "npm", "opencode-ai", "OPENCODE_VERSION"),
    "codex": ("npm", "npm", "@openai/codex", "CODEX_VERSION"),
    "mini-swe-agent": ("venv", "mini-swe-agent", "mini_swe_agent", "MINI_SWE_AGENT_VERSION"),
    "openhands-sdk": ("venv", "openhands", "openhands_sdk", "OPENHANDS_VERSION"),
}
SETUP_SCRIPT = paths.PROJECT_ROOT / "scripts" / "setup_harnesses.sh"


class PreflightFailed(ConfigError):
    """One or more checks failed; the message lists each with what to change."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    fix: str = ""
    warning: bool = False
    seconds: float = 0.0

    def line(self) -> str:
        mark = "ok  " if self.ok and not self.warning else ("warn" if self.ok else "FAIL")
        text = f"{mark}  {self.name:<14} {self.detail}"
        return text + (f"\n      fix: {self.fix}" if self.fix and (not self.ok or self.warning) else "")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, check: Check) -> None:
        self.checks.append(check)

    def raise_if_failed(self) -> None:
        failed = [c for c in self.checks if not c.ok]
        if failed:
            lines = "; ".join(f"{c.name}: {c.detail} -> {c.fix}" for c in failed)
            raise PreflightFailed(f"preflight failed ({len(failed)} check(s)): {lines}")


def _run(report: Report, name: str, fn: Callable[[], Check | None]) -> None:
    started = time.monotonic()
    try:
        check = fn()
    except HarnessError as e:
        check = Check(name, False, str(e), "fix the setting the message names")
    if check is not None:
        check.seconds = time.monotonic() - started
        report.add(check)


def static_checks(cfg: RunConfig, tasks: Sequence[Path]) -> Report:
    report = Report()
    _run(report, "harness", lambda: check_harness(cfg))
    _run(report, "model", lambda: check_model(cfg))
    _run(report, "chat template", lambda: check_template(cfg))
    _run(report, "context", lambda: check_context(cfg))
    _run(report, "group size", lambda: check_group_size(cfg))
    _run(report, "disk", lambda: check_disk(cfg))
    _run(report, "bubblewrap", lambda: check_bwrap(cfg))
    _run(report, "redis", lambda: check_redis(cfg))
    _run(report, "s3", lambda: check_s3(cfg))
    _run(report, "tasks", lambda: check_tasks_load(tasks))
    return report


# -- static --------------------------------------------------------------------


def expected_versions(script: Path = SETUP_SCRIPT) -> dict[str, str]:
    """``NAME_VERSION=x`` assignments of the setup script (what the adapters expect)."""
    try:
        text = script.read_text()
    except OSError:
        return {}
    return dict(re.findall(r"^([A-Z_]+_VERSION)=([^\s#]+)", text, re.MULTILINE))


def installed_version(harness: str) -> str | None:
    kind, folder, package, _ = HARNESS_PACKAGES[harness]
    root = paths.tools_dir() / folder
    if kind == "npm":
        try:
            return str(json.loads((root / "node_modules" / package / "package.json").read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None
    for info in root.glob(f"lib/python*/site-packages/{package}-*.dist-info"):
        return info.name[len(package) + 1 : -len(".dist-info")]
    return None


def check_harness(cfg: RunConfig) -> Check:
    from services.sandbox.harnesses import get_harness

    name = cfg.run.harness
    if cfg.run.sandbox_target:
        return Check("harness", True, f"{name}: installed on the remote sandbox workers (not checked here)")
    if name == "shell" and not ({"script", "script_path"} & set(cfg.run.harness_options)):
        return Check("harness", False, "shell needs a script", "set [run] harness_options = {script_path = FILE}")
    get_harness(name).check_installed()
    if name not in HARNESS_PACKAGES:
        return Check("harness", True, f"{name} (built in)")
    want = expected_versions().get(HARNESS_PACKAGES[name][3])
    have = installed_version(name)
    if have is None:
        return Check("harness", False, f"{name}: installed version unknown", "run scripts/setup (setup_harnesses.sh)")
    if want is not None and have != want:
        return Check("harness", False, f"{name} {have} installed, {want} expected", "run scripts/setup to reinstall")
    return Check("harness", True, f"{name} {have}")


def check_model(cfg: RunConfig) -> Check:
    folder = cfg.model_dir
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        fix = "run scripts/setup (prepares the default model) or set [run] model_path to a Hugging Face folder"
        return Check("model", False, f"{folder} is not a model folder (config.json, tokenizer.json)", fix)
    return Check("model", True, str(folder))


def detect_tool_format(cfg: RunConfig) -> str | None:
    """The parser that reads back the tool calls the chat template writes (None: none does)."""
    from services.proxy.chat.model import ChatModel
    from services.proxy.chat.toolparsers import PARSERS

    assert cfg.proxy is not None
    p = cfg.proxy
    for name in PARSERS:
        try:
            ChatModel.load(
                p.model_dir, p.served_model_names, p.chat_template, p.template_overrides, name, p.reasoning_parser
            )
        except ConfigError:
            continue
        return name
    return None


def check_template(cfg: RunConfig) -> Check | None:
    from services.proxy.chat.model import ChatModel

    if cfg.proxy is None:
        return None
    p = cfg.proxy
    try:
        model = ChatModel.load(
            p.model_dir, p.served_model_names, p.chat_template, p.template_overrides, p.tool_parser, p.reasoning_parser
        )
    except ConfigError as e:
        found = detect_tool_format(cfg)
        fix = (
            f"the template writes {found!r} tool calls: set [proxy] tool_parser = {found!r}"
            if found
            else "set [proxy] chat_template to a template that renders tools (e.g. 'hermes-chatml')"
        )
        return Check("chat template", False, str(e), fix)
    return Check("chat template", True, f"{model.template.name} writes {p.tool_parser} tool calls")


def context_window(cfg: RunConfig) -> int | None:
    if cfg.gateway is not None and cfg.gateway.context_window:
        return cfg.gateway.context_window
    if cfg.proxy is not None and cfg.proxy.context_window:
        return cfg.proxy.context_window
    if cfg.gateway is None or cfg.gateway.engine != "local":
        return None  # the engine decides (vLLM's max-model-len, a script's window): checked live
    try:
        data = json.loads((cfg.model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = data.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def check_context(cfg: RunConfig) -> Check:
    window = context_window(cfg)
    if window is None:
        return Check("context", True, "context window: the engine reports it (checked live)")
    if cfg.proxy is not None and cfg.proxy.default_max_tokens >= window:
        fix = f"lower [proxy] default_max_tokens below {window} (e.g. {window // 4})"
        return Check("context", False, f"default_max_tokens {cfg.proxy.default_max_tokens} >= window {window}", fix)
    if cfg.trainer.optim.max_seq_len < window:
        detail = f"trainer max_seq_len {cfg.trainer.optim.max_seq_len} < window {window}: longer samples are skipped"
        return Check("context", True, detail, f"raise [trainer.optim] max_seq_len to {window}", warning=True)
    return Check("context", True, f"window {window} tokens")


def check_group_size(cfg: RunConfig) -> Check:
    g, gps = cfg.run.group_size, cfg.run.groups_per_step
    need = cfg.trainer.algo.min_valid_per_group
    if g < need:
        fix = f"set [run] group_size >= {need} (or lower [trainer.algo] min_valid_per_group)"
        return Check("group size", False, f"G = {g} < min_valid_per_group {need}: every group would be skipped", fix)
    if cfg.trainer.optim.mini_batches > gps:
        fix = f"set [trainer.optim] mini_batches <= {gps} or raise [run] groups_per_step"
        return Check("group size", False, f"{cfg.trainer.optim.mini_batches} mini-batches > {gps} groups/step", fix)
    batch = g * gps
    if cfg.run.sandbox_target is None and batch > cfg.sandbox.concurrency:
        detail = f"batch of {batch} trials > sandbox concurrency {cfg.sandbox.concurrency}: trials queue"
        return Check("group size", True, detail, f"raise [sandbox] concurrency to {batch}", warning=True)
    return Check("group size", True, f"G = {g} x {gps} groups = {batch} trials per step")


def check_disk(cfg: RunConfig) -> Check:
    where = cfg.run_dir
    while not where.exists():
        where = where.parent
    free_gb = shutil.disk_usage(where).free / 2**30
    if free_gb < cfg.run.min_free_disk_gb:
        fix = f"free space under {where} or set [run] runs_dir elsewhere (need {cfg.run.min_free_disk_gb:g} GiB)"
        return Check("disk", False, f"{free_gb:.1f} GiB free under {where}", fix)
    return Check("disk", True, f"{free_gb:.1f} GiB free under {where}")


def check_bwrap(cfg: RunConfig) -> Check | None:
    if cfg.run.sandbox_target or cfg.sandbox.backend != "local":
        return None
    if shutil.which(cfg.sandbox.local.bwrap) is None:
        fix = "install bubblewrap (scripts/setup) or set [sandbox.local] bwrap to its path"
        return Check("bubblewrap", False, f"{cfg.sandbox.local.bwrap!r} not found", fix)
    return Check("bubblewrap", True, shutil.which(cfg.sandbox.local.bwrap) or "")


def _redis_urls(cfg: RunConfig) -> list[tuple[str, str]]:
    out = []
    store = cfg.capture_store
    if store is not None and store.backend == "distributed" and store.redis_url:
        out.append(("[capture_store] redis_url", store.redis_url))
    if cfg.run.sandbox_target is None and cfg.sandbox.queue_url.startswith("redis"):
        out.append(("[sandbox] queue_url", cfg.sandbox.queue_url))
    return out


def check_redis(cfg: RunConfig) -> Check | None:
    import redis

    urls = _redis_urls(cfg)
    if not urls:
        return None
    for where, url in urls:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
            client.ping()
            client.close()
        except (redis.RedisError, ValueError) as e:
            fix = f"start Redis at {_host(url)} or correct {where}"
            return Check("redis", False, f"{where} {url}: {type(e).__name__}: {e}", fix)
    return Check("redis", True, ", ".join(url for _, url in urls))


def check_s3(cfg: RunConfig) -> Check | None:
    store = cfg.capture_store
    if store is None or store.backend != "distributed" or not store.s3_endpoint:
        return None
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    key = store.s3_access_key.get_secret_value() if store.s3_access_key else None
    secret = store.s3_secret_key.get_secret_value() if store.s3_secret_key else None
    client = boto3.client(
        "s3",
        endpoint_url=store.s3_endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=store.s3_region,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=4, retries={"max_attempts": 1}),
    )
    try:
        client.head_bucket(Bucket=store.s3_bucket)
    except ClientError as e:
        if store.s3_create_bucket and e.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
            return Check("s3", True, f"{store.s3_endpoint}: bucket {store.s3_bucket} will be created")
        return Check("s3", False, f"{store.s3_endpoint} bucket {store.s3_bucket}: {e}", "create the bucket or fix s3_*")
    except BotoCoreError as e:
        fix = f"start the S3 server at {store.s3_endpoint} or correct [capture_store] s3_endpoint"
        return Check("s3", False, f"{store.s3_endpoint}: {type(e).__name__}: {e}", fix)
    return Check("s3", True, f"{store.s3_endpoint} bucket {store.s3_bucket}")


def _host(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.hostname}:{parsed.port}"


def check_tasks_load(tasks: Sequence[Path]) -> Check:
    from services.sandbox.task.model import load_task

    bad = []
    for task in tasks:
        try:
            load_task(task)
        except HarnessError as e:
            bad.append(str(e))
    if bad:
        return Check("tasks", False, f"{len(bad)} task(s) do not load: {bad[0]}", "fix or remove the named task")
    return Check("tasks", True, f"{len(tasks)} task(s) load")


# -- live ----------------------------------------------------------------------


def task_digest(task: Path) -> str:
    """Content digest of a task folder (relative paths + bytes): the validation cache key."""
    h = hashlib.sha256()
    for f in sorted(p for p in task.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(task)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    return paths.home() / "cache" / "task-checks"


async def live_checks(
    cfg: RunConfig, gateway_target: str | None, sandbox_target: str, tasks: Sequence[Path], token: str | None = None
) -> Report:
    report = Report()
    started = time.monotonic()
    max_tokens = cfg.proxy.default_max_tokens if cfg.proxy is not None else None
    report.add(await check_engine(gateway_target, token, max_tokens))
    report.checks[-1].seconds = time.monotonic() - started
    if tasks:
        started = time.monotonic()
        report.add(await check_sandbox(cfg, sandbox_target, tasks[0], token))
        report.checks[-1].seconds = time.monotonic() - started
    if cfg.run.validate_tasks and report.ok:
        started = time.monotonic()
        from stack.task_pool import check_pool  # it builds on this module's Check and cache

        report.add(await check_pool(cfg, sandbox_target, tasks, token))
        report.checks[-1].seconds = time.monotonic() - started
    return report


async def check_sandbox(cfg: RunConfig, sandbox_target: str, task: Path, token: str | None) -> Check:
    """One no-op trial through the sandbox service: queue, worker, backend, verifier, capture store."""
    run_id = f"{cfg.run_id}-preflight"
    try:
        async with connect(sandbox_target, token, service="trainer") as channel:
            stub = sandbox_pb2_grpc.SandboxStub(channel)
            from stack.task_pool import trial

            _, _, status = await trial(stub, run_id, f"{run_id}-nop-{time.time_ns()}", task, "nop")
    except grpc.aio.AioRpcError as e:
        fix = f"start the sandbox service at {sandbox_target} or correct [run] sandbox_target"
        return Check("sandbox", False, f"sandbox {sandbox_target}: {e.code().name}: {e.details()}", fix)
    if status.termination_reason != records_pb2.TERMINATION_REASON_COMPLETED:
        reason = records_pb2.TerminationReason.Name(status.termination_reason).removeprefix("TERMINATION_REASON_")
        fix = "check bubblewrap and the [sandbox] settings (work_dir, cache_dir, limits) and the error above"
        if "verify_network" in status.error:  # the task's public verifier: no network to give it
            fix = "change the verify_network named above, or the task's [verifier] network_mode"
        return Check("sandbox", False, f"a no-op trial ended {reason.lower()}: {status.error[:300]}", fix)
    timings = status.timings
    seconds = timings.setup_s + timings.agent_s + timings.verify_s + timings.teardown_s
    backend = "remote" if cfg.run.sandbox_target else cfg.sandbox.backend
    return Check("sandbox", True, f"{backend} backend ran a no-op trial in {seconds:.1f}s")


async def check_engine(target: str | None, token: str | None, max_tokens: int | None = None) -> Check:
    if target is None:
        return Check("engine", False, "no gateway", "set [run] gateway_target or leave it unset to start one")
    try:
        async with connect(target, token) as channel:
            health = await gateway_pb2_grpc.RolloutGatewayStub(channel).Health(
                gateway_pb2.GatewayHealthRequest(), timeout=10
            )
    except grpc.aio.AioRpcError as e:
        fix = f"start the gateway at {target} or correct [run] gateway_target"
        return Check("engine", False, f"gateway {target}: {e.code().name}: {e.details()}", fix)
    healthy = [r for r in health.replicas if r.state == "healthy"]
    if not healthy:
        errors = "; ".join(f"{r.name}: {r.state} {r.error}" for r in health.replicas) or "no replicas"
        return Check("engine", False, f"no healthy engine replica ({errors})", "check the engine's model and logs")
    if max_tokens is not None and health.context_window and max_tokens >= health.context_window:
        fix = f"lower [proxy] default_max_tokens below {health.context_window}"
        return Check("engine", False, f"default_max_tokens {max_tokens} >= the engine's window", fix)
    return Check("engine", True, f"{health.model} loaded, window {health.context_window}, {len(healthy)} replica(s)")


def print_report(report: Report, echo: Callable[[str], Any]) -> None:
    for check in report.checks:
        echo(check.line())
