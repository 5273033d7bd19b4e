#!/usr/bin/env python3
"""Generates the built-in task pool: ``tasks/builtin/{train,heldout}/<family>-NN/``.

Deterministic: the same ``--seed`` writes the same bytes (``tests/unit/test_pool_builtin.py``
regenerates into a temporary directory and compares with the committed pool).
Each family draws its instances from its own ``random.Random(f"{seed}:{family}")``;
instance ``NN`` of a family is train for ``NN < TRAIN`` and held out otherwise, so the
splits share no task id. Instances of one family differ in their parameters (words,
function, names), so no two tasks share an instruction; the generator checks that
every Python bug really breaks at least one verifier case.

Tasks need no network and only the base system (bash, coreutils, python3): the
verifiers use plain ``assert`` scripts rather than pytest, which a ``python:*-slim``
image lacks. Usage::

    python scripts/gen_task_pool.py [--out tasks/builtin] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 7
TRAIN = 8
HELDOUT = 3
ROOT = Path(__file__).resolve().parents[1]

WORDS = (
    "apple banana cherry delta ember falcon garnet harbor indigo jasper kettle lemon mango nectar "
    "orbit pepper quartz raven saffron tulip umber velvet walnut yonder zephyr amber birch cedar "
    "dune fjord grove heron iris juniper kiwi lotus maple"
).split()
MODULES = "helpers tools calc utils core mathops numlib textops".split()

TOML = """\
schema_version = "1.4"

[task]
name = "harnessrl/{name}"
description = "{description}"
keywords = ["builtin", "{family}"]

[metadata]
category = "{family}"
tags = [{tags}]
difficulty = "easy"
split = "{split}"

[agent]
timeout_sec = 300

[verifier]
timeout_sec = 60

[environment]
memory_mb = 2048
storage_mb = 256
network_mode = "no-network"
"""

# The checks run the agent's code in their own process, so their exit status alone can be
# forged by it (``os._exit(0)`` at import: status 0, no check ran). Reward 1 needs the report
# that the check script's last line writes, after every check: an early exit leaves none.
# What still gets through (issue 45): code in the process that writes the report itself or
# patches the checks (``assert`` cannot be patched, but the functions they call can); the
# sandbox's suspicious-change detector counts those patterns, and can zero the reward.
PY_TEST_SH = """\
#!/bin/bash
# Reward 1 when every check in {script} ran against /app and passed, else 0.
cd /app || {{ echo 0 > /logs/verifier/reward.txt; exit 0; }}
rm -f /logs/verifier/checks-passed
if PYTHONDONTWRITEBYTECODE=1 python3 /tests/{script} && [ -f /logs/verifier/checks-passed ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

PY_TEST_HEAD = """\
import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
"""
PY_TEST_TAIL = """
# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\\n")
"""


@dataclass
class Instance:
    """One task: its instruction, the files of /app, the verifier and the oracle."""

    family: str
    description: str
    instruction: str
    tests: dict[str, str]
    solve: str
    app: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    image: str = "debian:bookworm-slim"


def _heredoc(path: str, text: str) -> str:
    return f"mkdir -p \"$(dirname '{path}')\"\ncat > '{path}' <<'HARNESSRL_EOF'\n{text}HARNESSRL_EOF\n"


def _py_task(
    family: str, description: str, instruction: str, app: dict[str, str], fixed: dict[str, str], check: str
) -> Instance:
    """A task over files in /app whose oracle rewrites ``fixed`` and whose verifier runs ``check``."""
    solve = "#!/bin/bash\nset -e\n" + "".join(_heredoc(p, t) for p, t in fixed.items())
    return Instance(
        family=family,
        description=description,
        instruction=instruction,
        tests={"test.sh": PY_TEST_SH.format(script="check.py"), "check.py": PY_TEST_HEAD + check + PY_TEST_TAIL},
        solve=solve,
        app=app,
        tags=("python",),
        image="python:3.11-slim-bookworm",
    )


# ---------------------------------------------------------------- echo / file


def echo_family(rng: random.Random, n: int) -> list[Instance]:
    out = []
    for word in rng.sample(WORDS, n):
        test = (
            "#!/bin/bash\n# Reward 1 when /app/answer.txt holds exactly the word.\n"
            f'if [ "$(cat /app/answer.txt 2>/dev/null)" = "{word}" ]; then echo 1 > /logs/verifier/reward.txt\n'
            "else echo 0 > /logs/verifier/reward.txt; fi\n"
        )
        out.append(
            Instance(
                family="echo",
                description=f"Write the word {word} to answer.txt.",
                instruction=(
                    f"Write the word `{word}` into a file named `answer.txt` in the current directory "
                    f"by running this command:\n\n```bash\necho {word} > answer.txt\n```\n"
                ),
                tests={"test.sh": test},
                solve=f"#!/bin/bash\necho {word} > answer.txt\n",
                tags=("shell",),
            )
        )
    return out


def file_family(rng: random.Random, n: int) -> list[Instance]:
    out = []
    dirs = rng.sample(["notes", "docs", "data", "config", "out", "logs", "share", "src", "res", "lists", "drafts"], n)
    for d in dirs:
        name = f"{d}/{rng.choice(WORDS)}.txt"
        lines = [" ".join(rng.sample(WORDS, 2)) for _ in range(rng.randint(2, 3))]
        body = "\n".join(lines) + "\n"
        check = textwrap.dedent(f"""\
            path = {name!r}
            assert os.path.isfile(path), f"{{path}} is missing"
            text = open(path).read()
            assert text.rstrip("\\n") == {body.rstrip(chr(10))!r}, repr(text)
            """)
        block = textwrap.indent(body, "    ")
        out.append(
            Instance(
                family="file",
                description=f"Create {name} with {len(lines)} given lines.",
                instruction=f"Create the file `{name}` containing exactly these {len(lines)} lines:\n\n{block}",
                tests={
                    "test.sh": PY_TEST_SH.format(script="check.py"),
                    "check.py": PY_TEST_HEAD + check + PY_TEST_TAIL,
                },
                solve="#!/bin/bash\nset -e\n" + _heredoc(name, body),
                tags=("shell",),
                image="python:3.11-slim-bookworm",
            )
        )
    return out


# ---------------------------------------------------------------- python functions


@dataclass(frozen=True)
class Func:
    name: str
    params: str
    body: str  # the correct return expression
    doc: str
    inputs: Callable[[random.Random], tuple[Any, ...]]
    bug: str = ""  # a one-line bug: another return expression

    def source(self, expr: str | None = None) -> str:
        return f'def {self.name}({self.params}):\n    """{self.doc}"""\n    return {expr or self.body}\n'

    def call(self, expr: str, args: tuple[Any, ...]) -> Any:
        scope: dict[str, Any] = {}
        exec(self.source(expr), scope)
        return scope[self.name](*args)


def _ints(k: int, lo: int = 1, hi: int = 50) -> Callable[[random.Random], tuple[Any, ...]]:
    return lambda r: tuple(r.randint(lo, hi) for _ in range(k))


def _intlist(r: random.Random) -> tuple[Any, ...]:
    return ([r.randint(-20, 40) for _ in range(r.randint(3, 6))],)


def _word(r: random.Random) -> tuple[Any, ...]:
    return (r.choice(WORDS),)


def _sentence(r: random.Random) -> tuple[Any, ...]:
    return (" ".join(r.sample(WORDS, r.randint(2, 5))),)


BUGGY = [
    Func("add", "a, b", "a + b", "Return the sum of a and b.", _ints(2), "a - b"),
    Func("square", "x", "x * x", "Return x squared.", _ints(1, 2), "x + x"),
    Func("is_even", "n", "n % 2 == 0", "Return True when n is even.", _ints(1), "n % 2 == 1"),
    Func("largest", "xs", "max(xs)", "Return the largest number in xs.", _intlist, "min(xs)"),
    Func("last_item", "xs", "xs[-1]", "Return the last element of xs.", _intlist, "xs[0]"),
    Func("word_count", "text", "len(text.split())", "Return the number of words in text.", _sentence, "len(text)"),
    Func("shout", "text", 'text.upper() + "!"', "Return text in upper case followed by '!'.", _word, 'text + "!"'),
    Func("area", "width, height", "width * height", "Return the area of a rectangle.", _ints(2, 2), "width + height"),
    Func("first_char", "s", "s[0]", "Return the first character of s.", _word, "s[1]"),
    Func("cube", "x", "x ** 3", "Return x cubed.", _ints(1, 2, 9), "x ** 2"),
    Func("reverse", "s", "s[::-1]", "Return s reversed.", _word, "s[1:]"),
    Func("half", "n", "n // 2", "Return n divided by two, rounded down.", _ints(1, 4), "n // 3"),
]

MISSING = [
    Func("triple", "x", "x * 3", "Return x multiplied by 3.", _ints(1)),
    Func("count_vowels", "s", 'sum(c in "aeiou" for c in s)', "Return how many vowels (a, e, i, o, u) s has.", _word),
    Func(
        "join_words",
        "words",
        '" ".join(words)',
        "Return the words joined by single spaces.",
        lambda r: (r.sample(WORDS, 3),),
    ),
    Func("is_palindrome", "s", "s == s[::-1]", "Return True when s reads the same backwards.", _word),
    Func("smallest", "xs", "min(xs)", "Return the smallest number in xs.", _intlist),
    Func("total", "xs", "sum(xs)", "Return the sum of the numbers in xs.", _intlist),
    Func(
        "clamp",
        "x, lo, hi",
        "max(lo, min(x, hi))",
        "Return x limited to the range lo..hi.",
        lambda r: (r.randint(-10, 60), 0, 50),
    ),
    Func("starts_with_a", "s", 's.startswith("a")', "Return True when s starts with the letter a.", _word),
    Func("repeat", "s, n", "s * n", "Return s repeated n times.", lambda r: (r.choice(WORDS), r.randint(1, 3))),
    Func("difference", "a, b", "a - b", "Return a minus b.", _ints(2)),
    Func("evens", "xs", "[x for x in xs if x % 2 == 0]", "Return the even numbers of xs, in order.", _intlist),
    Func("double", "x", "x * 2", "Return x multiplied by 2.", _ints(1)),
]


def _cases(f: Func, rng: random.Random, k: int = 4) -> list[tuple[tuple[Any, ...], Any]]:
    return [(args, f.call(f.body, args)) for args in (f.inputs(rng) for _ in range(k))]


def _case_checks(module: str, f: Func, cases: list[tuple[tuple[Any, ...], Any]]) -> str:
    lines = [f"from {module} import {f.name}", ""]
    for args, want in cases:
        call = f"{f.name}({', '.join(repr(a) for a in args)})"
        lines.append(f"assert {call} == {want!r}, {call!r}")
    return "\n".join(lines) + "\n"


def bugfix_family(rng: random.Random, n: int) -> list[Instance]:
    out = []
    for f in rng.sample(BUGGY, n):
        module = rng.choice(MODULES)
        cases = _cases(f, rng)
        if all(f.call(f.bug, a) == want for a, want in cases):
            raise SystemExit(f"the bug in {f.name} is not caught by its cases")
        out.append(
            _py_task(
                "bugfix",
                f"Fix the one-line bug in {module}.{f.name}.",
                f"The function `{f.name}` in `{module}.py` should {f.doc[0].lower()}{f.doc[1:-1]}, but a bug "
                "on one of its lines makes it return wrong results. Fix that line.\n",
                {f"{module}.py": f.source(f.bug)},
                {f"{module}.py": f.source()},
                _case_checks(module, f, cases),
            )
        )
    return out


def addfunc_family(rng: random.Random, n: int) -> list[Instance]:
    out = []
    for f in rng.sample(MISSING, n):
        module = rng.choice(MODULES)
        existing = Func("identity", "x", "x", "Return x unchanged.", _ints(1))
        cases = _cases(f, rng)
        checks = _case_checks(module, f, cases) + f"from {module} import identity\n\nassert identity(5) == 5\n"
        out.append(
            _py_task(
                "addfunc",
                f"Add the function {module}.{f.name}.",
                f"Add a function `{f.name}({f.params})` to `{module}.py`. {f.doc}\n",
                {f"{module}.py": existing.source()},
                {f"{module}.py": existing.source() + "\n\n" + f.source()},
                checks,
            )
        )
    return out


# ---------------------------------------------------------------- rename / shell


def rename_family(rng: random.Random, n: int) -> list[Instance]:
    verbs = "compute calc get make build find load count".split()
    nouns = "total score price size value result weight length rate".split()
    pairs = rng.sample([(v, w) for v in verbs for w in nouns], n)
    out = []
    for verb, noun in pairs:
        old = f"{verb}_{noun}"
        new = f"{rng.choice([v for v in verbs if v != verb])}_{noun}"
        module = rng.choice(MODULES)
        k, c, a = rng.randint(2, 9), rng.randint(1, 20), rng.randint(1, 30)

        def files(name: str, module: str = module, k: int = k, c: int = c, a: int = a) -> dict[str, str]:
            return {
                f"{module}.py": f"def {name}(x):\n    return x * {k} + {c}\n",
                "main.py": f"from {module} import {name}\n\nprint({name}({a}))\n",
                "report.py": f"import {module}\n\n\ndef summary():\n    return {module}.{name}({a + 1})\n",
            }

        check = textwrap.dedent(f"""\
            import re
            import subprocess

            for path in ("{module}.py", "main.py", "report.py"):
                assert not re.search(r"\\b{old}\\b", open(path).read()), f"{old} is still used in {{path}}"
            import {module}
            import report

            assert {module}.{new}(3) == {3 * k + c}
            assert report.summary() == {(a + 1) * k + c}
            out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
            assert out.strip() == "{a * k + c}", out
            """)
        out.append(
            _py_task(
                "rename",
                f"Rename {old} to {new} across three files.",
                f"Rename the function `{old}` to `{new}` everywhere in the current directory "
                f"(its definition in `{module}.py` and every use in `main.py` and `report.py`). "
                "The program must keep working.\n",
                files(old),
                files(new),
                check,
            )
        )
    return out


SHELL_BUGS: list[tuple[str, str, str]] = [
    # (what is wrong, broken script, fixed script); {w} is the word the script prints
    ("a misspelt command", 'ecko "{w}"\n', 'echo "{w}"\n'),
    ("a misspelt variable", 'WORD="{w}"\necho "$WROD"\n', 'WORD="{w}"\necho "$WORD"\n'),
    ("a missing fi", 'if true; then\n  echo "{w}"\n', 'if true; then\n  echo "{w}"\nfi\n'),
    ("a wrong exit status", 'echo "{w}"\nexit 1\n', 'echo "{w}"\nexit 0\n'),
    ("a missing then", 'if true\n  echo "{w}"\nfi\n', 'if true; then\n  echo "{w}"\nfi\n'),
    ("a wrong file name", 'echo "{w}" > word.txt\ncat wrd.txt\n', 'echo "{w}" > word.txt\ncat word.txt\n'),
    (
        "a missing space in a test",
        'N=3\nif [ "$N" -eq 3]; then echo "{w}"; fi\n',
        'N=3\nif [ "$N" -eq 3 ]; then echo "{w}"; fi\n',
    ),
    ("a missing done", 'for w in "{w}"; do\n  echo "$w"\n', 'for w in "{w}"; do\n  echo "$w"\ndone\n'),
]


def shellfix_family(rng: random.Random, n: int) -> list[Instance]:
    out = []
    words = rng.sample(WORDS, n)
    bugs = [SHELL_BUGS[i % len(SHELL_BUGS)] for i in range(n)]
    rng.shuffle(bugs)
    for word, (what, broken, fixed) in zip(words, bugs, strict=True):
        head = "#!/bin/bash\n"
        check = textwrap.dedent(f"""\
            import subprocess

            proc = subprocess.run(["bash", "run.sh"], capture_output=True, text=True, timeout=20)
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.strip() == "{word}", proc.stdout
            """)
        out.append(
            _py_task(
                "shellfix",
                f"Fix run.sh ({what}).",
                f"The script `run.sh` should print `{word}` and exit with status 0 when run with "
                "`bash run.sh`, but it fails. Fix the script.\n",
                {"run.sh": head + broken.format(w=word)},
                {"run.sh": head + fixed.format(w=word)},
                check,
            )
        )
    return out


FAMILIES: dict[str, Callable[[random.Random, int], list[Instance]]] = {
    "echo": echo_family,
    "file": file_family,
    "bugfix": bugfix_family,
    "addfunc": addfunc_family,
    "rename": rename_family,
    "shellfix": shellfix_family,
}


# ---------------------------------------------------------------- writing


def _write(path: Path, text: str, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)


def write_task(root: Path, name: str, split: str, inst: Instance) -> None:
    task = root / split / name
    tags = ", ".join(f'"{t}"' for t in ("builtin", inst.family, *inst.tags))
    fields = {"name": name, "description": inst.description, "family": inst.family, "tags": tags, "split": split}
    _write(task / "task.toml", TOML.format(**fields))
    _write(task / "instruction.md", inst.instruction)
    lines = [f"FROM {inst.image}", "WORKDIR /app"]
    if inst.app:
        lines.append("COPY app/ /app/")
        for rel, text in inst.app.items():
            _write(task / "environment" / "app" / rel, text, executable=rel.endswith(".sh"))
    _write(task / "environment" / "Dockerfile", "\n".join(lines) + "\n")
    for rel, text in inst.tests.items():
        _write(task / "tests" / rel, text, executable=rel.endswith(".sh"))
    _write(task / "solution" / "solve.sh", inst.solve, executable=True)


def generate(out: Path, seed: int = SEED) -> list[Path]:
    """Writes the whole pool under ``out`` (replacing its train/ and heldout/); returns the task dirs."""
    for split in ("train", "heldout"):
        shutil.rmtree(out / split, ignore_errors=True)
    written = []
    for family, make in FAMILIES.items():
        instances = make(random.Random(f"{seed}:{family}"), TRAIN + HELDOUT)
        for i, inst in enumerate(instances):
            split = "train" if i < TRAIN else "heldout"
            name = f"{family}-{i:02d}"
            write_task(out, name, split, inst)
            written.append(out / split / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tasks" / "builtin")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a directory")
    tasks = generate(args.out, args.seed)
    print(f"wrote {len(tasks)} tasks under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
