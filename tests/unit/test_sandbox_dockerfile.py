"""The Dockerfile parser the local backend replays."""

from __future__ import annotations

import pytest

from services.sandbox.task import dockerfile


def test_continuations_comments_flags_and_forms() -> None:
    text = """
    # a comment
    FROM python:3.12 AS base
    RUN apt-get update && \\
        # inside a continuation
        apt-get install -y git
    COPY --chown=1000:1000 src/ /app/src/
    RUN ["python", "-c", "print(1)"]
    env A=1
    """
    ins = dockerfile.parse(text)
    assert [i.keyword for i in ins] == ["FROM", "RUN", "COPY", "RUN", "ENV"]
    assert ins[1].raw == "apt-get update && apt-get install -y git"
    assert ins[1].line == 4
    assert ins[2].flags == {"chown": "1000:1000"}
    assert ins[3].is_exec_form and ins[3].exec_args() == ["python", "-c", "print(1)"]


def test_bad_exec_form_and_unterminated_heredoc_are_errors_naming_the_line() -> None:
    (ins,) = dockerfile.parse('RUN ["unterminated"\n')
    with pytest.raises(dockerfile.DockerfileError, match="line 1"):
        ins.exec_args()
    with pytest.raises(dockerfile.DockerfileError, match="line 2: heredoc <<EOF is not terminated"):
        dockerfile.parse("FROM x\nRUN <<EOF\necho\nEO\n")


def test_substitution_and_env_forms() -> None:
    assert dockerfile.substitute("$A/${B}/${C:-dflt}/$D", {"A": "a", "B": "b"}) == "a/b/dflt/"
    assert dockerfile.parse_env('A=1 B="two words" C=$A', {}, 1) == {"A": "1", "B": "two words", "C": "1"}
    assert dockerfile.parse_env("PATH /opt/bin:$PATH", {"PATH": "/usr/bin"}, 1) == {"PATH": "/opt/bin:/usr/bin"}
    with pytest.raises(dockerfile.DockerfileError, match="line 3"):
        dockerfile.parse_env("=x", {}, 3)


def test_copy_args() -> None:
    (ins,) = dockerfile.parse('COPY ["a b", "c", "/dst/"]\n')
    assert dockerfile.copy_args(ins, {}) == (["a b", "c"], "/dst/")
    (ins,) = dockerfile.parse("COPY only\n")
    with pytest.raises(dockerfile.DockerfileError, match="source and a destination"):
        dockerfile.copy_args(ins, {})
