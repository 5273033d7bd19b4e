"""Regenerate the Python stubs of proto/harnessrl/v1 into harnessrl/v1/.

The generated package is quarantined: excluded from lint and type checks, and
checked against the protos by tests/unit/test_proto_stubs.py.

    python scripts/gen_protos.py [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = Path("harnessrl") / "v1"
HEADER = '"""Generated from proto/harnessrl/v1 by scripts/gen_protos.py. Do not edit."""\n'


def generate(out_root: Path) -> list[Path]:
    """Writes the stubs under out_root/harnessrl/v1 and returns the files written."""
    protos = sorted((PROTO_DIR / PACKAGE).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_DIR / PACKAGE}")
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p.relative_to(PROTO_DIR)) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        target = out_root / PACKAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(Path(tmp) / PACKAGE, target)
    (target / "__init__.py").write_text(HEADER)
    return sorted(target.iterdir())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write harnessrl/v1 under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
