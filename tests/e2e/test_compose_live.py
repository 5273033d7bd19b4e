"""The stack in containers, for real: the cpu profile of docker-compose.yml plus
tests/compose/override.yml, built offline (scripts/wheelhouse, the offline base
images) and brought up on the session's private engine (no bridge, no
iptables: every container uses host networking on 127.0.0.1). A one-step
``harnessrl run`` (scripted engine, tiny model, the shell agent) goes through
the sandbox service in its container with the docker backend; every service
answers its health check (over mTLS: deploy/compose.tls.yml with a throwaway
CA the fixture makes; the run on the host dials with a client certificate too);
one trial's spans from every service arrive as one trace at the OTLP receiver
standing in for Jaeger; ``down -v`` leaves nothing.

Timings (build, up to healthy, the run, down) are printed and written to
``$HRL_DIR/timings.json``; docs/deploy.md ("Containers") quotes them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl.localservers import DockerEngine
from tests.compose.stack import ROOT, TOKEN, Stack, compose_binary
from tests.run_support import make_pool, tiny_model, write_config
from tests.tls_support import make_pki

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a private dockerd needs root"),
    pytest.mark.skipif(shutil.which("dockerd") is None, reason="dockerd not installed (scripts/setup)"),
    pytest.mark.skipif(compose_binary() is None, reason="docker-compose not installed (scripts/setup)"),
    pytest.mark.skipif(not (ROOT / "web" / "dist").is_dir(), reason="web UI not built (scripts/build_web.sh)"),
]

# What each service's spans are called in the trial's trace (services' own names).
TRACE_SERVICES = {"trainer", "sandbox", "proxy", "gateway", "capture_store"}


def ensure_wheelhouse() -> None:
    check = subprocess.run([str(ROOT / "scripts" / "wheelhouse"), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        fill = subprocess.run([str(ROOT / "scripts" / "wheelhouse")], capture_output=True, text=True, timeout=900)
        assert fill.returncode == 0, fill.stderr[-4000:]


@pytest.fixture
def stack(tmp_path: Path, docker_engine: DockerEngine) -> Iterator[Stack]:
    ensure_wheelhouse()
    # The receiver runs from this folder, mounted at the same path in its container.
    (tmp_path / "receiver").mkdir()
    shutil.copy(ROOT / "tests" / "compose" / "otlp_receiver.py", tmp_path / "receiver")
    (tmp_path / "tools").mkdir()
    # mTLS between the containers (deploy/compose.tls.yml) with a throwaway CA.
    pki = make_pki(tmp_path / "pki")
    s = Stack(dir=tmp_path, docker_host=docker_engine.host, project=f"hrl{uuid.uuid4().hex[:8]}", pki=pki)
    try:
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False)


def run_config(stack: Stack) -> Path:
    """The distributed test run (tests/run_support.py) pointed at the stack: one step."""
    model = tiny_model(stack.dir / "tiny")
    config = write_config(stack.dir, model, make_pool(stack.dir))  # writes script.json for the gateway
    text = config.read_text().replace("[capture_store]\nfsync = false\n", "")
    text = re.sub(r"(?m)^engine = .*\n", "", text)
    targets = {
        "capture_target": stack.target("capture_store"),
        "gateway_target": stack.target("gateway"),
        "sandbox_target": stack.target("sandbox"),
        "service_token": TOKEN,
    }
    text = text.replace("[run]\n", "[run]\n" + "".join(f'{k} = "{v}"\n' for k, v in targets.items()))
    text = text.replace("steps = 2", "steps = 1")
    text += f'\n[trainer]\notlp_endpoint = "http://{stack.target("otlp")}"\n'
    config.write_text(text)
    return config


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def one_trial_trace(spans: list[dict[str, Any]], trial_id: str) -> tuple[set[str], list[dict[str, Any]]]:
    """The services whose spans share the trace of ``trial_id``'s trial span."""
    # The trial's own trace is the one the trainer opened to enqueue it; a span of a
    # later read (GetTrajectory) names the trial too, in the reader's trace.
    ids = {
        s["trace_id"]
        for s in spans
        if s["attributes"].get("harnessrl.trial_id") == trial_id and s["name"] == "trainer.enqueue"
    }
    if len(ids) != 1:
        return set(), []
    trace = [s for s in spans if s["trace_id"] in ids]
    return {str(s["service"]) for s in trace}, trace


# The chain of one trial, each hop in the trial's one trace: the sandbox service takes the
# trial, its standalone worker runs it, the gateway generates, the capture store keeps the
# segments and the finalize.
HOPS = [
    ("sandbox", "/harnessrl.v1.Sandbox/SubmitTrial"),
    ("sandbox", "sandbox.trial"),
    ("gateway", "/harnessrl.v1.RolloutGateway/Generate"),
    ("capture_store", "/harnessrl.v1.CaptureStore/AppendSegment"),
    ("capture_store", "/harnessrl.v1.CaptureStore/FinalizeTrajectory"),
]


def wait_for_trace(stack: Stack, timeout: float) -> tuple[str, set[str], list[dict[str, Any]]]:
    """A training trial whose trace holds every service and every hop (each service exports
    in batches, a few seconds apart), or at the deadline the trial whose trace came closest."""
    deadline = time.monotonic() + timeout
    best: tuple[int, str, set[str], list[dict[str, Any]]] = (-1, "", set(), [])
    while time.monotonic() < deadline:
        spans = read_spans(stack.dir / "spans" / "spans.jsonl")
        trials = sorted({str(s["attributes"].get("harnessrl.trial_id", "")) for s in spans} - {""})
        for trial_id in (t for t in trials if t.startswith("e2e-s")):  # training trials, not preflight's
            services, trace = one_trial_trace(spans, trial_id)
            names = {(s["service"], s["name"]) for s in trace}
            score = len(services & TRACE_SERVICES) + sum(hop in names for hop in HOPS)
            if score > best[0]:
                best = (score, trial_id, services, trace)
        if best[0] == len(TRACE_SERVICES) + len(HOPS):
            complete = sum(
                {hop for hop in HOPS} <= {(s["service"], s["name"]) for s in one_trial_trace(spans, t)[1]}
                for t in trials
                if t.startswith("e2e-s")
            )
            print(f"complete trial traces: {complete} of {sum(t.startswith('e2e-s') for t in trials)}")
            break
        time.sleep(1)
    return best[1], best[2], best[3]


def down_leaves_nothing(stack: Stack, before: dict[str, set[str]], timings: dict[str, float]) -> None:
    started = time.monotonic()
    stack.compose("down", "-v", "--timeout", "10")
    timings["down_s"] = time.monotonic() - started
    after = stack.inventory()
    assert after == before, f"left behind by down -v: { {k: after[k] - before[k] for k in after} }"
    (stack.dir / "timings.json").write_text(json.dumps(timings, indent=1))
    print("compose timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}))


# A cold build of every image on a fresh engine is most of it (406-411 s measured on 2 cores).
@pytest.mark.timeout(1800)
def test_compose_stack_runs_a_step_traced_across_every_service(stack: Stack) -> None:
    config = run_config(stack)  # the tiny model and the script the gateway reads
    timings: dict[str, float] = {}
    started = time.monotonic()
    stack.compose("build", timeout=1800)
    timings["build_s"] = time.monotonic() - started

    before = stack.inventory()
    started = time.monotonic()
    stack.compose("up", "-d", "--no-build", timeout=600)
    timings["up_s"] = time.monotonic() - started
    timings["up_to_healthy_s"] = timings["up_s"] + stack.wait_healthy(timeout=300)
    # No bridge, no network of the project's own: host and none are all the engine has.
    assert sorted(stack.docker("network", "ls", "--format", "{{.Name}}").split()) == ["host", "none"]

    started = time.monotonic()
    # The run on the host dials the stack over mTLS too (HARNESSRL_TLS_*: the CA, a client certificate).
    env = {**os.environ, **stack.client_env()}
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "run", str(config)], capture_output=True, text=True, timeout=900, env=env
    )
    timings["run_s"] = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + stack.logs()
    run_dir = stack.dir / "runs" / "e2e"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "done" and info["capture"]["target"] == stack.target("capture_store")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1]
    stack.wait_healthy(timeout=30)  # still, after the run

    trial_id, services, trace = wait_for_trace(stack, timeout=60)
    down_leaves_nothing(stack, before, timings)
    names = {(s["service"], s["name"]) for s in trace}
    assert TRACE_SERVICES <= services, f"trace of {trial_id}: services {sorted(services)}: {sorted(names)}"
    for hop in HOPS:
        assert hop in names, f"trace of {trial_id}: no {hop} span: {sorted(names)}"
    assert any(service == "proxy" for service, _ in names), sorted(names)
