"""The keys of the Docker backend's image caches: which images a Dockerfile
builds on (their ids go into the build's tag), and what a prepared image's tag
depends on. The engine-side behaviour is in tests/integration/test_sandbox_docker_images.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.backends.docker_images import base_images, build_log_tail, build_tag, prepared_tag
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("FROM ubuntu:24.04\n", ["ubuntu:24.04"]),
        ("FROM --platform=linux/amd64 ubuntu:24.04 AS x\n", ["ubuntu:24.04"]),
        ("ARG BASE=python:3.11-slim\nFROM ${BASE}\n", ["python:3.11-slim"]),
        ("ARG V=3.11\nARG BASE=python:${V}-slim\nFROM $BASE AS b\n", ["python:3.11-slim"]),
        ("ARG BASE\nFROM ${BASE:-debian:bookworm}\n", ["debian:bookworm"]),
        # Only ARGs before the first FROM apply to FROM lines.
        ("FROM a:1\nARG X=b:2\nFROM ${X:-c:3}\n", ["a:1", "c:3"]),
        ("FROM scratch\nCOPY x /x\n", []),
        (
            "FROM python:3.11-slim AS build\nFROM Build\nFROM debian:bookworm-slim\n",
            ["python:3.11-slim", "debian:bookworm-slim"],
        ),
        (
            "FROM a:1 AS one\nFROM b:2\nCOPY --from=one /x /x\nCOPY --from=0 /y /y\nCOPY --from=c:3 /z /z\n",
            ["a:1", "b:2", "c:3"],
        ),
        ("FROM a:1\nFROM a:1\n", ["a:1"]),
    ],
)
def test_base_images_of_a_dockerfile(tmp_path: Path, dockerfile: str, expected: list[str]) -> None:
    assert base_images(load_task(make_task(tmp_path, dockerfile=dockerfile))) == expected


def test_an_unreadable_dockerfile_has_no_known_bases(tmp_path: Path) -> None:
    # A heredoc that is never terminated: the parser refuses it (a terminated one is read).
    task = load_task(make_task(tmp_path, dockerfile="FROM a:1\nRUN <<EOF\necho hi\n"))
    assert base_images(task) is None, "None: the engine's build cache decides, never a stale tag"


def test_a_build_tag_changes_with_any_base_image_id() -> None:
    tag = build_tag("env", ["sha256:1", "sha256:2"])
    assert tag.startswith("harnessrl-env:") and tag == build_tag("env", ["sha256:1", "sha256:2"])
    assert tag != build_tag("env", ["sha256:1", "sha256:3"]) and tag != build_tag("other", ["sha256:1", "sha256:2"])


def test_a_prepared_tag_depends_on_the_workdir_and_the_squash_policy() -> None:
    tags = {
        prepared_tag(image, workdir, squash)
        for image in ("sha256:a", "sha256:b")
        for workdir in ("/app", "/srv")
        for squash in (True, False)
    }
    assert len(tags) == 8 and all(t.startswith("harnessrl-prep:") for t in tags)
    assert prepared_tag("sha256:a", "/app", True) == prepared_tag("sha256:a", "/app", True)


def test_a_failed_builds_log_tail_is_whole_lines_without_colour_codes() -> None:
    """As a real build's log ends (pip under an intercepted TLS, seen on the cookbook's
    multi-container recipe): the error shows whole lines, not '...ate chain' cut mid-word."""
    log = [{"stream": "Step 3/5 : RUN pip install flask\n"}, {"stream": "\x1b[91mWARNING: Retrying after SSLError("}]
    log += [{"stream": "certificate verify failed: unable to get local issuer certificate chain\x1b[0m\n"}]
    log += [{"error": "The command '/bin/sh -c pip install flask' returned a non-zero code: 1"}]
    whole = build_log_tail(log, 10_000)
    assert "\x1b" not in whole and whole.startswith("Step 3/5") and whole.endswith("code: 1")
    tail = build_log_tail(log, 90)
    assert tail == "The command '/bin/sh -c pip install flask' returned a non-zero code: 1", tail
    assert build_log_tail([{"stream": "x" * 50}], 10) == "x" * 10  # one long line: its end
