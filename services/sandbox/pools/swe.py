"""SWE-bench-style records -> Harbor tasks, from local files only.

A record (one JSONL line or Parquet row) names a repository and a commit, a
problem statement, the gold ``patch``, the ``test_patch`` and the tests that
must pass: ``FAIL_TO_PASS`` (fail before the fix, pass after) and
``PASS_TO_PASS`` (pass before and after). Each record becomes a task::

    task.toml          [metadata] repo, base_commit, instance_id, fail_to_pass, pass_to_pass
    instruction.md     the problem statement
    environment/       Dockerfile + repo.tar: the tree of the LOCAL clone at base_commit
                       (``git archive``: no history, so no future commit to read the fix
                       from), committed once as a fresh repository, then setup_commands
    tests/test.sh      restores the files the test patch touches, applies it, runs exactly
                       the listed tests (``test_command`` with ``{tests}``), reward 1 iff they pass:
                       under pytest, iff its JUnit report shows each of them passed
                       (``junit_check.py``, copied beside it: an early exit writes no report);
                       under ``python -m pytest`` also iff our plugin (``grade_plugin.py``,
                       copied as ``harnessrl_grade.py``) saw each of them run without
                       raising and no plugin registered that pytest did not register
    solution/solve.sh  applies the gold patch

Optional record fields: ``setup_commands`` (Dockerfile RUN lines, in order),
``test_command`` (default ``python3 -m pytest -p no:cacheprovider {tests}``; the
test ids are shell-quoted), ``base_image`` (``FROM``; the local backend uses
the host system, the Docker backend needs an image with git and the test
runner), ``category`` (the family; default ``swe``). FAIL_TO_PASS/PASS_TO_PASS
may be lists or JSON-encoded lists (as SWE-bench ships them).

Every error names the records file, the record (line number and instance_id)
and the field. Patches are checked against the commit before anything is written.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harnessrl.config import format_validation_error
from harnessrl.errors import InvalidArgument
from services.sandbox.common import tarsafe

WORKDIR = "/testbed"
DEFAULT_TEST_COMMAND = "python3 -m pytest -p no:cacheprovider {tests}"
JUNIT_REPORT = "/logs/verifier/junit.xml"
JUNIT_CHECK = "junit_check.py"
GRADE_PLUGIN = "harnessrl_grade.py"
GRADE_VERDICT = "/logs/verifier/harnessrl-grade.json"
_MODULE_PYTEST = re.compile(r"\bpython[0-9.]*\s+-m\s+pytest\b")
_COMMIT_RE = re.compile(r"^[0-9a-fA-F]{7,40}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class RecordError(InvalidArgument):
    """A record cannot become a task; the message names the file, the record and the field."""


class SweRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    repo: str = Field(min_length=1)
    instance_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    base_commit: str
    problem_statement: str = Field(min_length=1)
    patch: str = Field(min_length=1)
    test_patch: str = Field(min_length=1)
    fail_to_pass: list[str] = Field(alias="FAIL_TO_PASS", min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    setup_commands: list[str] = Field(default_factory=list)
    test_command: str = DEFAULT_TEST_COMMAND
    base_image: str = "python:3.11-bookworm"
    category: str = "swe"

    @field_validator("fail_to_pass", "pass_to_pass", "setup_commands", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"not a list nor a JSON-encoded list: {e}") from None
        return v

    @field_validator("base_commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        if not _COMMIT_RE.match(v):
            raise ValueError(f"must be a commit hash (7-40 hex digits), got {v!r}")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not _REPO_RE.match(v) or ".." in v:
            raise ValueError(f"must be 'owner/name' or 'name', got {v!r}")
        return v

    @field_validator("test_command")
    @classmethod
    def _placeholder(cls, v: str) -> str:
        if "{tests}" not in v:
            raise ValueError("must contain the placeholder {tests}")
        return v

    @property
    def tests(self) -> list[str]:
        return [*self.fail_to_pass, *self.pass_to_pass]


# ---------------------------------------------------------------- reading


def read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, raw record) for each record of a .jsonl or .parquet file; ``where`` names it."""
    if not path.is_file():
        raise RecordError(f"{path}: no such records file")
    if path.suffix == ".parquet":
        yield from _parquet(path)
    elif path.suffix in (".jsonl", ".json"):
        yield from _jsonl(path)
    else:
        raise RecordError(f"{path}: expected a .jsonl or .parquet file")


def _jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{path} line {n}: not valid JSON: {e}") from None
            if not isinstance(raw, dict):
                raise RecordError(f"{path} line {n}: a record must be a JSON object")
            yield _where(path, f"line {n}", raw), raw


def _parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a damaged file
        raise RecordError(f"{path}: not a readable Parquet file: {e}") from None
    for n, raw in enumerate(rows, 1):
        yield _where(path, f"row {n}", raw), raw


def _where(path: Path, position: str, raw: dict[str, Any]) -> str:
    iid = raw.get("instance_id")
    return f"{path} {position}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def parse_record(where: str, raw: dict[str, Any]) -> SweRecord:
    try:
        return SweRecord.model_validate(raw)
    except ValidationError as e:
        raise RecordError(f"{where}: {format_validation_error(e)}") from None


# ---------------------------------------------------------------- local clones


def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True, timeout=300)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, args, proc.stdout, proc.stderr)
    return proc.stdout


def find_clone(repos: Path, repo: str) -> Path:
    """``repos/owner__name``, ``repos/owner/name`` or ``repos/name``: the first that is a git repository."""
    owner, _, name = repo.rpartition("/")
    candidates = [repos / repo.replace("/", "__"), repos / repo, repos / name] if owner else [repos / repo]
    for path in candidates:
        if (
            path.is_dir()
            and subprocess.run(
                ["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, timeout=60
            ).returncode
            == 0
        ):
            return path
    looked = ", ".join(str(c) for c in candidates)
    raise LookupError(f"no local git clone of {repo!r} (looked for {looked})")


def _archive(clone: Path, commit: str) -> bytes:
    try:
        return _git(clone, "archive", "--format=tar", commit)
    except subprocess.CalledProcessError as e:
        raise LookupError(f"commit {commit} is not in the clone {clone}: {e.stderr.decode().strip()}") from None


def _check_patches(tree: bytes, record: SweRecord) -> dict[str, bytes | None]:
    """Checks both patches apply at the commit; returns the base content of each
    file the test patch touches (None: the test patch creates it)."""
    with tempfile.TemporaryDirectory(prefix="hrl-swe-") as tmp:
        work = Path(tmp)
        with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
            tarsafe.extractall(tar, work, "data")
        _git(work, "init", "-q")
        for field in ("patch", "test_patch"):
            try:
                _git(work, "apply", "--check", "-", data=getattr(record, field).encode())
            except subprocess.CalledProcessError as e:
                raise ValueError(f"{field}: does not apply at base_commit: {e.stderr.decode().strip()}") from None
        touched = _git(work, "apply", "--numstat", "-z", "-", data=record.test_patch.encode()).decode()
        files = [entry.split("\t")[-1] for entry in touched.split("\0") if entry.strip()]
        return {f: (work / f).read_bytes() if (work / f).is_file() else None for f in files}


# ---------------------------------------------------------------- writing


def _task_toml(r: SweRecord) -> str:
    meta = {
        "category": r.category,
        "repo": r.repo,
        "base_commit": r.base_commit,
        "instance_id": r.instance_id,
        "fail_to_pass": r.fail_to_pass,
        "pass_to_pass": r.pass_to_pass,
    }
    lines = ['schema_version = "1.4"', "", "[task]", f'name = "swe/{r.instance_id}"', "", "[metadata]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in meta.items()]
    lines += ["", "[agent]", "timeout_sec = 1800", "", "[verifier]", "timeout_sec = 900", ""]
    lines += ["[environment]", 'network_mode = "no-network"', "build_timeout_sec = 1800", ""]
    return "\n".join(lines)


def _dockerfile(r: SweRecord) -> str:
    commit = "git -c user.name=harnessrl -c user.email=harnessrl@localhost commit -q -m base"
    lines = [f"FROM {r.base_image}", f"WORKDIR {WORKDIR}", f"ADD repo.tar {WORKDIR}/"]
    lines.append(f"RUN git init -q && git add -A && {commit}")
    lines += [f"RUN {cmd}" for cmd in r.setup_commands]
    return "\n".join(lines) + "\n"


def _test_sh(r: SweRecord, base: dict[str, bytes | None]) -> str:
    restore = []
    for rel, content in base.items():
        quoted = shlex.quote(rel)
        if content is None:
            restore.append(f"rm -f -- {quoted}")
        else:
            restore.append(f'mkdir -p -- "$(dirname -- {quoted})" && cp -- /tests/base/{quoted} {quoted}')
    tests = " ".join(shlex.quote(t) for t in r.tests)
    command = r.test_command.replace("{tests}", tests)
    if _MODULE_PYTEST.search(r.test_command):
        # Our plugin (grade_plugin.py) under a name drawn now: the working directory is first on
        # sys.path under `python -m pytest`, and nothing there can shadow a name nobody knew.
        # A command that changes directory first does not find it: its oracle scores 0 (validate).
        run = [
            f"rm -f {JUNIT_REPORT} {GRADE_VERDICT}",
            "grade=\"harnessrl_grade_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \\n')\"",
            f'cp /tests/{GRADE_PLUGIN} "$grade.py" || reward 0',
            f'{command} -p "$grade" --harnessrl-verdict={GRADE_VERDICT} --junitxml={JUNIT_REPORT}; ok=$?',
            'rm -rf -- "$grade.py" __pycache__/"$grade".*',
            f"if [ $ok = 0 ] && python3 -I /tests/{JUNIT_CHECK} --verdict {GRADE_VERDICT} {JUNIT_REPORT} {tests}; then",
            "  reward 1",
            "fi",
            "reward 0",
        ]
    elif "pytest" in r.test_command:
        # The exit status alone can be forged from inside the test process (junit_check.py
        # says how, and what still gets through): the named tests must be in pytest's report.
        # The pytest script does not put the working directory on sys.path: no plugin of ours.
        run = [
            f"rm -f {JUNIT_REPORT}",
            f"if {command} --junitxml={JUNIT_REPORT} && python3 -I /tests/{JUNIT_CHECK} {JUNIT_REPORT} {tests}; then",
            "  reward 1",
            "fi",
            "reward 0",
        ]
    else:
        # Not pytest: its exit status is all there is (an os._exit(0) in the code under test passes).
        run = [f"if {command}; then reward 1; else reward 0; fi"]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# {r.instance_id}: reward 1 iff the listed tests pass after the test patch is applied.",
            'reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }',
            f"cd {WORKDIR} || reward 0",
            "# The agent may have edited the test files: put back their base versions first.",
            *restore,
            "git apply /tests/test.patch || { echo 'test patch does not apply'; reward 0; }",
            *run,
            "",
        ]
    )


def write_task(record: SweRecord, clone: Path, out: Path) -> Path:
    """Writes one task directory ``out/<instance_id>``; raises ValueError/LookupError naming the field."""
    tree = _archive(clone, record.base_commit)
    base = _check_patches(tree, record)
    task = out / record.instance_id
    if task.exists():
        raise FileExistsError(f"{task} already exists")
    (task / "environment").mkdir(parents=True)
    (task / "tests" / "base").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text(_task_toml(record))
    (task / "instruction.md").write_text(record.problem_statement.rstrip() + "\n")
    (task / "environment" / "repo.tar").write_bytes(tree)
    (task / "environment" / "Dockerfile").write_text(_dockerfile(record))
    (task / "tests" / "test.patch").write_text(record.test_patch)
    for rel, content in base.items():
        if content is not None:
            dest = task / "tests" / "base" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(content)
    (task / "tests" / "test.sh").write_text(_test_sh(record, base))
    shutil.copy(Path(__file__).with_name(JUNIT_CHECK), task / "tests" / JUNIT_CHECK)
    shutil.copy(Path(__file__).with_name("grade_plugin.py"), task / "tests" / GRADE_PLUGIN)
    (task / "tests" / "test.sh").chmod(0o755)
    (task / "solution" / "gold.patch").write_text(record.patch)
    solve = f"#!/bin/bash\nset -e\ncd {WORKDIR}\ngit apply /solution/gold.patch\n"
    (task / "solution" / "solve.sh").write_text(solve)
    (task / "solution" / "solve.sh").chmod(0o755)
    return task


def convert(records: Path, repos: Path, out: Path) -> list[Path]:
    """Converts every record of ``records`` into ``out``; all records are checked before
    any task is written, so a bad record leaves ``out`` untouched."""
    if not repos.is_dir():
        raise RecordError(f"--repos {repos}: not a directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecordError(f"--out {out}: exists and is not an empty directory")
    parsed: list[tuple[str, SweRecord, Path]] = []
    seen: dict[str, str] = {}
    for where, raw in read_records(records):
        record = parse_record(where, raw)
        if record.instance_id in seen:
            raise RecordError(f"{where}: instance_id: {record.instance_id!r} repeats {seen[record.instance_id]}")
        seen[record.instance_id] = where
        try:
            parsed.append((where, record, find_clone(repos, record.repo)))
        except LookupError as e:
            raise RecordError(f"{where}: repo: {e}") from None
    if not parsed:
        raise RecordError(f"{records}: no records")
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent if out.parent.is_dir() else None))
    try:
        for where, record, clone in parsed:
            try:
                write_task(record, clone, staging)
            except LookupError as e:
                raise RecordError(f"{where}: base_commit: {e}") from None
            except ValueError as e:
                raise RecordError(f"{where}: {e}") from None
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for task in sorted(staging.iterdir()):
            shutil.move(str(task), out / task.name)
            written.append(out / task.name)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)
