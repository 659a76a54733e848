"""The worker's state file: what a restarted agent goes on from (the tasks it re-adopts, the reports
not yet acknowledged, the listing it last saw). Written whole after every change.

It is written to a new file, the old one unlinked, and the new one renamed into its place, not
renamed over the old one: ext4 (its `auto_da_alloc` default) flushes a file renamed over another
before the rename returns, which took the agent 4-5 ms a save in one of fifty, on the main loop,
when a task starts. A crash between the unlink and the rename leaves only the new file, complete:
`load` reads it then. The agent's process dying loses nothing written (the page cache keeps it);
a machine's crash ends its tasks anyway (the boot id says so)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import fields
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
            "unreported": [_plain(r) | {"key": list(r.key)} for r in state.unreported],
            "tasks": [{"assignment": _plain(t.assignment) | {"resources": _plain(t.assignment.resources)},
                       "phase": t.phase, "handle": _plain(t.handle) if t.handle else None,
                       "noticed": t.noticed_at is not None}
                      for t in state.tasks.values()]}
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.rename(tmp, path)


_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(obj: object) -> dict[str, object]:
    """A dataclass's fields by name, one level deep (dataclasses.asdict copies every value
    recursively: a third of a save's time). Their tuples become JSON lists as asdict's would."""
    names = _NAMES.get(type(obj))
    if names is None:
        names = _NAMES[type(obj)] = tuple(f.name for f in fields(obj))  # type: ignore[arg-type]
    return {name: getattr(obj, name) for name in names}


def load(data_dir: Path, stop_grace: float, find: Callable[[Assignment], Handle | None]) -> ws.WorkerState | None:
    """The state the data dir's state file keeps (None: there is none); its tasks that have a
    process are re-adopted (the rules: WorkerState.restore), `find` finding a starting task's."""
    path = data_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        try:  # stopped between a save's unlink and its rename (see save): the new file is whole
            data = json.loads(path.with_suffix(".tmp").read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # none, or the first save cut short
            return None
    saved = []
    for t in data["tasks"]:
        a = t["assignment"]
        assignment = Assignment(**{**a, "gpus": tuple(a["gpus"]), "command": tuple(a["command"]),
                                   "env": tuple(tuple(kv) for kv in a["env"]),
                                   "mounts": tuple(tuple(m) for m in a.get("mounts", ())),
                                   "resources": Resources(**a.get("resources", {}))})
        # A task recorded as starting may have been forked just before a crash: its shim's
        # mark says so (synapse.worker.fence.MARK). Never started (no mark): forgotten; the master lists it again.
        handle = Handle(**t["handle"]) if t["handle"] else find(assignment)
        saved.append(ws.SavedTask(assignment, t["phase"], handle, bool(t.get("noticed"))))
    # (a state file without a boot id is an older worker's: its machine is taken as not restarted)
    return ws.WorkerState.restore(
        stop_grace=stop_grace, known=tuple(data["known"]), done=(tuple(k) for k in data["done"]),
        unreported=[ws.Report(tuple(r["key"]), r["started"], r["exit_code"], r["reason"], r.get("cause", ""),
                              r.get("node_side", False), r.get("prepared", False)) for r in data["unreported"]],
        tasks=saved, now=time.monotonic(), rebooted=data.get("boot_id", boot_id()) != boot_id())
