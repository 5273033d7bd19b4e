"""The ``harnessrl`` entry point sets gRPC's polling for the hot-path services before
gRPC is imported (gRPC reads it once, at import)."""

from __future__ import annotations

import subprocess
import sys

from stack.cli.entry import GRPC_ENV, grpc_defaults


def test_hot_path_serve_gets_the_grpc_polling_defaults() -> None:
    for noun in ("proxy", "gateway", "capture"):
        env: dict[str, str] = {}
        grpc_defaults([noun, "serve", "--config", "x.toml"], env)
        assert env == GRPC_ENV


def test_a_variable_already_set_wins() -> None:
    env = {"GRPC_EXPERIMENTS": "", "GRPC_POLL_STRATEGY": "epoll1"}
    grpc_defaults(["gateway", "serve"], env)
    assert env == {"GRPC_EXPERIMENTS": "", "GRPC_POLL_STRATEGY": "epoll1"}


def test_other_commands_keep_grpcs_own_defaults() -> None:
    for argv in (["run", "serve"], ["sandbox", "serve"], ["bench", "vllm-path"], ["gateway"], [], ["serve", "proxy"]):
        env: dict[str, str] = {}
        grpc_defaults(argv, env)
        assert env == {}, argv


def test_the_entry_module_imports_no_grpc() -> None:
    """Were grpc imported before ``grpc_defaults`` ran, the settings would do nothing."""
    code = "import sys, stack.cli.entry; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_hot_path_service_with_a_bad_config_still_fails_clearly(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway]\nport = 'eighty'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "gateway", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "port" in proc.stderr, proc.stderr
