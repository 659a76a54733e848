"""The worker's state file: what a restarted agent goes on from (the tasks it re-adopts, the reports
not yet acknowledged, the listing it last saw). Written whole and renamed after every change."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from synapse.core.model import Assignment, Resources
from synapse.worker import state as ws
from synapse.worker.fence import boot_id
from synapse.worker.runtime import Handle

STATE_FILE = "worker-state.json"


def save(data_dir: Path, state: ws.WorkerState) -> None:
    """Write `state` to the data dir's state file."""
    data = {"boot_id": boot_id(), "known": list(state.known),
            "done": [list(k) for k in sorted(state.done)],
            "unreported": [asdict(r) | {"key": list(r.key)} for r in state.unreported],
            "tasks": [{"assignment": asdict(t.assignment), "phase": t.phase,
                       "handle": asdict(t.handle) if t.handle else None, "noticed": t.noticed_at is not None}
                      for t in state.tasks.values()]}
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load(data_dir: Path, stop_grace: float, find: Callable[[Assignment], Handle | None]) -> ws.WorkerState | None:
    """The state the data dir's state file keeps (None: there is none); its tasks that have a
    process are re-adopted (the rules: WorkerState.restore), `find` finding a starting task's."""
    path = data_dir / STATE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    saved = []
    for t in data["tasks"]:
        a = t["assignment"]
        assignment = Assignment(**{**a, "gpus": tuple(a["gpus"]), "command": tuple(a["command"]),
                                   "env": tuple(tuple(kv) for kv in a["env"]),
                                   "mounts": tuple(tuple(m) for m in a.get("mounts", ())),
                                   "resources": Resources(**a.get("resources", {}))})
        # A task recorded as starting may have been forked just before a crash: its shim's
        # pid file says so. Never started (no pid file): forgotten; the master lists it again.
        handle = Handle(**t["handle"]) if t["handle"] else find(assignment)
        saved.append(ws.SavedTask(assignment, t["phase"], handle, bool(t.get("noticed"))))
    # (a state file without a boot id is an older worker's: its machine is taken as not restarted)
    return ws.WorkerState.restore(
        stop_grace=stop_grace, known=tuple(data["known"]), done=(tuple(k) for k in data["done"]),
        unreported=[ws.Report(tuple(r["key"]), r["started"], r["exit_code"], r["reason"], r.get("cause", ""),
                              r.get("node_side", False), r.get("prepared", False)) for r in data["unreported"]],
        tasks=saved, now=time.monotonic(), rebooted=data.get("boot_id", boot_id()) != boot_id())
