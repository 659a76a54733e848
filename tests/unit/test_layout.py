"""The package's shape holds: no import circle, and each layer imports only what it may.

The folder a module sits in says which process it runs in (docs/architecture/code.md). These tests
read every module's imports (top-level, inside functions and under TYPE_CHECKING alike: a deferred
import hides a circle, it does not remove one) and check the rules below, so they hold after us.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.support import paths

ROOT = paths.ROOT / "synapse"

#: Standard-library modules the pure core may not use: I/O, concurrency, clocks and randomness.
CORE_DENIED_STDLIB = {"asyncio", "subprocess", "socket", "threading", "multiprocessing", "concurrent", "time",
                      "random", "uuid", "os", "shutil", "signal", "select", "selectors", "ssl", "http", "urllib",
                      "pathlib", "tempfile", "mmap"}
#: Third-party packages the core may use: pure data structures and the wire format.
CORE_ALLOWED_THIRD_PARTY = {"sortedcontainers", "google"}
#: Which Synapse packages each package may import (besides itself). `proto` is generated code.
ALLOWED = {
    "core": {"proto"},
    "common": {"core", "proto"},
    "client": {"core", "common", "proto", "rpc"},
    "master": {"core", "common", "proto", "history", "rpc"},
    "history": {"core"},  # the history store and its exporter: the master runs them
    "worker": {"core", "common", "client", "proto", "images", "rpc"},
    "images": {"core"},  # the node's image store: the worker runs it
    "local": {"core", "common", "client", "proto", "history"},  # history: checks --history's URL
    "sim": {"core", "common"},  # the evaluation: the pure core on a simulated clock, never master/worker/gRPC
    "rpc": {"core", "proto"},  # the API's messages to and from the domain: for the master, worker and client
    "proto": set(),
}

#: The leader's decisions live in one place, synapse.core.brain.leader_state, and its drivers only carry
#: them out: a driver that imported the deciding modules could grow a second copy of a decision.
DRIVERS = {"sim.engine", "master.leader"}
DECIDING = {"core.schedule.preemption", "core.schedule.admission", "core.schedule.placement"}
#: Scheduling plans from a read-only view of the cluster (synapse.core.schedule.view.ClusterRead),
#: never from the state machine, so that a round can plan on a snapshot taken under the lock.
PLANNERS = "core.schedule"
STATE_MACHINE = "core.state.fsm"
#: The API's messages: converted at the edge (synapse.rpc), never in the core, whose codec encodes the
#: Raft log alone (commands_pb2, types_pb2).
API_MESSAGES = "proto.api_pb2"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module `path` imports, as absolute dotted names (`from a import b` yields a.b when a.b
    is a module under `root`, else a)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (root.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (root.parent / Path(*candidate.split(".")) / "__init__.py").exists()
                found.add(candidate if is_module else base)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package it imports."""
    top = root.name
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        graph[module_name(path, root)] = {m for m in imports_of(path, root) if m == top or m.startswith(top + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as a list of modules (first repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def forbidden_edges(root: Path) -> list[str]:
    """Every import that breaks the layering rules, as 'module -> imported (why)'."""
    bad = []
    top = root.name
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        parts = name.split(".")
        if len(parts) < 2:
            continue  # the top package's __init__
        layer = parts[1]
        for imported in sorted(imports_of(path, root)):
            head = imported.split(".")[0]
            if head == top:
                target = imported.split(".")
                if ".".join(parts[1:]) in DRIVERS and ".".join(target[1:4]) in DECIDING:
                    bad.append(f"{name} -> {imported} (a driver of the leader's brain decides nothing itself)")
                if ".".join(parts[1:3]) == PLANNERS and ".".join(target[1:4]) == STATE_MACHINE:
                    bad.append(f"{name} -> {imported} (scheduling reads a ClusterRead, not the state machine)")
                if len(target) < 2 or target[1] == layer:
                    continue
                if target[1] not in ALLOWED.get(layer, set()):
                    bad.append(f"{name} -> {imported} ({layer} may not import {target[1]})")
                elif target[1] == "proto" and layer == "core" and imported.endswith("_grpc"):
                    bad.append(f"{name} -> {imported} (the core may not import gRPC stubs)")
                elif layer == "core" and ".".join(target[1:]) == API_MESSAGES:
                    bad.append(f"{name} -> {imported} (the core may not import the API's messages: rpc converts them)")
            elif layer == "core":
                if head in sys.stdlib_module_names:
                    if head in CORE_DENIED_STDLIB:
                        bad.append(f"{name} -> {imported} (the core does no I/O and reads no clock)")
                elif head not in CORE_ALLOWED_THIRD_PARTY and head != "__future__":
                    bad.append(f"{name} -> {imported} (the core may not depend on {head})")
    return bad


def test_synapse_has_no_import_circle():
    cycle = find_cycle(import_graph(ROOT))
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_every_import_respects_the_layers():
    assert forbidden_edges(ROOT) == []


def test_every_subpackage_has_a_declared_layer():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ALLOWED), "add the new package to ALLOWED (and to docs/architecture/code.md's map)"
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules outside any layer: {loose}"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_the_checks_catch_a_circle_and_forbidden_edges(tmp_path):
    """The checker itself: a package with a deferred-import circle and layering breaks is caught."""
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/model.py": "import time\nimport grpc\nfrom pkg.master import replica\n",
        "core/codec.py": "from pkg.proto import api_pb2_grpc\nfrom . import model\n",
        "core/views.py": "from pkg.proto import api_pb2, commands_pb2\n",
        "rpc/__init__.py": "",
        "rpc/convert.py": "from pkg.proto import api_pb2\n",
        "core/schedule/__init__.py": "",
        "core/schedule/preemption.py": "",
        "sim/__init__.py": "",
        "sim/engine.py": "from pkg.core.schedule import preemption\n",
        "master/__init__.py": "",
        "master/replica.py": "def f():\n    from pkg.master.endpoints import X\n",
        "master/endpoints.py": "from pkg.master.replica import f\nfrom pkg.worker import agent\n",
        "worker/__init__.py": "",
        "worker/agent.py": "",
        "proto/__init__.py": "",
        "proto/api_pb2_grpc.py": "",
        "proto/api_pb2.py": "",
        "proto/commands_pb2.py": "",
    })
    cycle = find_cycle(import_graph(root))
    assert set(cycle) == {"pkg.master.replica", "pkg.master.endpoints"}
    bad = forbidden_edges(root)
    assert "pkg.core.model -> time (the core does no I/O and reads no clock)" in bad
    assert "pkg.core.model -> grpc (the core may not depend on grpc)" in bad
    assert "pkg.core.model -> pkg.master.replica (core may not import master)" in bad
    assert "pkg.core.codec -> pkg.proto.api_pb2_grpc (the core may not import gRPC stubs)" in bad
    assert "pkg.core.views -> pkg.proto.api_pb2 (the core may not import the API's messages: rpc converts them)" in bad
    assert not any(b.startswith(("pkg.core.views -> pkg.proto.commands_pb2", "pkg.rpc.")) for b in bad)
    assert "pkg.master.endpoints -> pkg.worker.agent (master may not import worker)" in bad
    assert ("pkg.sim.engine -> pkg.core.schedule.preemption (a driver of the leader's brain decides nothing "
            "itself)") in bad
    assert not any(b.startswith("pkg.core.codec -> pkg.core.model") for b in bad)


def test_the_checks_catch_scheduling_importing_the_state_machine(tmp_path):
    """The checker itself: a scheduling module that imports the state machine, even for its types
    alone, is caught; one that imports the view, or a state module that imports scheduling, is not."""
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/state/__init__.py": "",
        "core/state/fsm.py": "from pkg.core.schedule import view\n",
        "core/schedule/__init__.py": "",
        "core/schedule/view.py": "",
        "core/schedule/scheduler.py": "from typing import TYPE_CHECKING\nfrom pkg.core.schedule.view import X\n"
                                      "if TYPE_CHECKING:\n    from pkg.core.state.fsm import ClusterState\n",
        "core/schedule/spares.py": "from pkg.core.state import fsm\n",
    })
    bad = forbidden_edges(root)
    assert bad == [
        "pkg.core.schedule.scheduler -> pkg.core.state.fsm (scheduling reads a ClusterRead, not the state machine)",
        "pkg.core.schedule.spares -> pkg.core.state.fsm (scheduling reads a ClusterRead, not the state machine)",
    ]


# ---- the worker's state has one writer ------------------------------------------------------------

WORKER = ROOT / "worker"
#: The one module that may change a WorkerState (synapse.worker.state's docstring states the rule).
STATE_MODULE = "state.py"
#: Methods that change a list, dict or set in place.
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "add", "discard",
            "setdefault", "sort", "reverse", "difference_update", "intersection_update",
            "symmetric_difference_update", "__setitem__", "__delitem__", "__setattr__", "__delattr__",
            "__iadd__", "__ior__", "__iand__", "__isub__"}
#: Methods of WorkerState whose result holds nothing of the state that could be changed through it
#: (`handle` returns instructions; `view` a frozen copy).
DETACHED = {"handle", "view"}
#: Worker code that runs off the agent's main loop: it reads the published view, never the state.
OFF_THE_MAIN_LOOP = {"uplink.py": {"_register", "_watch_loop", "_heartbeat_loop", "_follow_shard", "_report_loop",
                                   "_progress_loop", "_health_loop", "_gpu_loop"},
                     "pulls.py": {"_pull"}, "tasks.py": {"_watch_gate"}, "logs.py": {"LogService"},
                     "attach.py": {"AttachService"},
                     "observe.py": {"_Tasks"}}


def _is_state(node: ast.AST) -> bool:
    """The names the worker uses for its WorkerState: `state`, `self.state`, `agent.state`, ..."""
    return (isinstance(node, ast.Name) and node.id == "state") or (isinstance(node, ast.Attribute)
                                                                   and node.attr == "state")


def _into_state(node: ast.AST, aliases: set[str]) -> bool:
    """`node` (an object something is written into) is the state, a part of it or an alias of one:
    its chain of attributes, subscripts and calls reaches the state or an alias."""
    while True:
        if _is_state(node) or (isinstance(node, ast.Name) and node.id in aliases):
            return True
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return False


def _mentions_state(node: ast.AST, aliases: set[str]) -> bool:
    """`node` (a value bound to a name) may hold a part of the state: it reads a field or a method's
    result of the state, or an alias (conservatively: `n = len(state.tasks)` counts too)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and _is_state(sub.value) and sub.attr not in DETACHED:
            return True
        if isinstance(sub, ast.Name) and sub.id in aliases:
            return True
    return False


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _in_scope(scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope`'s own code: nested functions are scopes of their own."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _aliases(nodes: list[ast.AST], inherited: set[str]) -> set[str]:
    """Names bound to a part of the state (`task = self.state.tasks[k]`, `for t in state.running()`,
    `with`, `:=`, comprehensions) in a scope's `nodes`, besides the enclosing scopes' (`inherited`),
    to a fixed point (an alias of an alias)."""
    aliases = set(inherited)
    while True:
        found = set(aliases)
        for node in nodes:
            bound: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                bound = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                bound = [(node.target, node.value)]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                bound = [(node.target, node.iter)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                bound = [(node.optional_vars, node.context_expr)]
            for target, value in bound:
                if isinstance(target, ast.Name | ast.Tuple | ast.List | ast.Starred) and _mentions_state(value, found):
                    found |= _names(target)
        if found == aliases:
            return aliases
        aliases = found


def _writes(node: ast.AST, aliases: set[str]) -> bool:
    """`node` assigns to, deletes or mutates in place the state or a part of it."""
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        for t in (target.elts if isinstance(target, ast.Tuple | ast.List) else [target]):
            t = t.value if isinstance(t, ast.Starred) else t
            if isinstance(t, ast.Attribute | ast.Subscript) and _into_state(t.value, aliases):
                return True
            if isinstance(node, ast.AugAssign) and isinstance(t, ast.Name) and t.id in aliases:
                return True  # `reports += [r]` extends the list in place
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and _into_state(func.value, aliases):
            return True
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in {"setattr", "delattr"} and bool(node.args) and _into_state(node.args[0], aliases)
    return False


def state_writes(source: str, filename: str = "<snippet>") -> list[str]:
    """Every place in `source` that assigns to, deletes or mutates in place a WorkerState attribute
    (or anything inside one, such as a task's field), directly or through an alias: 'file:line code'."""
    found: list[tuple[int, str]] = []

    def visit(scope: ast.AST, inherited: set[str]) -> None:
        nodes = _in_scope(scope)
        aliases = _aliases(nodes, inherited)
        found.extend((n.lineno, ast.unparse(n).splitlines()[0]) for n in nodes  # type: ignore[attr-defined]
                     if _writes(n, aliases))
        for n in nodes:
            if isinstance(n, SCOPES):
                visit(n, aliases)

    visit(ast.parse(source, filename), set())
    return [f"{filename}:{line} {code}" for line, code in sorted(set(found))]


def state_reads_off_the_main_loop(source: str, names: set[str], filename: str = "<snippet>") -> list[str]:
    """Every mention of the state inside the functions or classes `names` (code run by other threads)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            found += [f"{filename}:{sub.lineno} {node.name}: {ast.unparse(sub)}" for sub in ast.walk(node)
                      if _is_state(sub)]
    return found


def test_only_the_state_module_writes_the_workers_state():
    bad = [w for path in sorted(WORKER.glob("*.py")) if path.name != STATE_MODULE
           for w in state_writes(path.read_text(), f"synapse/worker/{path.name}")]
    assert bad == [], "the worker's state changes only through WorkerState.handle (send the main loop an event):\n" \
        + "\n".join(bad)


def test_the_workers_other_threads_read_the_published_view_not_the_state():
    bad = [r for name, functions in OFF_THE_MAIN_LOOP.items()
           for r in state_reads_off_the_main_loop((WORKER / name).read_text(), functions, f"synapse/worker/{name}")]
    assert bad == [], "read `view` (the main loop's copy) off the main loop:\n" + "\n".join(bad)
    for name, functions in OFF_THE_MAIN_LOOP.items():  # the names above still exist
        tree = ast.parse((WORKER / name).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert functions <= defined, f"{name}: no {sorted(functions - defined)} any more: update OFF_THE_MAIN_LOOP"


def test_the_state_writer_check_catches_every_kind_of_write():
    """The checker itself, on a snippet with each kind of write (and reads it must let pass)."""
    snippet = """\
class Agent:
    def run(self, event, now, k, r):
        self.state.known = (1, 2)
        self.state.tasks[k] = r
        self.state.unreported.append(r)
        del self.state.tasks[k]
        self.state.done |= {k}
        self.state.tasks[k].phase = "running"
        self.state.tasks.get(k).handle = None
        task = self.state.tasks.get(k)
        task.killed = True
        for key, t in list(self.state.tasks.items()):
            t.grace = 1.0
        reports = self.state.unreported
        reports += [r]
        setattr(self.state, "known", (0, 0))
        self.agent.state.prepared.pop(k)
        self.state.known, other = (3, 4), 5
        self.state = WorkerState.restore(now=now)
        self._carry_out(self.state.handle(event, now))
        out = self.state.handle(event, now)
        out.append(r)
        batch = self.view.unreported
        count = len(self.state.tasks)
        self.other.append(count)


def pull(state, k):
    state.holds.clear()
"""
    assert [w.split(" ", 1)[0] for w in state_writes(snippet)] == \
        [f"<snippet>:{n}" for n in (3, 4, 5, 6, 7, 8, 9, 11, 13, 15, 16, 17, 18, 29)]
    assert state_reads_off_the_main_loop(snippet, {"pull"}) == ["<snippet>:29 pull: state"]
