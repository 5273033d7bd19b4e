"""Offline base images: the images that task Dockerfiles name in ``FROM``,
built from distribution packages where no image registry answers.

Each ``Base`` is one root filesystem (``mmdebstrap``), built once into
``$HARNESSRL_HOME/base-images/`` and imported into a Docker engine under its
names, with Docker's default ``PATH``:

- ``DEBIAN`` (bookworm, with python3, pip, venv, pytest, git, procps: what the
  built-in pool's tasks and verifiers use) as ``python:3.11-slim`` and
  ``debian:bookworm-slim``. Its Python is Debian's 3.11, so the python names
  claim 3.11 only. Like the official python images it has ``python``,
  ``python3``, ``pip`` and ``pip3`` in ``/usr/local/bin`` (links to Debian's),
  and no PEP 668 ``EXTERNALLY-MANAGED`` marker: the official images have none,
  so ``pip install`` works there without ``--break-system-packages``, and here
  too. The debian names get the same links: one rootfs, not two.
- ``NOBLE`` and ``JAMMY`` (Ubuntu's minbase from Ubuntu's archive, checked
  with Ubuntu's archive keyring) as ``ubuntu:24.04`` and ``ubuntu:22.04``: no
  Python, like the official images; apt sources with every component, so a
  Dockerfile's ``apt-get update && apt-get install`` works where the build has
  a network. Noble has the official image's ``ubuntu`` user (uid 1000).

An image is what its name promises to a task, not the registry's image byte
for byte. A user with a registry can skip all of this: a ``FROM`` that is not
present locally is pulled as usual.

Setup builds every rootfs (network is for setup, not for tests): the default
suite imports Debian's in every session and Ubuntu's where a test names it
(``ensure_imported`` with that base's rootfs), and the CLI imports all of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl import paths
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task.dockerfile import DEFAULT_PATH

log = logging.getLogger(__name__)

LABEL = "io.harnessrl.base-image"
# What `docker import` records as the image's config; Docker's default PATH.
CHANGES = (f"ENV PATH={DEFAULT_PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]')
UBUNTU_CHANGES = (f"ENV PATH={DEFAULT_PATH}", 'CMD ["/bin/bash"]')
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
UBUNTU_COMPONENTS = "main restricted universe multiverse"
# Ubuntu's archive keyring as Debian packages it: bookworm has no ubuntu-keyring, trixie
# does. apt fetches it from the host's own Debian mirror (trixie's Release file verified
# by the trixie keys that bookworm's debian-archive-keyring ships), and the package is
# pinned on top: its keys are Ubuntu's archive keys 790BC7277767219C42C86F933B4FE6ACC0B21F32
# and F6ECB3762474EDA9D21B7022871920D1991BC93C (checked when the pin was taken, 2026-12-04).
UBUNTU_KEYRING_PACKAGE = ("ubuntu-keyring", "trixie")
UBUNTU_KEYRING_SHA256 = "b2e7ed48431bf9e7978ae810bbdaf253093570d6e3f864e575b7c13554b81174"
UBUNTU_KEYRING_PATH = "usr/share/keyrings/ubuntu-archive-keyring.gpg"


@dataclass(frozen=True)
class Base:
    """One root filesystem and the image names it is imported under. Every field but
    ``names`` decides what the rootfs (or its image config) holds, so all go into its key."""

    stem: str
    suite: str
    names: tuple[str, ...]
    variant: str = "apt"
    packages: tuple[str, ...] = ()
    # apt lines the build uses; none: mmdebstrap's default (Debian's mirror for the suite).
    sources: tuple[str, ...] = ()
    ubuntu_keyring: bool = False
    # mmdebstrap --customize-hook commands ("$1" is the rootfs).
    hooks: tuple[str, ...] = ()
    changes: tuple[str, ...] = field(default=CHANGES)

    def key(self) -> str:
        """Identifies what the rootfs holds; a change rebuilds it (and re-imports it)."""
        fields = [self.stem, self.suite, self.variant, self.packages, self.sources, self.hooks, self.changes]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def _ubuntu(suite: str, names: tuple[str, ...], hooks: tuple[str, ...] = ()) -> Base:
    pockets = (suite, f"{suite}-updates", f"{suite}-security")
    # Only main for the build (a smaller index to fetch); the image's own sources, like the
    # official image's, have every component and the backports pocket.
    final = "\n".join(f"deb {UBUNTU_ARCHIVE} {p} {UBUNTU_COMPONENTS}" for p in (*pockets, f"{suite}-backports"))
    return Base(
        stem=suite,
        suite=suite,
        names=names,
        variant="minbase",
        # minbase is Essential and Priority: required only; Ubuntu's apt is 'important' (Debian's
        # is 'required'), so it is named, with Ubuntu's keyring: the official image has both,
        # and Harbor's verifiers begin with apt-get update && apt-get install.
        packages=("apt", "ubuntu-keyring"),
        sources=tuple(f"deb {UBUNTU_ARCHIVE} {p} main" for p in pockets),
        ubuntu_keyring=True,
        hooks=(f"printf '%s\\n' '{final}' > \"$1/etc/apt/sources.list\"", *hooks),
        changes=UBUNTU_CHANGES,
    )


_PYTHON_LINKS = " && ".join(
    f'ln -sf /usr/bin/{target} "$1/usr/local/bin/{link}"'
    for link, target in (("python", "python3"), ("python3", "python3"), ("pip", "pip3"), ("pip3", "pip3"))
)
DEBIAN = Base(
    stem="bookworm",
    suite="bookworm",
    # The names the built-in pool, the examples and the tests use in FROM.
    names=("python:3.11-slim", "python:3.11-slim-bookworm", "debian:bookworm-slim", "debian:bookworm"),
    packages=("python3", "python3-pip", "python3-venv", "python3-pytest", "git", "procps"),
    hooks=(_PYTHON_LINKS, 'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED'),
)
NOBLE = _ubuntu(
    "noble",
    ("ubuntu:24.04", "ubuntu:noble"),
    hooks=('chroot "$1" useradd --uid 1000 --user-group --create-home --shell /bin/bash --comment Ubuntu ubuntu',),
)
JAMMY = _ubuntu("jammy", ("ubuntu:22.04", "ubuntu:jammy"))
BASES = (DEBIAN, NOBLE, JAMMY)
# What every test session imports (the docker_engine fixture); Ubuntu's only where a test names it.
NAMES = DEBIAN.names
ALL_NAMES = tuple(name for base in BASES for name in base.names)
SUITE = DEBIAN.suite
PACKAGES = DEBIAN.packages


@dataclass(frozen=True)
class Rootfs:
    tar: Path
    key: str
    base: Base = DEBIAN


def key(base: Base = DEBIAN) -> str:
    return base.key()


def base_of(name: str) -> Base:
    """The base an image name is imported from; EnvSetupError listing the names for another."""
    for base in BASES:
        if name in base.names:
            return base
    raise EnvSetupError(f"no offline base image is named {name!r}; known: {', '.join(ALL_NAMES)}")


def default_dir() -> Path:
    return paths.home() / "base-images"


def rootfs(
    out_dir: Path | None = None, *, base: Base = DEBIAN, rebuild: bool = False, timeout_s: float = 900
) -> Rootfs:
    """The rootfs tar of ``base``, built with mmdebstrap when missing (about 30-90 s,
    100-350 MB). Concurrent callers (test sessions, setup) wait for one build."""
    out_dir = out_dir or default_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    tar = out_dir / f"{base.stem}-{base.key()}.tar"
    with _locked(out_dir / f".{base.stem}.lock"):
        if tar.exists() and not rebuild:
            return Rootfs(tar=tar, key=base.key(), base=base)
        _build(base, out_dir, tar, timeout_s)
    return Rootfs(tar=tar, key=base.key(), base=base)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(base: Base, out_dir: Path, tar: Path, timeout_s: float) -> None:
    binary = shutil.which("mmdebstrap")
    if binary is None:
        raise EnvSetupError("mmdebstrap not found; run scripts/setup (Debian package mmdebstrap)")
    partial = tar.with_suffix(".partial.tar")
    argv = [binary, "--quiet", f"--variant={base.variant}"]
    if base.packages:
        argv.append(f"--include={','.join(base.packages)}")
    if base.ubuntu_keyring:
        argv.append(f"--keyring={ubuntu_keyring(out_dir)}")
    argv += [f"--customize-hook={hook}" for hook in base.hooks]
    argv += [base.suite, str(partial), *base.sources]
    started = time.monotonic()
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        partial.unlink(missing_ok=True)
        raise EnvSetupError(f"mmdebstrap {base.suite} did not finish in {timeout_s:.0f}s") from e
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise EnvSetupError(f"mmdebstrap {base.suite} failed ({result.returncode}): {result.stderr[-1500:]}")
    partial.rename(tar)
    for stale in out_dir.glob(f"{base.stem}-*.tar"):  # an older package list's: never used again
        if stale != tar:
            stale.unlink(missing_ok=True)
    kv = {"tar": str(tar), "seconds": round(time.monotonic() - started, 1)}
    log.info("base rootfs built", extra={"kv": kv})


def ubuntu_keyring(out_dir: Path) -> Path:
    """Ubuntu's archive keyring: the host's where a package installed it, else the pinned
    Debian package's copy, fetched once into ``out_dir`` by apt from the host's mirror."""
    host = Path("/") / UBUNTU_KEYRING_PATH
    if host.exists():
        return host
    kept = out_dir / "ubuntu-archive-keyring.gpg"
    if kept.exists():
        return kept
    deb = _apt_download(*UBUNTU_KEYRING_PACKAGE)
    if hashlib.sha256(deb).hexdigest() != UBUNTU_KEYRING_SHA256:
        raise EnvSetupError(f"{UBUNTU_KEYRING_PACKAGE[0]} is not the pinned package (sha256 {UBUNTU_KEYRING_SHA256})")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keyring.deb").write_bytes(deb)
        data = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", str(Path(tmp) / "keyring.deb")], capture_output=True, check=True
        ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile(f"./{UBUNTU_KEYRING_PATH}")
        assert member is not None, "the pinned package holds the keyring"
        kept.write_bytes(member.read())
    return kept


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The host's Debian mirror: the first URI of apt's sources that serves a Debian
    release other than its security updates (both the deb822 and the one-line format)."""
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*.sources"))]
    files += sorted((sources / "sources.list.d").glob("*.list"))
    for file in files:
        if not file.is_file():
            continue
        for uri, suites in _source_entries(file.read_text(errors="replace"), deb822=file.suffix == ".sources"):
            if uri.rstrip("/").endswith("/debian") and any(not s.endswith("-security") for s in suites):
                return uri.rstrip("/")
    raise EnvSetupError(f"no Debian mirror in apt's sources under {sources}: install ubuntu-keyring on the host")


def _source_entries(text: str, deb822: bool) -> list[tuple[str, list[str]]]:
    entries = []
    if deb822:
        for stanza in text.split("\n\n"):
            fields = dict(
                (k.strip().lower(), v.strip())
                for k, _, v in (line.partition(":") for line in stanza.splitlines() if not line.startswith("#"))
            )
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                entries += [(uri, fields.get("suites", "").split()) for uri in fields.get("uris", "").split()]
        return entries
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            entries.append((words[1], [words[2]]))
    return entries


def _apt_download(package: str, suite: str) -> bytes:
    """One package of another Debian release, fetched and verified by apt itself from
    the host's mirror, in a scratch state of its own (the host's apt lists are untouched)."""
    with tempfile.TemporaryDirectory(prefix="hrl-apt-") as tmp:
        root = Path(tmp)
        (root / "sources.list").write_text(f"deb {debian_mirror()} {suite} main\n")
        for sub in ("lists/partial", "cache/archives/partial", "parts"):
            (root / sub).mkdir(parents=True)
        options = [
            f"Dir::Etc::SourceList={root / 'sources.list'}",
            f"Dir::Etc::SourceParts={root / 'parts'}",
            f"Dir::State::Lists={root / 'lists'}",
            f"Dir::Cache={root / 'cache'}",
            "Debug::NoLocking=1",
            "APT::Sandbox::User=root",  # the scratch dirs are this process's, not _apt's
        ]
        argv = ["apt-get", "-q", *(x for o in options for x in ("-o", o))]
        for step in (["update"], ["download", package]):
            done = subprocess.run([*argv, *step], cwd=root, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise EnvSetupError(f"apt-get {step[0]} of {package} ({suite}) failed: {done.stderr[-1500:]}")
        found = sorted(root.glob(f"{package}_*.deb"))
        if not found:
            raise EnvSetupError(f"apt-get download {package} ({suite}) wrote no package")
        return found[0].read_bytes()


def ensure_imported(client: object, fs: Rootfs, names: tuple[str, ...] | None = None) -> list[str]:
    """Imports the rootfs into the engine of ``client`` (a docker SDK client) under
    every name (default: its base's) that is absent, or that an older rootfs of ours
    holds; an image of that name from elsewhere (a registry's) is left alone. Returns
    the names tagged."""
    api = client.api  # type: ignore[attr-defined]
    wanted = [n for n in (fs.base.names if names is None else names) if _needs_import(api, n, fs.key)]
    if not wanted:
        return []
    first, rest = wanted[0], wanted[1:]
    repo, tag = first.rsplit(":", 1)
    changes = [*fs.base.changes, f"LABEL {LABEL}={fs.key}"]
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
