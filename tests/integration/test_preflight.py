"""Preflight: broken setups are caught before training, each with what to change.

Static checks run on the config alone; the live ones (engine, sandbox, task pool)
against the embedded stack started for the check (scripted engine fixture, real
bubblewrap sandbox, real Redis/S3 where configured)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl import paths
from harnessrl.localservers import RedisServer, S3Server, free_port
from stack import preflight, runconfig
from stack.evaluate import preflight_only
from tests.cli_support import run_cli
from tests.run_support import make_pool, tiny_model, write_config
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def checks(report: preflight.Report) -> dict[str, preflight.Check]:
    return {c.name: c for c in report.checks}


def static(tmp_path: Path, model: Path, run: dict[str, object] | None = None, extra: str = "") -> preflight.Report:
    cfg = runconfig.load(write_config(tmp_path, model, make_pool(tmp_path), run=run, extra=extra))
    return preflight.static_checks(cfg, [tmp_path / "pool" / "alpha"])


def test_a_good_config_passes_and_task_checks_are_cached(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path, ("gamma",)))
    make_task(tmp_path / "pool", "delta", instruction=f"Write hello to hello.txt ({tmp_path.name}).")
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = ("harness", "model", "chat template", "group size", "disk", "bubblewrap", "tasks", "engine", "sandbox")
    for name in names:
        assert f"ok    {name}" in proc.stdout
    assert "task pool" in proc.stdout and "preflight ok" in proc.stdout
    cfg = runconfig.load(config)
    for task in cfg.run.train_tasks[0].iterdir():
        assert (preflight.cache_dir() / f"{preflight.task_digest(task)}.json").exists()
    again = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "validated (cached)" in again.stdout


def test_broken_tasks_are_rejected_by_name(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path, ("fine",)))
    make_task(tmp_path / "pool", "wrong-oracle", solve_sh="#!/bin/bash\necho goodbye > hello.txt\n")
    always = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
    make_task(tmp_path / "pool", "free-reward", test_sh=always, instruction=f"free {tmp_path.name}")
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "task pool" in x)
    assert line.startswith("FAIL") and "2 of 3 task(s) rejected" in line
    assert "wrong-oracle: oracle scored 0.0, expected 1" in line and "free-reward: nop scored 1.0, expected 0" in line
    assert "fix: fix the named task(s)" in proc.stdout
    assert "preflight failed" in proc.stderr


def test_a_sandbox_backend_that_cannot_run_a_trial(tmp_path: Path, model: Path) -> None:
    extra = '\n[sandbox.local]\nbwrap = "/bin/false"\nverify_network = "none"\n'
    config = write_config(tmp_path, model, make_pool(tmp_path), extra=extra, local_verify_network=None)
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if " sandbox " in x)
    assert line.startswith("FAIL") and "a no-op trial ended" in line
    assert "check bubblewrap and the [sandbox] settings" in proc.stdout
    assert "task pool" not in proc.stdout  # not validated against a backend that cannot run


def test_run_refuses_to_start_on_a_failed_preflight(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path), run={"group_size": 1})
    proc = run_cli("run", str(config))
    assert proc.returncode == 2
    assert "group size: G = 1 < min_valid_per_group 2" in proc.stderr
    assert not (tmp_path / "runs" / "e2e").exists()


def test_missing_harness_binary_and_wrong_version(tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tools))
    report = static(tmp_path, model, run={"harness": "mini-swe-agent"})
    harness = checks(report)["harness"]
    assert not harness.ok and "not found; run `harnessrl harness install mini-swe-agent`" in harness.detail
    site = tools / "mini-swe-agent" / "lib" / "python3.11" / "site-packages"
    (site / "mini_swe_agent-0.9.0.dist-info").mkdir(parents=True)
    want = preflight.expected_versions()["MINI_SWE_AGENT_VERSION"]
    harness = checks(preflight.static_checks(runconfig.load(tmp_path / "run.toml"), []))["harness"]
    assert not harness.ok and harness.detail == f"mini-swe-agent 0.9.0 installed, {want} expected"
    assert harness.fix == "run `harnessrl harness install mini-swe-agent` to reinstall"
    with pytest.raises(preflight.PreflightFailed, match=r"harness: mini-swe-agent 0\.9\.0 installed"):
        preflight.static_checks(runconfig.load(tmp_path / "run.toml"), []).raise_if_failed()


def test_shell_harness_without_a_script(tmp_path: Path, model: Path) -> None:
    cfg = runconfig.load(write_config(tmp_path, model, make_pool(tmp_path)))
    cfg.run.harness_options.clear()
    harness = checks(preflight.static_checks(cfg, []))["harness"]
    assert not harness.ok and "harness_options" in harness.fix


def test_group_size_batch_and_context(tmp_path: Path, model: Path) -> None:
    assert checks(static(tmp_path, model))["group size"].ok
    cfg = runconfig.load(tmp_path / "run.toml")
    cfg.trainer.optim.mini_batches = 3
    c = preflight.check_group_size(cfg)
    assert not c.ok and "3 mini-batches > 2 groups/step" in c.detail and "mini_batches <= 2" in c.fix
    cfg.trainer.optim.mini_batches = 1
    cfg.sandbox = cfg.sandbox.model_copy(update={"concurrency": 2})
    c = preflight.check_group_size(cfg)
    assert c.ok and c.warning and "batch of 4 trials > sandbox concurrency 2" in c.detail
    cfg.gateway = cfg.gateway.model_copy(update={"engine": "local", "context_window": 2048})  # type: ignore[union-attr]
    cfg.proxy = cfg.proxy.model_copy(update={"default_max_tokens": 4096})  # type: ignore[union-attr]
    c = preflight.check_context(cfg)
    assert not c.ok and "default_max_tokens 4096 >= window 2048" in c.detail and "below 2048" in c.fix


def test_template_parser_mismatch_names_the_right_parser(tmp_path: Path, model: Path) -> None:
    got = checks(static(tmp_path, model, extra='\n[proxy]\ntool_parser = "qwen3_coder"\n'))
    c = got["chat template"]
    assert not c.ok and "does not read the tool calls" in c.detail
    assert c.fix == "the template writes 'hermes' tool calls: set [proxy] tool_parser = 'hermes'"


def test_disk_and_broken_task_config(tmp_path: Path, model: Path) -> None:
    got = checks(static(tmp_path, model, run={"min_free_disk_gb": 1e9}))
    assert not got["disk"].ok and "runs_dir" in got["disk"].fix
    (tmp_path / "pool" / "alpha" / "task.toml").write_text('schema_version = "1.4"\n[task]\nname = 3\n')
    got = checks(preflight.static_checks(runconfig.load(tmp_path / "run.toml"), [tmp_path / "pool" / "alpha"]))
    assert not got["tasks"].ok and "do not load" in got["tasks"].detail


def distributed(redis_url: str, s3: str, bucket: str = "b") -> str:
    return (
        f'\n[capture_store]\nbackend = "distributed"\nredis_url = "{redis_url}"\ns3_endpoint = "{s3}"\n'
        f's3_bucket = "{bucket}"\ns3_access_key = "{S3Server.access_key}"\ns3_secret_key = "{S3Server.secret_key}"\n'
    )


def test_unreachable_redis_and_s3(tmp_path: Path, model: Path) -> None:
    port = free_port()
    extra = distributed(f"redis://127.0.0.1:{port}/0", f"http://127.0.0.1:{free_port()}")
    config = write_config(tmp_path, model, make_pool(tmp_path))
    config.write_text(config.read_text().replace("[capture_store]\nfsync = false\n", "") + extra)
    got = checks(preflight.static_checks(runconfig.load(config), []))
    assert not got["redis"].ok and f"start Redis at 127.0.0.1:{port}" in got["redis"].fix
    assert not got["s3"].ok and "start the S3 server" in got["s3"].fix
    proc = run_cli("run", str(config))
    assert proc.returncode == 2 and "redis:" in proc.stderr and not (tmp_path / "runs").exists()


def test_reachable_redis_and_s3(tmp_path: Path, model: Path, redis_server: RedisServer, s3_server: S3Server) -> None:
    s3_server.client().create_bucket(Bucket="pf-bucket")
    config = write_config(tmp_path, model, make_pool(tmp_path))
    extra = distributed(redis_server.url, s3_server.endpoint, "pf-bucket")
    config.write_text(config.read_text().replace("[capture_store]\nfsync = false\n", "") + extra)
    got = checks(preflight.static_checks(runconfig.load(config), []))
    assert got["redis"].ok and got["s3"].ok, (got["redis"], got["s3"])


async def test_engine_unreachable_is_a_failed_check(tmp_path: Path, model: Path) -> None:
    c = await preflight.check_engine(f"127.0.0.1:{free_port()}", None)
    assert not c.ok and "UNAVAILABLE" in c.detail and "gateway_target" in c.fix


async def test_preflight_only_reports_a_service_that_cannot_start(tmp_path: Path, model: Path) -> None:
    config = write_config(tmp_path, model, make_pool(tmp_path), run={"engine": f"scripted:{tmp_path / 'none.json'}"})
    report = await preflight_only(runconfig.load(config))
    assert not report.ok and "could not start" in checks(report)["services"].detail


MULTI_KEY = """\
#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then v=1; else v=0; fi
echo "{\\"correctness\\": $v, \\"performance\\": $v}" > /logs/verifier/reward.json
"""


def test_tasks_with_several_rewards_need_the_run_to_choose(tmp_path: Path, model: Path) -> None:
    """Refused before training, naming the task and its keys; a run that names a key passes,
    and check-harbor then reports the task's keys and what a run must set."""
    pool = make_pool(tmp_path, ("single",))
    make_task(pool, "graded", test_sh=MULTI_KEY, instruction=f"graded {tmp_path.name}")
    config = write_config(tmp_path, model, pool)
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "task pool" in x)
    assert "1 task(s) write several rewards" in line and "graded: correctness, performance" in line, line
    assert "reward_key" in proc.stdout
    # A run that names a key (every task of its pool writes it) passes.
    (tmp_path / "chosen").mkdir()
    graded = make_task(tmp_path / "chosen" / "pool", "graded", test_sh=MULTI_KEY, instruction=f"c {tmp_path.name}")
    chosen = write_config(tmp_path / "chosen", model, graded.parent, run={"reward_key": "correctness"})
    again = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(chosen)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout
    report = run_cli("tasks", "check-harbor", str(graded))
    assert "its oracle wrote several rewards (correctness, performance)" in report.stdout, report.stdout


def test_a_public_verifier_the_backend_cannot_serve_is_refused_naming_the_setting(tmp_path: Path, model: Path) -> None:
    """verify_network 'auto' with no network to give (here: local's default): every trial of a task
    whose verifier asks for a public network would be refused, so preflight fails before training,
    naming the setting; never a run whose verifiers score 0 for want of a network."""
    config = write_config(tmp_path, model, make_pool(tmp_path), local_verify_network=None)
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "preflight", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if " sandbox " in x)
    assert line.startswith("FAIL") and "env_setup_failed" in line and "verify_network = 'auto'" in line, line
    assert "fix: change the verify_network named above" in proc.stdout
