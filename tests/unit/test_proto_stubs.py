"""The committed stubs in harnessrl/v1 are exactly what scripts/gen_protos.py
generates from proto/, and the RPC contract covers every service."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from tests.contract import PROTO_MODULES, all_rpcs

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "harnessrl" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in (ROOT / "harnessrl" / "v1").iterdir() if p.is_file()}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs, run scripts/gen_protos.py: {stale}"


def test_contract_covers_every_proto_with_services() -> None:
    with_services = set()
    for proto in (ROOT / "proto" / "harnessrl" / "v1").glob("*.proto"):
        module = importlib.import_module(f"harnessrl.v1.{proto.stem}_pb2")
        if module.DESCRIPTOR.services_by_name:
            with_services.add(module)
    assert with_services == set(PROTO_MODULES)


def test_all_rpcs_lists_the_documented_calls() -> None:
    rpcs = all_rpcs()
    for name in (
        "/harnessrl.v1.RolloutGateway/Generate",
        "/harnessrl.v1.CaptureStore/WatchReady",
        "/harnessrl.v1.Sandbox/CancelTrial",
        "/harnessrl.v1.Trainer/Metrics",
    ):
        assert name in rpcs
