"""Where harnessrl keeps what setup prepares: models, harness installs, caches.

Everything lives under one home directory, ``$HARNESSRL_HOME``, by default
``<checkout>/.harnessrl`` (git-ignored), so a checkout is self-contained and
nothing is written outside it unless asked.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def home() -> Path:
    """The harnessrl home directory (``$HARNESSRL_HOME`` or ``<checkout>/.harnessrl``), its
    real path: sandboxes bind what is under it at the same path, and a symlink on the way
    (a worktree's ``.harnessrl`` linked to another checkout's) does not resolve inside them."""
    env = os.environ.get("HARNESSRL_HOME")
    return Path(env).expanduser().resolve() if env else (PROJECT_ROOT / ".harnessrl").resolve()


def models_dir() -> Path:
    return home() / "models"


def default_model_dir() -> Path:
    """The plain Hugging Face folder of the default model, written by setup."""
    return models_dir() / DEFAULT_MODEL_NAME


def tools_dir() -> Path:
    """Project-local installs of the real harnesses (npm prefix, venvs):
    ``$HARNESSRL_TOOLS_DIR`` or ``<home>/tools``."""
    env = os.environ.get("HARNESSRL_TOOLS_DIR")
    return Path(env).expanduser().resolve() if env else home() / "tools"


def runs_dir() -> Path:
    """Run directories (``harnessrl run`` and single ``trial run`` trials):
    ``$HARNESSRL_RUNS_DIR`` or ``<home>/runs``."""
    env = os.environ.get("HARNESSRL_RUNS_DIR")
    return Path(env).expanduser().resolve() if env else home() / "runs"
