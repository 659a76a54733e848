"""The committed generated code must be what the .proto files generate today."""

import os
import subprocess
import sys

import google.protobuf

from tests.support.paths import ROOT

#: What a machine's PATH holds before anything is activated: the README runs `.venv/bin/python`
#: without activating the venv, so nothing in the venv's bin directory is on PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_regenerating_changes_nothing():
    env = {**os.environ, "PATH": SYSTEM_PATH}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr


def test_protobuf_bound_matches_generated_code():
    generated = (ROOT / "synapse" / "proto" / "types_pb2.py").read_text()
    stamp = generated.split("ValidateProtobufRuntimeVersion(")[1].split(")")[0]
    major, minor, patch = [int(x.strip()) for x in stamp.split(",")[1:4]]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"protobuf>={major}.{minor}.{patch}"' in pyproject
    installed = tuple(int(x) for x in google.protobuf.__version__.split(".")[:3])
    assert installed >= (major, minor, patch)
