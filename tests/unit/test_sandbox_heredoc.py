"""Dockerfile heredocs read as BuildKit reads them (task/dockerfile.py) and what they mean
(task/heredoc.py): the process a RUN starts, the file a COPY writes, and the classic
builder's rewrite of the same Dockerfile. No engine needed; the builds are in
tests/integration/test_sandbox_heredoc_build.py."""

from __future__ import annotations

import pytest

from services.sandbox.task import dockerfile, heredoc

HEREDOCS = (
    "FROM x\n"
    "ARG WHO=world\n"
    "RUN <<EOF\n"
    'echo "hi $WHO"\n'
    "EOF\n"
    "RUN <<-'EOT'\n"
    "\t#!/usr/bin/env python3\n"
    "\tprint('py')\n"
    "\tEOT\n"
    'COPY --chown=1000 <<A <<-"B" /etc/app/\n'
    "hello ${WHO}\n"
    "A\n"
    "\tkeep $WHO\n"
    "\tB\n"
    "RUN cat <<X > /x && cat <<-Y > /y\n"
    "one\n"
    "X\n"
    "\ttwo\n"
    "\tY\n"
    "ENV DONE=1\n"
)


def test_heredocs_are_read_as_buildkit_reads_them() -> None:
    ins = dockerfile.parse(HEREDOCS)
    assert [(i.keyword, i.line, i.end) for i in ins] == [
        ("FROM", 1, 1),
        ("ARG", 2, 2),
        ("RUN", 3, 5),
        ("RUN", 6, 9),
        ("COPY", 10, 14),
        ("RUN", 15, 19),
        ("ENV", 20, 20),
    ]
    assert heredoc.run_plan(ins[2]) == heredoc.RunPlan(["/bin/sh", "-c", 'echo "hi $WHO"\n'])
    # A #! body runs as a file at /dev/pipes/NAME; <<- strips the tabs.
    shebang = heredoc.run_plan(ins[3])
    assert shebang.argv == ["/bin/sh", "-c", "/dev/pipes/EOT"]
    assert shebang.pipe == ("EOT", "#!/usr/bin/env python3\nprint('py')\n")
    a, b = ins[4].heredocs
    assert (a.expand, b.expand, b.chomp) == (True, False, True)
    assert heredoc.copy_file(a, {"WHO": "you"}) == b"hello you\n"
    assert heredoc.copy_file(b, {"WHO": "you"}) == b"keep $WHO\n"  # quoted: never expanded
    assert dockerfile.copy_args(ins[4], {}) == ([], "/etc/app/")
    # Anything else: the shell reads the heredocs itself, from the command line BuildKit builds.
    assert heredoc.run_plan(ins[5]).argv == ["/bin/sh", "-c", "cat <<X > /x && cat <<-Y > /y\none\nX\n\ttwo\nY"]


def test_the_classic_builder_gets_the_same_meaning_without_heredocs() -> None:
    out = heredoc.classic(HEREDOCS, {"x": {"WHO": "base"}})
    assert out is not None
    lines = out.text.splitlines()
    assert lines[0:2] == ["FROM x", "ARG WHO=world"] and lines[-1] == "ENV DONE=1"
    assert lines[2] == 'RUN ["/bin/sh", "-c", "echo \\"hi $WHO\\"\\n"]'
    assert "/dev/pipes/EOT" in lines[3]
    copy = lines[4]
    assert copy.startswith("COPY --chown=1000 [") and copy.endswith('"/etc/app/"]')
    assert out.files == {".harnessrl-heredocs/10-0/A": b"hello world\n", ".harnessrl-heredocs/10-1/B": b"keep $WHO\n"}
    assert heredoc.classic("FROM x\nRUN echo\n") is None
    # ARGs as BuildKit scopes them: a global one redeclared in the stage, several per line, build args first.
    args = heredoc.classic("ARG V=1\nFROM x\nARG V A=2 B\nCOPY <<E /e\n$V $A $B.\nE\n", {}, {"B": "b"})
    assert args is not None and args.files == {".harnessrl-heredocs/4-0/E": b"1 2 b.\n"}


def test_what_the_classic_builder_cannot_replay_is_refused_by_name() -> None:
    with pytest.raises(dockerfile.DockerfileError, match="USER app"):
        heredoc.classic("FROM x\nUSER app\nRUN <<E\n#!/bin/sh\nE\n")
    with pytest.raises(dockerfile.DockerfileError, match="RUN --mount"):
        heredoc.classic("FROM x\nRUN --mount=type=cache,target=/c <<E\necho\nE\n")
