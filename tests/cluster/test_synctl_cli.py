"""synctl's command line without a cluster: `--version` and `--help` start without gRPC or
protobuf, and the verb table that lets them knows every verb as its module defines it."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from synapse.client.cli import main as root

#: What a command line that does nothing yet must not load: they cost most of synctl's start.
HEAVY = ("grpc", "google.protobuf", "synapse.proto")


#: Runs synctl with ARGS in a fresh interpreter and prints the modules it loaded, one a line.
LOADED = """
import sys
from synapse.client.cli.main import main
try:
    main(sys.argv[1:], prog_name="synctl")
finally:
    print("\\n".join(sorted(sys.modules)))
"""


def imported_by(*args: str) -> set[str]:
    """The modules `synctl ARGS` imports, in a process of its own."""
    done = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.splitlines())


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_no_grpc_nor_protobuf(args):
    modules = imported_by(*args)
    assert "synapse.client.cli.main" in modules
    assert not {m for m in modules if m.startswith(HEAVY)}


def verb_modules(modules: set[str]) -> set[str]:
    """The verbs' modules among `modules`: the package's modules but the root, exits and session."""
    return {m for m in modules if m.startswith("synapse.client.cli.")} - {
        "synapse.client.cli.main", "synapse.client.cli.exits", "synapse.client.cli.session"}


def test_a_group_lists_its_verbs_without_importing_them():
    assert verb_modules(imported_by("get", "--help")) == set()
    assert verb_modules(imported_by("describe", "--help")) == set()


def test_a_verb_imports_its_module_alone():
    """`synctl get nodes --help` loads the nodes module; the other verbs' modules stay unread."""
    assert verb_modules(imported_by("get", "nodes", "--help")) == {"synapse.client.cli.nodes"}


def lazy_entries():
    yield from ((name, entry, ()) for name, entry in root.VERBS.items())
    yield from ((name, entry, ("get",)) for name, entry in root.GET.items())
    yield from ((name, entry, ("describe",)) for name, entry in root.DESCRIBE.items())


@pytest.mark.parametrize("name, entry, parent", list(lazy_entries()), ids=lambda v: str(v))
def test_the_table_names_each_verb_with_its_own_one_line_help(name, entry, parent):
    group = root.main
    for word in parent:
        group = group.commands[word]
    command = group.get_command(click.Context(group), name)
    assert isinstance(command, click.Command) and command.name == name
    for limit in (45, 80, 1000):
        assert click.Command(name, help=entry[1]).get_short_help_str(limit) == command.get_short_help_str(limit)
