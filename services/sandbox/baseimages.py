"""Offline base images: the images that task Dockerfiles name in ``FROM``,
built from Debian's packages where no image registry answers.

One root filesystem (``mmdebstrap``, Debian bookworm, with python3, venv,
pytest, git, procps: what the built-in pool's tasks and verifiers use) is
built once into ``$HARNESSRL_HOME/base-images/`` and imported into a Docker engine
under every name in ``NAMES``, with Docker's default ``PATH``. Its Python is
Debian's 3.11, so ``python:3.11-slim`` resolves to an image that has what the
name promises to a task (a ``python3`` of that version), not byte for byte
the registry's image. A user with a registry can skip all of this: a ``FROM``
that is not present locally is pulled as usual.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harnessrl import paths
from services.sandbox.dockerfile import DEFAULT_PATH
from services.sandbox.errors import EnvSetupError

log = logging.getLogger(__name__)

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python3-pytest", "git", "procps")
# The names the built-in pool, the examples and the tests use in FROM.
NAMES = ("python:3.11-slim", "python:3.11-slim-bookworm", "debian:bookworm-slim", "debian:bookworm")
# What `docker import` records as the image's config; Docker's default PATH.
CHANGES = (f"ENV PATH={DEFAULT_PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]')
LABEL = "io.harnessrl.base-image"


@dataclass(frozen=True)
class Rootfs:
    tar: Path
    key: str


def key() -> str:
    """Identifies what the rootfs holds; a change rebuilds it."""
    return hashlib.sha256(f"{SUITE}:{','.join(PACKAGES)}".encode()).hexdigest()[:16]


def default_dir() -> Path:
    return paths.home() / "base-images"


def rootfs(out_dir: Path | None = None, *, rebuild: bool = False, timeout_s: float = 900) -> Rootfs:
    """The rootfs tar, built with mmdebstrap when missing (about 30-90 s, ~300 MB)."""
    out_dir = out_dir or default_dir()
    tar = out_dir / f"{SUITE}-{key()}.tar"
    if tar.exists() and not rebuild:
        return Rootfs(tar=tar, key=key())
    binary = shutil.which("mmdebstrap")
    if binary is None:
        raise EnvSetupError("mmdebstrap not found; run scripts/setup (Debian package mmdebstrap)")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = tar.with_suffix(".partial.tar")
    argv = [binary, "--quiet", "--variant=apt", f"--include={','.join(PACKAGES)}", SUITE, str(partial)]
    started = time.monotonic()
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        partial.unlink(missing_ok=True)
        raise EnvSetupError(f"mmdebstrap {SUITE} did not finish in {timeout_s:.0f}s") from e
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise EnvSetupError(f"mmdebstrap {SUITE} failed ({result.returncode}): {result.stderr[-1500:]}")
    partial.rename(tar)
    log.info("base rootfs built", extra={"kv": {"tar": str(tar), "seconds": round(time.monotonic() - started, 1)}})
    return Rootfs(tar=tar, key=key())


def ensure_imported(client: object, fs: Rootfs, names: tuple[str, ...] = NAMES) -> list[str]:
    """Imports the rootfs into the engine of ``client`` (a docker SDK client) under
    every name that is absent, or that an older rootfs of ours holds; an image of
    that name from elsewhere (a registry's) is left alone. Returns the names tagged."""
    api = client.api  # type: ignore[attr-defined]
    wanted = [n for n in names if _needs_import(api, n, fs.key)]
    if not wanted:
        return []
    first, rest = wanted[0], wanted[1:]
    repo, tag = first.rsplit(":", 1)
    changes = [*CHANGES, f"LABEL {LABEL}={fs.key}"]
    answer = api.import_image_from_file(str(fs.tar), repository=repo, tag=tag, changes=changes)
    if "error" in str(answer).lower():
        raise EnvSetupError(f"docker import of {fs.tar} failed: {answer}")
    for name in rest:
        r, t = name.rsplit(":", 1)
        api.tag(first, r, t)
    return wanted


def _needs_import(api: object, name: str, rootfs_key: str) -> bool:
    import docker

    try:
        inspect = api.inspect_image(name)  # type: ignore[attr-defined]
    except docker.errors.ImageNotFound:
        return True  # an engine that cannot answer is its own error, with its cause
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    return LABEL in labels and labels[LABEL] != rootfs_key
