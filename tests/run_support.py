"""Helpers of the ``harnessrl run`` / ``preflight`` / ``eval`` tests: a tiny model,
a small task pool, a scripted policy and a shell agent that talks to the proxy,
and a config file tying them together (the scripted engine is a test fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.sandbox_support import make_task
from tests.test_gateway_support import tiny_llama

# A minimal agent: asks the model (OpenAI chat, one bash tool) and runs the command
# it returns; trials with an odd index ignore the model's command, so every group
# has successes and failures (a non-zero advantage) whatever the scripted policy says.
AGENT = r"""set -e
python3 - <<'PY'
import json, os, subprocess, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
obey = int(os.environ["HARNESSRL_TRIAL_ID"].rsplit("-", 1)[1]) % 2 == 0
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command in /app.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are a coding agent. Use the bash tool."},
            {"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}]
for turn in range(3):
    body = json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
    req = urllib.request.Request(f"{base}/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    message = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["message"]
    messages.append(message)
    calls = message.get("tool_calls") or []
    if not calls:
        break
    for call in calls:
        command = json.loads(call["function"]["arguments"])["command"] if obey else "true"
        run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd="/app")
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": (run.stdout + run.stderr)[-2000:]})
PY
"""

SCRIPT = {
    "context_window": 8192,
    "threads": {
        "main": [
            {
                "content": "I will write the file.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > hello.txt"}}],
            },
            {"content": "Done."},
        ],
        "*": [{"content": "A title"}],
    },
}


def make_pool(root: Path, names: tuple[str, ...] = ("alpha", "beta")) -> Path:
    pool = root / "pool"
    for name in names:
        make_task(pool, name)
    return pool


def write_config(
    tmp: Path,
    model: Path,
    pool: Path,
    *,
    run: dict[str, Any] | None = None,
    extra: str = "",
    local_verify_network: str | None = "none",
) -> Path:
    """A run config over ``pool`` with the scripted engine, the shell agent and ``model``. The
    pool's verifiers need no network: ``local_verify_network`` 'none' says so (None: the default)."""
    (tmp / "agent.sh").write_text(AGENT)
    (tmp / "script.json").write_text(json.dumps(SCRIPT))
    fields: dict[str, Any] = {
        "run_id": "e2e",
        "runs_dir": str(tmp / "runs"),
        "steps": 2,
        "group_size": 2,
        "groups_per_step": 2,
        "harness": "shell",
        "engine": f"scripted:{tmp / 'script.json'}",
        "model_path": str(model),
        "train_tasks": [str(pool)],
        "max_turns": 4,
        "seed": 1,
        "calibrate": False,  # seconds of the default model per run; test_run_progress.py checks it
        # The default 2 GiB is the quickstart's (its checkpoints); these runs write a few MB,
        # and CI's shared disk has been seen with 2.0 GiB free (test_preflight checks the check).
        "min_free_disk_gb": 0.25,
    } | (run or {})
    lines = ["[run]"] + [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    lines.append(f'harness_options = {{ script_path = "{tmp / "agent.sh"}" }}')
    lines += [
        "",
        "[sandbox]",
        f'work_dir = "{tmp / "sb" / "trials"}"',
        f'cache_dir = "{tmp / "sb" / "cache"}"',
        "concurrency = 4",
        "default_agent_timeout_s = 60",
        "default_verifier_timeout_s = 30",
        "",
        "[capture_store]",
        "fsync = false",
        "",
        "[trainer.optim]",
        "gradient_checkpointing = false",
        "lr = 1e-4",
        "",
        "[trainer.rollout]",
        "max_staleness = 0",
    ]
    if local_verify_network is not None:
        lines += ["", "[sandbox.local]", f'verify_network = "{local_verify_network}"']
    path = tmp / "run.toml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def tiny_model(folder: Path) -> Path:
    return tiny_llama(folder)


# One model call (the engine's forward passes), then trials with an even index solve the
# task, odd ones do not: every group has a non-zero advantage, so the trainer takes a step.
ONE_CALL_AGENT = r"""set -e
python3 - <<'PY'
import json, os, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
body = json.dumps({"model": model, "max_tokens": 8,
                   "messages": [{"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}]}).encode()
req = urllib.request.Request(f"{base}/chat/completions", data=body,
                             headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
json.load(urllib.request.urlopen(req, timeout=120))
if int(os.environ["HARNESSRL_TRIAL_ID"].rsplit("-", 1)[1]) % 2 == 0:
    open("/app/hello.txt", "w").write("hello\n")
PY
"""


def local_engine_run(tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``harnessrl run`` of one step with the local engine (the tiny random model: real forward
    passes), ``ONE_CALL_AGENT`` in bubblewrap, the real trainer; returns it and its run directory."""
    run = {"steps": 1, "engine": "local"}
    # The agent sends no tools: its thread is the main one all the same (trainable), as in the quickstart.
    proxy = "\n[proxy]\ndefault_max_tokens = 8\nmain_requires_tools = false\n"
    config = write_config(tmp, tiny_model(tmp / "tiny"), make_pool(tmp), run=run, extra=proxy)
    (tmp / "agent.sh").write_text(ONE_CALL_AGENT)
    command = [sys.executable, "-m", "stack.cli", "run", str(config)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=540, env=os.environ)
    return proc, tmp / "runs" / "e2e"
