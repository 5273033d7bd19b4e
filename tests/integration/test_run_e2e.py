"""``harnessrl run`` end to end on the embedded stack: real capture store, gateway
(scripted engine: the test fixture policy, with a tiny model's tokenizer and
weights for the trainer), proxy, bubblewrap sandbox, the shell agent talking to the
proxy, the real trainer loop; 2 steps; then a resume that continues the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl import paths
from services.dashboard import rundir
from tests.run_support import AGENT, make_pool, tiny_model, write_config

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def harnessrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack.cli", *args], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def test_run_two_steps_then_resume(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path), run={"steps": 1})
    proc = harnessrl("run", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / "e2e"
    assert "step 1/1" in proc.stdout and "run e2e done after 1 step(s)" in proc.stdout
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "done" and info["group_size"] == 2
    assert info["capture"] == {"backend": "embedded", "dir": "capture"}
    results = sorted((run_dir / "artifacts" / "e2e").glob("*/result.json"))
    assert [p.parent.name for p in results] == [f"e2e-s00000-g{g}-{i}" for g in (0, 1) for i in (0, 1)]
    before = {p: p.stat().st_mtime_ns for p in results}
    rewards = {p.parent.name: json.loads(p.read_text())["reward"] for p in results}
    assert rewards == {"e2e-s00000-g0-0": 1.0, "e2e-s00000-g0-1": 0.0, "e2e-s00000-g1-0": 1.0, "e2e-s00000-g1-1": 0.0}

    # Another seed would plan other tasks for the steps to come: refused, the run untouched.
    proc = harnessrl("run", str(config), "--resume", "e2e", "--steps", "2", "--seed", "4")
    assert proc.returncode == 2 and "was made with seed 1, not 4: resume it with --seed 1" in proc.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"

    proc = harnessrl("run", str(config), "--resume", "e2e", "--steps", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step-00000001 (step 1)" in proc.stdout and "step 2/2" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in results} == before  # finished trials were not run again
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[1]["values"]["reward/mean"] == 0.5 and steps[1]["values"]["batch/groups"] == 2.0
    assert steps[1]["values"].get("dropped/duplicate_groups", 0.0) == 0.0
    assert (run_dir / "trainer" / "checkpoints" / "step-00000002" / "model.safetensors").exists()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"

    run = rundir.open_run(tmp_path / "runs", "e2e")
    assert run.problems == [] and run.info is not None and run.info.status == "done"
    assert len(rundir.read_metrics(run)[0]) == 2


def test_resume_of_a_missing_run_is_a_clear_error(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path))
    proc = harnessrl("run", str(config), "--resume", "nope")
    assert proc.returncode == 2 and "no run 'nope' to resume" in proc.stderr


def test_a_second_fresh_run_with_the_same_id_is_refused(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path))
    (tmp_path / "runs" / "e2e").mkdir(parents=True)
    (tmp_path / "runs" / "e2e" / "run.json").write_text('{"run_id": "e2e", "status": "done"}')
    proc = harnessrl("run", str(config))
    assert proc.returncode == 2 and "use --resume e2e" in proc.stderr


@pytest.mark.slow
def test_dashboard_serves_the_live_run(tmp_path: Path, model: Path) -> None:
    import urllib.request
    from urllib.parse import parse_qs, urlparse

    config = write_config(tmp_path, model, make_pool(tmp_path), run={"steps": 1, "dashboard": True})
    (tmp_path / "agent.sh").write_text(AGENT + "\nsleep 4\n")  # the run lasts while the test looks
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if line.startswith("dashboard: http://127.0.0.1:"):
                url = line.split(" ", 1)[1].strip()
                break
        assert url, "no dashboard URL printed"
        parsed = urlparse(url)
        assert parsed.path == "/runs/e2e"
        token = parse_qs(parsed.query)["token"][0]
        request = urllib.request.Request(
            f"{parsed.scheme}://{parsed.netloc}/api/runs/e2e", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        assert "running" in json.dumps(body)
        rest = proc.stdout.read()
        assert proc.wait(timeout=300) == 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_failed_run_is_recorded_and_exits_1(tmp_path: Path, model: Path) -> None:
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(model, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")  # the trainer cannot load it
    config = write_config(tmp_path, broken, make_pool(tmp_path))
    proc = harnessrl("run", str(config))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "run failed:" in proc.stdout and "run e2e failed after 0 step(s)" in proc.stdout
    info = json.loads((tmp_path / "runs" / "e2e" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"]
