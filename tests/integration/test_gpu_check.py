"""scripts/gpu_check on the CPU, in a Python that sees only the standard library,
torch, transformers and what they depend on (what the GPU host has): a site
folder of links to exactly those distributions, ``python -S`` so nothing else
is on the path. It must run, write its JSON, and show R3 helping."""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from services.gateway.settings import Settings as GatewaySettings
from stack.bench.gpu_check import EngineOptions, main, parse_args

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check"
CPU_SIZES = ["--device", "cpu", "--preset", "tiny", "--rows", "8", "--prompt-tokens", "4", "--response-tokens", "44"]


def closure(*names: str) -> list[md.Distribution]:
    """The distributions ``names`` need to import (requirements without extras, markers evaluated)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional platform dependency (nvidia-*, triton) not on this host
        seen[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


@pytest.fixture(scope="module")
def torch_only_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    for dist in closure("torch", "transformers"):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    launcher = tmp_path_factory.mktemp("bin") / "python-S"  # what scripts/gpu_check runs: no site-packages
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    launcher.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    env["PYTHON"] = str(launcher)
    return env


def python(env: dict[str, str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def report_checks(out: Path) -> dict[str, bool]:
    return dict(json.loads(out.read_text())["checks"])


PROBE = """
import importlib, json, sys
missing = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing[name] = e.name
print(json.dumps(missing))
"""


def test_the_torch_only_python_lacks_the_rest(torch_only_env: dict[str, str]) -> None:
    names = ["grpc", "pydantic_settings", "verl", "vllm", "google.protobuf", "redis", "accelerate"]
    names += ["harnessrl.config", "harnessrl.v1.records_pb2", "services.trainer.samples", "services.gateway.settings"]
    probe = python(torch_only_env, "-c", PROBE, *names)
    assert probe.returncode == 0, probe.stderr
    assert set(json.loads(probe.stdout)) == set(names)


def test_gpu_check_runs_on_cpu_with_only_torch_and_transformers(torch_only_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    run = subprocess.run(  # through the wrapper, from another folder
        [str(SCRIPT), *CPU_SIZES, "--train-steps", "2", "--out", str(out)],
        env=torch_only_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"ok": True, "out": str(out), "checks": report_checks(out)}
    report = json.loads(out.read_text())
    assert report["ok"] and all(report["checks"].values()), report
    assert report["grpc_stand_in"] is True and report["device"] == "cpu"
    # What it imported beyond the standard library: pydantic comes with transformers here, unused.
    assert {"torch", "transformers", "numpy", "harnessrl", "services", "stack"} <= set(report["imported"])
    assert not {"pydantic", "pydantic_settings", "verl", "google", "grpc"} & set(report["imported"])
    assert report["model"]["routers"] == 4 and report["model"]["parameters"] > 1e6
    engine, train, a = report["engine"], report["train"], report["agreement"]
    assert engine["sequences"] == 8 and engine["routes_captured"] and engine["tokens_per_s"] > 0
    assert 8 <= engine["generated_tokens"] <= 8 * 44
    assert a["engine_dtype"] == "bf16" and a["train_dtype"] == "fp32"
    without, with_r3 = a["without_r3"], a["with_r3"]
    assert without["tokens"] == with_r3["tokens"] == engine["generated_tokens"]
    assert with_r3["mean_abs_diff"] < without["mean_abs_diff"]
    assert with_r3["max_abs_diff"] < without["max_abs_diff"]
    assert train["steps"] == 2 and len(train["loss"]) == 2 and train["tokens_per_s"] > 0 and train["routing_replay"]
    assert report["weight_sync"]["engine_version"] == 1
    phases = {"build", "engine_start", "generate", "trainer_load", "agreement", "train", "weight_sync"}
    assert set(report["phases_s"]) == phases and sum(report["phases_s"].values()) <= report["elapsed_s"]
    assert report["elapsed_s"] < 120


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "gpu"], "'gpu' is not valid"),
        (["--rows", "0"], "must be a positive integer"),
        (["--rows", "x"], "invalid _positive value"),
        (["--rows", "300"], "at most 256"),
        (["--preset", "huge"], "invalid choice"),
        (["--prompt-tokens", "250", "--preset", "tiny"], "exceed the tiny model's 256 positions"),
        (["--engine-dtype", "fp16"], "invalid choice"),
        (["--temperature", "0"], "must be in (0, 5]"),
        (["--time-limit-s", "0"], "must be a positive number of seconds"),
        (["--time-limit-s", "nan"], "must be a positive number of seconds"),
        (["--time-limit-s", "soon"], "must be a positive number of seconds"),
    ],
)
def test_bad_arguments_are_refused(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_a_device_this_host_lacks_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--device", "cuda"])
    assert exit_.value.code == 2 and "torch sees no CUDA device" in capsys.readouterr().err


def test_engine_options_mirror_the_gateway_settings() -> None:
    """The check drives LocalEngine with a plain dataclass: every setting the engine
    reads must be there, under the gateway's name and with its default."""
    engines = ROOT / "services" / "gateway" / "engines"
    source = (engines / "local.py").read_text() + (engines / "local_worker.py").read_text()
    read = set(re.findall(r"settings\.(\w+)", source))
    fields = {f.name: f for f in dataclasses.fields(EngineOptions)}
    assert read <= set(fields), read - set(fields)
    defaults = GatewaySettings()
    for name, f in fields.items():
        if name != "model_path":
            assert f.default == getattr(defaults, name), name


def test_past_its_time_limit_it_stops_and_says_so(tmp_path: Path) -> None:
    """A limit no machine meets (building the model alone takes longer): the check stops
    at the phase the limit passed in, names it, and keeps the seconds of the phases before."""
    out = tmp_path / "late.json"
    assert main([*CPU_SIZES, "--time-limit-s", "0.001", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["ok"] is False and "time limit 0.001 s passed" in report["error"], report.get("error")
    order = ["build", "engine_start", "generate", "trainer_load", "agreement", "train", "weight_sync"]
    ran = list(report["phases_s"])
    assert report["traceback"] and ran and ran == order[: len(ran)], ran
    assert report["error"].endswith(ran[-1]) and not report["checks"]["weights_synced"]
