"""What a Dockerfile heredoc means, as BuildKit's Dockerfile frontend builds it
(``dockerfile2llb/convert.go`` ``dispatchRun`` and ``dispatchCopy``), for both
backends: the local backend replays it (``backends/layers.py``); the docker backend's
engine (Debian's docker.io 20.10, classic builder) cannot read heredocs at all, so
``classic`` rewrites the Dockerfile into instructions the classic builder reads, with
the same meaning (docs/harbor.md, "Dockerfile heredocs").

RUN (shell form; ``shell`` is the stage's SHELL, default ``/bin/sh -c``):
- the command is one heredoc and its body starts ``#!``: the body is a file
  ``/dev/pipes/NAME`` (mode 0755, read-only) and the command is ``shell + [that path]``;
- the command is one heredoc otherwise: ``shell + [body]`` (``<<-`` strips leading tabs);
- anything else (``RUN python3 <<EOF``, ``RUN cat <<A >a <<B >b``): the shell reads the
  heredocs itself: ``shell + [command + "\\n" + body + NAME for each heredoc]``.
The body is never expanded by the Dockerfile (the shell expands what it expands).

COPY/ADD: each heredoc is a file named NAME, mode 0644 (``--chmod`` wins), with the body
(``<<-``: tabs stripped), ``$VAR``/``${VAR}``/``${VAR:-x}`` expanded from the build's ARG
and ENV unless the delimiter was quoted; copied to the destination as a source file is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from services.sandbox.task import dockerfile
from services.sandbox.task.dockerfile import DockerfileError, Heredoc, Instruction

DEFAULT_SHELL = ("/bin/sh", "-c")
PIPES = "/dev/pipes"
# Where ``classic`` puts COPY heredoc files in the build context it sends.
CONTEXT_DIR = ".harnessrl-heredocs"
CLASSIC_DOCKERFILE = ".harnessrl-heredocs.Dockerfile"


@dataclass(frozen=True)
class RunPlan:
    argv: list[str]
    # (name, body) of the file a ``#!`` heredoc runs from, at PIPES/name; None otherwise.
    pipe: tuple[str, str] | None = None


def run_plan(ins: Instruction, shell: tuple[str, ...] = DEFAULT_SHELL) -> RunPlan:
    """The process a RUN with heredocs starts, as BuildKit's."""
    if ins.is_exec_form or not ins.heredocs:
        raise DockerfileError(f"line {ins.line}: RUN heredocs need the shell form")
    command = ins.raw.strip()
    first = ins.heredocs[0]
    if len(ins.heredocs) == 1 and dockerfile.heredoc_word(command) is not None:
        if first.data.startswith("#!"):
            return RunPlan([*shell, f"{PIPES}/{first.name}"], (first.name, first.data))
        return RunPlan([*shell, first.data])
    return RunPlan([*shell, command + "".join(f"\n{h.content}{h.name}" for h in ins.heredocs)])


def copy_file(heredoc: Heredoc, variables: dict[str, str]) -> bytes:
    """The content of a COPY/ADD heredoc's file."""
    text = heredoc.data
    return (dockerfile.substitute(text, variables) if heredoc.expand else text).encode()


@dataclass
class Classic:
    """A Dockerfile the classic builder reads, and the files it needs in the build context."""

    text: str
    files: dict[str, bytes] = field(default_factory=dict)


def classic(
    text: str, variables_of: dict[str, dict[str, str]] | None = None, build_args: dict[str, str] | None = None
) -> Classic | None:
    """``text`` rewritten for the classic builder; None when it has no heredoc (build it as it
    is). Only the heredoc instructions change, every other line stays as written.
    ``variables_of``: a base image's ENV by its name; ``build_args``: the build's --build-arg
    values (both for COPY heredoc expansion, as BuildKit expands it)."""
    instructions = dockerfile.parse(text)
    if not any(ins.heredocs for ins in instructions):
        return None
    lines = text.splitlines()
    out = Classic("")
    replaced: dict[int, tuple[int, str]] = {}
    stage = _Stage(variables_of or {}, build_args or {})
    for ins in instructions:
        stage.track(ins)
        if ins.heredocs:
            replaced[ins.line] = (ins.end, _rewrite(ins, stage, out.files))
    kept: list[str] = []
    number = 1
    while number <= len(lines):
        if number in replaced:
            end, rewritten = replaced[number]
            kept.append(rewritten)
            number = end + 1
            continue
        kept.append(lines[number - 1])
        number += 1
    out.text = "\n".join(kept) + "\n"
    return out


class _Stage:
    """The SHELL, USER and variables in force at each instruction, per build stage."""

    def __init__(self, variables_of: dict[str, dict[str, str]], build_args: dict[str, str]) -> None:
        self.variables_of, self.build_args = variables_of, build_args
        self.global_args: dict[str, str] = {}
        self.shell: tuple[str, ...] = DEFAULT_SHELL
        self.user = ""
        self.vars: dict[str, str] = {}
        self.in_stage = False

    def track(self, ins: Instruction) -> None:
        kw = ins.keyword
        if kw == "FROM":
            self.in_stage = True
            base = dockerfile.substitute(ins.raw.split()[0] if ins.raw.split() else "", self.global_args)
            self.shell, self.user = DEFAULT_SHELL, ""
            self.vars = {"PATH": dockerfile.DEFAULT_PATH, **self.variables_of.get(base, {})}
        elif kw == "ARG":
            for word in ins.raw.split():  # ARG A=1 B: each name, with its default where it has one
                name, sep, default = word.partition("=")
                value = dockerfile.substitute(default.strip('"'), {**self.global_args, **self.vars})
                target = self.vars if self.in_stage else self.global_args
                if name in self.build_args:
                    target[name] = self.build_args[name]
                elif sep:
                    target[name] = value
                elif self.in_stage and name in self.global_args:
                    target[name] = self.global_args[name]
        elif kw == "ENV":
            self.vars.update(dockerfile.parse_env(ins.raw, self.vars, ins.line))
        elif kw == "SHELL":
            self.shell = tuple(ins.exec_args())
        elif kw == "USER":
            self.user = dockerfile.substitute(ins.raw.strip(), self.vars)


def _rewrite(ins: Instruction, stage: _Stage, files: dict[str, bytes]) -> str:
    if ins.keyword == "RUN":
        if ins.flags:
            raise DockerfileError(f"line {ins.line}: RUN --{next(iter(ins.flags))} is not read by the classic builder")
        plan = run_plan(ins, stage.shell)
        if plan.pipe is None:
            return "RUN " + json.dumps(plan.argv)
        if stage.user.split(":")[0] not in ("", "root", "0"):
            raise DockerfileError(
                f"line {ins.line}: a #! heredoc RUN under USER {stage.user} cannot be replayed for the classic "
                f"builder (it writes {PIPES}, which only root may)"
            )
        name, body = plan.pipe
        path = f"{PIPES}/{name}"
        # /dev is a tmpfs of the build container: nothing written there reaches the layer.
        marker = _unique_marker(body)
        script = (
            f"mkdir -p {PIPES} && cat > {path} <<'{marker}'\n{body}{'' if body.endswith(chr(10)) else chr(10)}"
            f"{marker}\nchmod 0755 {path} && {path}"
        )
        if not body.endswith("\n"):
            # cat adds the newline a heredoc always ends with: strip it so the file is the body, byte for byte.
            script = script.replace(f"chmod 0755 {path}", f"truncate -s -1 {path} && chmod 0755 {path}")
        return "RUN " + json.dumps([*stage.shell, script])
    sources, dest = dockerfile.copy_args(ins, stage.vars)
    names = []
    for index, heredoc in enumerate(ins.heredocs):
        rel = f"{CONTEXT_DIR}/{ins.line}-{index}/{heredoc.name}"
        files[rel] = copy_file(heredoc, stage.vars)
        names.append(rel)
    flags = " ".join(f"--{k}={v}" if v else f"--{k}" for k, v in ins.flags.items())
    return f"{ins.keyword} {flags + ' ' if flags else ''}{json.dumps([*sources, *names, dest])}"


def _unique_marker(body: str) -> str:
    marker = "HARNESSRL_HEREDOC"
    while marker in body:
        marker += "_"
    return marker
