"""The package's shape holds: no import circle, and each layer imports only what it may.

The folder a module sits in says which process it runs in (docs/architecture/code.md). These tests
read every module's imports (top-level, inside functions and under TYPE_CHECKING alike: a deferred
import hides a circle, it does not remove one) and check the rules below, so they hold after us.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "synapse"

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
    "client": {"core", "common", "proto"},
    "master": {"core", "common", "proto", "history"},
    "history": {"core"},  # the history store and its exporter: the master runs them
    "worker": {"core", "common", "client", "proto", "images"},
    "images": {"core"},  # the node's image store: the worker runs it
    "local": {"core", "common", "client", "proto", "history"},  # history: checks --history's URL
    "sim": {"core", "common"},  # the evaluation: the pure core on a simulated clock, never master/worker/gRPC
    "proto": set(),
}

#: The leader's decisions live in one place, synapse.core.leader_state, and its drivers only carry
#: them out: a driver that imported the deciding modules could grow a second copy of a decision.
DRIVERS = {"core.sim", "master.leader"}
DECIDING = {"core.preemption", "core.admission", "core.placement"}


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
                if ".".join(parts[1:]) in DRIVERS and ".".join(target[1:3]) in DECIDING:
                    bad.append(f"{name} -> {imported} (a driver of the leader's brain decides nothing itself)")
                if len(target) < 2 or target[1] == layer:
                    continue
                if target[1] not in ALLOWED.get(layer, set()):
                    bad.append(f"{name} -> {imported} ({layer} may not import {target[1]})")
                elif target[1] == "proto" and layer == "core" and imported.endswith("_grpc"):
                    bad.append(f"{name} -> {imported} (the core may not import gRPC stubs)")
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
        "core/sim.py": "from pkg.core import preemption\n",
        "core/preemption.py": "",
        "master/__init__.py": "",
        "master/replica.py": "def f():\n    from pkg.master.endpoints import X\n",
        "master/endpoints.py": "from pkg.master.replica import f\nfrom pkg.worker import agent\n",
        "worker/__init__.py": "",
        "worker/agent.py": "",
        "proto/__init__.py": "",
        "proto/api_pb2_grpc.py": "",
    })
    cycle = find_cycle(import_graph(root))
    assert set(cycle) == {"pkg.master.replica", "pkg.master.endpoints"}
    bad = forbidden_edges(root)
    assert "pkg.core.model -> time (the core does no I/O and reads no clock)" in bad
    assert "pkg.core.model -> grpc (the core may not depend on grpc)" in bad
    assert "pkg.core.model -> pkg.master.replica (core may not import master)" in bad
    assert "pkg.core.codec -> pkg.proto.api_pb2_grpc (the core may not import gRPC stubs)" in bad
    assert "pkg.master.endpoints -> pkg.worker.agent (master may not import worker)" in bad
    assert "pkg.core.sim -> pkg.core.preemption (a driver of the leader's brain decides nothing itself)" in bad
    assert not any(b.startswith("pkg.core.codec -> pkg.core.model") for b in bad)
