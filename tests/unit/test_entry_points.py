"""Every console script is a click command with the same conventions: -h/--help and --version
(`python -m` in a process of its own: tests/cluster/test_entry_points.py)."""

from __future__ import annotations

import importlib
import tomllib

import click
import pytest
from click.testing import CliRunner

import synapse
from tests.support import paths

SCRIPTS = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def command_of(target: str) -> click.Command:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_the_entry_points_keep_their_names():
    assert set(SCRIPTS) == {"synapse-master", "synapse-worker", "synctl", "synapse-local", "synapse-sim"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_entry_point_is_click_with_version_and_help(name):
    command = command_of(SCRIPTS[name])
    assert isinstance(command, click.Command)
    runner = CliRunner()
    version = runner.invoke(command, ["--version"])
    assert version.exit_code == 0 and version.output.strip() == f"{name} {synapse.__version__}"
    for flag in ("-h", "--help"):
        shown = runner.invoke(command, [flag])
        assert shown.exit_code == 0 and shown.output.startswith("Usage: "), shown.output


def test_master_without_config_says_what_it_needs():
    result = CliRunner().invoke(command_of(SCRIPTS["synapse-master"]), [])
    assert result.exit_code == 2 and "--config and --id are required" in result.output


def test_worker_refuses_rack_and_topology_together():
    result = CliRunner().invoke(command_of(SCRIPTS["synapse-worker"]),
                                ["--masters", "127.0.0.1:1", "--rack", "r1", "--topology", "z/b/r"])
    assert result.exit_code == 2 and "--rack or --topology, not both" in result.output


def test_master_rebuild_sets_the_data_dir_aside(tmp_path):
    """The rebuild subcommand works through click as it did before (a real cluster test also runs it)."""
    data = tmp_path / "m1"
    data.mkdir()
    (data / "raft.journal").write_bytes(b"x")
    config = tmp_path / "cluster.yaml"
    config.write_text(f"""
replicas:
  - {{id: m1, api: 127.0.0.1:1, raft: 127.0.0.1:2}}
data_dir: {tmp_path}/{{id}}
""")
    result = CliRunner().invoke(command_of(SCRIPTS["synapse-master"]), ["rebuild", "--config", str(config),
                                                                        "--id", "m1"])
    assert result.exit_code == 0, result.output
    assert not data.exists() and len(list(tmp_path.glob("m1.broken-*"))) == 1
