"""The built-in pool is what scripts/gen_task_pool.py writes, parses, and its splits are disjoint."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

from services.sandbox.task.model import load_task
from stack.disjoint import find_overlaps, task_dirs

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "tasks" / "builtin"
SCRIPT = ROOT / "scripts" / "gen_task_pool.py"
# Loaded by path: scripts/ is not a package (and a site-packages module may own the name).
_spec = importlib.util.spec_from_file_location("gen_task_pool", SCRIPT)
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
sys.modules["gen_task_pool"] = gen  # dataclasses look their module up while the script loads
_spec.loader.exec_module(gen)
FAMILIES, HELDOUT, TRAIN, generate = gen.FAMILIES, gen.HELDOUT, gen.TRAIN, gen.generate


def _tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & 0o100))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_committed_pool_is_exactly_what_the_generator_writes(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh, committed = _tree(tmp_path), _tree(POOL)
    assert sorted(fresh) == sorted(committed), "tasks/builtin is stale: run scripts/gen_task_pool.py"
    stale = [rel for rel in fresh if fresh[rel] != committed[rel]]
    assert not stale, f"differs from the generator's output: {stale[:5]}"


def test_generation_is_deterministic_and_the_seed_matters(tmp_path: Path) -> None:
    generate(tmp_path / "a", seed=123)
    generate(tmp_path / "b", seed=123)
    generate(tmp_path / "c", seed=124)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")


def test_every_task_parses_with_its_family_and_split() -> None:
    per_split: dict[str, Counter[str]] = {}
    for split in ("train", "heldout"):
        counts: Counter[str] = Counter()
        for path in task_dirs([POOL / split]):
            task = load_task(path)
            meta = task.config.metadata
            assert meta["category"] in FAMILIES and meta["split"] == split
            assert task.task_id == f"harnessrl/{path.name}" and path.name.startswith(meta["category"] + "-")
            assert task.config.environment.network_mode == "no-network"
            assert (path / "solution" / "solve.sh").stat().st_mode & 0o100
            counts[meta["category"]] += 1
        per_split[split] = counts
    assert per_split["train"] == dict.fromkeys(FAMILIES, TRAIN)
    assert per_split["heldout"] == dict.fromkeys(FAMILIES, HELDOUT)


def test_splits_share_no_instance_and_no_two_tasks_share_an_instruction() -> None:
    assert find_overlaps([POOL / "train"], [POOL / "heldout"]) == []
    instructions = [load_task(p).instruction for p in task_dirs([POOL / "train", POOL / "heldout"])]
    assert len(set(instructions)) == len(instructions)


def test_bad_arguments_are_a_clear_error(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for args in (["--seed", "many"], ["--out", str(a_file)]):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc
        assert "error" in proc.stderr and "Traceback" not in proc.stderr
    assert a_file.read_text() == "x"
