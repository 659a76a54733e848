"""Regenerate the committed protobuf / gRPC code under synapse/proto/ from proto/.

    python scripts/gen_proto.py            # rewrite the generated files
    python scripts/gen_proto.py --check    # exit 1 if regenerating would change anything

The .proto files live under proto/synapse/proto/, mirroring the Python package, so the generated
imports (`from synapse.proto import types_pb2`) resolve inside the installed package.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import shutil
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = ROOT / "synapse" / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    args = ["protoc", f"-I{PROTO_ROOT}", f"--plugin=protoc-gen-mypy={mypy_plugin()}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={out_dir}", f"--mypy_out={out_dir}",
            f"--grpc_python_out={out_dir}", f"--mypy_grpc_out={out_dir}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def mypy_plugin(name: str = "protoc-gen-mypy") -> pathlib.Path:
    """A mypy-protobuf script installed beside this interpreter (a dev extra): protoc-gen-mypy for
    the messages' stubs, protoc-gen-mypy_grpc for the services' (the type checker reads both).

    Named by path, not looked up on PATH: a venv's bin directory is on PATH only while the venv
    is activated, and the README runs `.venv/bin/python` without activating it.
    """
    scripts = pathlib.Path(sysconfig.get_path("scripts"))
    for directory in (scripts, pathlib.Path(sys.executable).parent):
        plugin = directory / name
        if plugin.exists():
            return plugin
    raise SystemExit(f"{name} not found in {scripts}: pip install -e '.[dev]'")


def generated_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    return {p.name: p for p in directory.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        fresh = generated_files(pathlib.Path(tmp) / "synapse" / "proto")
        committed = generated_files(PACKAGE_DIR)
        if args.check:
            stale = sorted(set(fresh) ^ set(committed))
            stale += sorted(n for n in set(fresh) & set(committed)
                            if not filecmp.cmp(fresh[n], committed[n], shallow=False))
            if stale:
                print("generated protobuf code is stale; run scripts/gen_proto.py:", *stale)
                return 1
            print(f"generated protobuf code is current ({len(fresh)} files)")
            return 0
        for name in set(committed) - set(fresh):
            committed[name].unlink()
        for name, path in fresh.items():
            shutil.copyfile(path, PACKAGE_DIR / name)
        print(f"wrote {len(fresh)} files to {PACKAGE_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
