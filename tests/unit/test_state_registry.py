"""The state machine's handlers: one registry, a module per table, each module small (synapse.core.state)."""

from pathlib import Path

from synapse.core import commands as c
from synapse.core.state import registry
from synapse.core.state.fsm import ClusterState
from synapse.core.state.registry import HANDLERS
from tests.support import paths

STATE = paths.ROOT / "synapse" / "core" / "state"
#: A table's module is read in one sitting: past this, split it by the table's parts (as gangs and tasks).
MAX_MODULE_LINES = 300
#: The rest of the package is the machine around the tables, held to the project's module cap.
NOT_TABLES = {"fsm.py": 600, "snapshot.py": 600, "invariants.py": 600}


def oversized(root: Path, limit: int, caps: dict[str, int] | None = None) -> dict[str, int]:
    """The modules under `root` longer than `limit` lines (or their own cap in `caps`), with their lengths."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(root.glob("*.py"))}
    return {name: n for name, n in sizes.items() if n > (caps or {}).get(name, limit)}


def test_each_table_module_stays_small():
    assert oversized(STATE, MAX_MODULE_LINES, NOT_TABLES) == {}


def test_the_size_check_sees_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n")
    (tmp_path / "long.py").write_text("x = 1\n" * 5)
    assert oversized(tmp_path, 4) == {"long.py": 5}
    assert oversized(tmp_path, 4, {"long.py": 5}) == {}


def test_every_handler_is_a_function_of_a_table_module():
    for kind, handler in HANDLERS.items():
        assert handler.__module__.startswith("synapse.core.state."), (kind.__name__, handler.__module__)
        assert handler.__module__ != registry.__name__, kind.__name__


def test_apply_dispatches_through_the_registry_bound_to_its_state():
    state = ClusterState()
    assert {kind: bound.__func__ for kind, bound in state._handlers.items()} == HANDLERS
    assert all(bound.__self__ is state for bound in state._handlers.values())
    assert state.apply(c.Barrier(at=1.0)).ok and state.applied == 1
