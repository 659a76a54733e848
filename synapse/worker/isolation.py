"""Task confinement with cgroups: each task (its shim and everything it forks) in a cgroup of its own.

Limits come from the task's per-task resources:
* memory: the hard limit is the memory asked for, and no swap beyond it (v2 `memory.swap.max = 0`;
  v1 `memory.memsw.limit_in_bytes` equal to the limit when swap accounting exists, else
  `memory.swappiness = 0`). Over the limit the kernel's OOM killer acts inside the cgroup alone,
  and the cgroup counts it (v2 `memory.events` oom_kill, v1 `memory.oom_control` oom_kill): that
  is how a task's end is read as `OOMKilled`. A task that asked for no memory has no memory limit.
* cpu: a CFS quota of the cpu asked for (1000m = one core's time per 100 ms period).
* pids: a cap on processes and threads (`--task-pids-max`), against fork bombs.

Where: below the worker agent's own cgroup (under systemd, `Delegate=yes` gives the agent its
subtree), in a directory per worker (`synapse-<node id>-<hash of its data dir>`, so two workers on
one machine never touch each other's tasks), one cgroup per task named by the task id. With cgroup
v2 the agent's own cgroup may not hold processes once it has children with controllers (the "no
internal processes" rule), so the agent moves itself into a leaf, `agent`, beside them; a cgroup
already named `agent` (systemd's `DelegateSubgroup=agent`) counts as that leaf. With cgroup v1
(or a hybrid machine whose v2 hierarchy has no controllers) the same layout is built in each of
the memory, cpu and pids hierarchies.

The shim (`shim.sh`) joins the task's cgroups before it runs the command, and refuses to run it
if it cannot (exit 125 and a `.err` file): a task never runs unconfined without anyone knowing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from synapse.core.model import Resources

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "cpu", "pids")
#: The CFS period the cpu quota is a share of, in microseconds (the kernel's default).
CFS_PERIOD_US = 100_000
#: The kernel refuses quotas below 1 ms.
MIN_QUOTA_US = 1000
DEFAULT_PIDS_MAX = 16384
#: The leaf the agent itself lives in under cgroup v2.
AGENT_LEAF = "agent"


class IsolationError(Exception):
    """Cgroups cannot confine tasks here; the message says what is missing and where."""


@dataclass(frozen=True, slots=True)
class Limits:
    memory: int  #: bytes; 0: no memory limit
    cpu_millis: int  #: 0: no cpu quota
    pids: int  #: processes and threads; 0: no cap

    @classmethod
    def of(cls, resources: Resources, pids: int) -> Limits:
        return cls(max(0, resources.memory), max(0, resources.cpu), max(0, pids))

    def cpu_quota_us(self) -> int:
        """The CFS quota per period; 0 for no quota."""
        return max(MIN_QUOTA_US, self.cpu_millis * CFS_PERIOD_US // 1000) if self.cpu_millis else 0


def group_name(node_id: str, data_dir: Path) -> str:
    """The per-worker directory of task cgroups: stable across restarts of the same worker."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in node_id)[:64]
    return f"synapse-{safe}-{digest}"


def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """(/proc/PID/cgroup) -> (v1 controller -> path, the v2 path or None)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, names, path = parts
        if hid == "0" and names == "":
            v2 = path
            continue
        for name in names.split(","):
            if name:
                v1[name] = path
    return v1, v2


def parse_mountinfo(text: str) -> tuple[tuple[Path, str] | None, dict[str, tuple[Path, str]]]:
    """(/proc/PID/mountinfo) -> ((v2 mount point, its root) or None, v1 controller -> (mount, root))."""
    v2 = None
    v1: dict[str, tuple[Path, str]] = {}
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, extra = head.split(), tail.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        root, mount = fields[3], Path(fields[4].replace("\\040", " "))
        if extra[0] == "cgroup2" and v2 is None:
            v2 = (mount, root)
        elif extra[0] == "cgroup":
            for option in extra[2].split(","):
                if option in CONTROLLERS and option not in v1:
                    v1[option] = (mount, root)
    return v2, v1


def _below(mount: Path, root: str, path: str) -> Path:
    """The directory of cgroup `path` (as /proc/PID/cgroup names it) under a mount of `root`."""
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return mount / rel.lstrip("/")


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise IsolationError(f"cannot write {value.strip()!r} to {path}: {exc.strerror or exc}") from None


def _read_counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _pids_in(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


class Cgroups:
    """Task cgroups of one worker. Subclasses know one cgroup version's files."""

    version = 0

    def __init__(self, parents: dict[str, Path]) -> None:
        #: controller (or "unified") -> this worker's directory of task cgroups in that hierarchy
        self.parents = parents

    def describe(self) -> str:
        first = next(iter(self.parents.values()))
        return f"cgroup v{self.version} (memory, cpu, pids) under {first}"

    def dirs(self, name: str) -> list[Path]:
        return [parent / name for parent in self.parents.values()]

    def prepare(self) -> None:
        """Make this worker's directories, and prove a task cgroup with limits can be made and removed."""
        raise NotImplementedError

    def create(self, name: str, limits: Limits) -> list[Path]:
        """Make the task's cgroup(s) with its limits; returns the cgroup.procs files the shim joins."""
        for d in self.dirs(name):
            try:
                d.mkdir(exist_ok=True)
            except OSError as exc:
                raise IsolationError(f"cannot create cgroup {d}: {exc.strerror or exc}") from None
        try:
            self._set_limits(name, limits)
        except IsolationError:
            self.remove(name)
            raise
        return [d / "cgroup.procs" for d in self.dirs(name)]

    def _set_limits(self, name: str, limits: Limits) -> None:
        raise NotImplementedError

    def oom_kills(self, name: str) -> int:
        """How many processes of the task the OOM killer has killed (0 if unknown)."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        return all(d.is_dir() for d in self.dirs(name))

    def pids(self, name: str) -> list[int]:
        return sorted({pid for d in self.dirs(name) for pid in _pids_in(d / "cgroup.procs")})

    def kill(self, name: str) -> None:
        """SIGKILL every process still in the task's cgroup (what escaped its process group too)."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, name: str, wait: float = 2.0) -> bool:
        """Kill what is left in the task's cgroup and remove it; False (logged) if it would not go."""
        deadline = time.monotonic() + wait
        while self.pids(name) and time.monotonic() < deadline:
            self.kill(name)
            time.sleep(0.02)
        ok = True
        for d in self.dirs(name):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                ok = False
                log.warning("cannot remove cgroup path=%s error=%s", d, exc.strerror or exc)
        return ok

    def names(self) -> set[str]:
        """Task cgroups that exist in this worker's directory."""
        out: set[str] = set()
        for parent in self.parents.values():
            try:
                out.update(p.name for p in parent.iterdir() if p.is_dir())
            except OSError:
                pass
        return out

    def close(self) -> None:
        """Remove this worker's directories if no task cgroup is left in them (the agent is leaving)."""
        for parent in self.parents.values():
            try:
                parent.rmdir()
            except OSError:
                pass  # tasks still run (they outlive the agent), or it is already gone

    def _probe(self) -> None:
        name = f"probe-{os.getpid()}"
        self.create(name, Limits(64 << 20, 1000, 64))
        if not self.remove(name):
            raise IsolationError(f"cannot remove the probe cgroup {self.dirs(name)[0]}")


class CgroupV2(Cgroups):
    """The unified hierarchy: one tree, controllers enabled per level in cgroup.subtree_control."""

    version = 2

    def __init__(self, mount: Path, own: Path, group: str) -> None:
        self.mount = mount
        #: the cgroup delegated to this agent: its own, or the parent of its `agent` leaf
        self.delegated = own.parent if own.name == AGENT_LEAF and own != mount else own
        super().__init__({"unified": self.delegated / group})

    def prepare(self) -> None:
        available = set((self.delegated / "cgroup.controllers").read_text().split()) \
            if (self.delegated / "cgroup.controllers").exists() else set()
        missing = [c for c in CONTROLLERS if c not in available]
        if missing:
            raise IsolationError(f"cgroup v2 at {self.delegated} lacks controller(s) {', '.join(missing)} (the "
                                 f"parent must enable them; under systemd set Delegate=yes in the worker's unit)")
        if self.delegated != self.mount and _pids_in(self.delegated / "cgroup.procs"):
            leaf = self.delegated / AGENT_LEAF
            try:
                leaf.mkdir(exist_ok=True)
            except OSError as exc:
                raise IsolationError(f"cannot create {leaf}: {exc.strerror or exc}") from None
            _write(leaf / "cgroup.procs", str(os.getpid()))
            if _pids_in(self.delegated / "cgroup.procs"):
                raise IsolationError(f"cgroup {self.delegated} holds other processes besides the worker; run the "
                                     f"worker in a cgroup of its own (systemd: Delegate=yes)")
        enable = " ".join(f"+{c}" for c in CONTROLLERS)
        _write(self.delegated / "cgroup.subtree_control", enable)
        parent = self.parents["unified"]
        try:
            parent.mkdir(exist_ok=True)
        except OSError as exc:
            raise IsolationError(f"cannot create {parent}: {exc.strerror or exc}") from None
        _write(parent / "cgroup.subtree_control", enable)
        self._probe()

    def _set_limits(self, name: str, limits: Limits) -> None:
        d = self.parents["unified"] / name
        _write(d / "memory.max", str(limits.memory) if limits.memory else "max")
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        if (d / "memory.oom.group").exists():
            _write(d / "memory.oom.group", "1")  # an OOM kill takes the whole task, not one stray process
        quota = limits.cpu_quota_us()
        _write(d / "cpu.max", f"{quota or 'max'} {CFS_PERIOD_US}")
        _write(d / "pids.max", str(limits.pids) if limits.pids else "max")

    def oom_kills(self, name: str) -> int:
        return _read_counter(self.parents["unified"] / name / "memory.events", "oom_kill")

    def kill(self, name: str) -> None:
        killer = self.parents["unified"] / name / "cgroup.kill"
        if killer.exists():
            try:
                killer.write_text("1")
                return
            except OSError:
                pass
        super().kill(name)


class CgroupV1(Cgroups):
    """Separate memory, cpu and pids hierarchies, each with the same per-worker layout."""

    version = 1

    def __init__(self, own: dict[str, Path], group: str) -> None:
        #: controller -> the agent's own cgroup directory in that hierarchy
        self.own = own
        super().__init__({c: own[c] / group for c in CONTROLLERS})

    def prepare(self) -> None:
        for controller, parent in self.parents.items():
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                raise IsolationError(f"cannot create the {controller} cgroup {parent}: {exc.strerror or exc}") from None
        self._probe()

    def _set_limits(self, name: str, limits: Limits) -> None:
        mem = self.parents["memory"] / name
        if limits.memory:
            _write(mem / "memory.limit_in_bytes", str(limits.memory))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory))  # memory + swap: no swap
            elif (mem / "memory.swappiness").exists():
                _write(mem / "memory.swappiness", "0")
        cpu = self.parents["cpu"] / name
        _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us() or -1))
        _write(self.parents["pids"] / name / "pids.max", str(limits.pids) if limits.pids else "max")

    def oom_kills(self, name: str) -> int:
        return _read_counter(self.parents["memory"] / name / "memory.oom_control", "oom_kill")


def detect(group: str, proc_cgroup: str, mountinfo: str) -> Cgroups:
    """The cgroups this process may confine tasks with: v2 when its hierarchy offers memory, cpu and
    pids; else v1 when all three are mounted. Raises IsolationError saying what is missing."""
    own_v1, own_v2 = parse_proc_cgroup(proc_cgroup)
    v2_mount, v1_mounts = parse_mountinfo(mountinfo)
    problems = []
    if v2_mount is not None and own_v2 is not None:
        mount, root = v2_mount
        own = _below(mount, root, own_v2)
        candidate = CgroupV2(mount, own, group)
        available = candidate.delegated / "cgroup.controllers"
        have = set(available.read_text().split()) if available.exists() else set()
        if all(c in have for c in CONTROLLERS):
            return candidate
        problems.append(f"cgroup v2 at {candidate.delegated} offers {', '.join(sorted(have)) or 'no controllers'}")
    else:
        problems.append("no cgroup v2 hierarchy")
    missing = [c for c in CONTROLLERS if c not in v1_mounts or c not in own_v1]
    if not missing:
        return CgroupV1({c: _below(*v1_mounts[c], own_v1[c]) for c in CONTROLLERS}, group)
    problems.append(f"cgroup v1 lacks {', '.join(missing)}")
    raise IsolationError("; ".join(problems))


def here(group: str, proc: Path = Path("/proc/self")) -> Cgroups:
    """The cgroups `detect` finds for this process, without creating anything."""
    return detect(group, (proc / "cgroup").read_text(), (proc / "mountinfo").read_text())


def choose(mode: str, group: str, proc: Path = Path("/proc/self")) -> tuple[Cgroups | None, str]:
    """The isolation `--isolation MODE` yields here, and how to describe it.

    `none`: no cgroups. `cgroup`: cgroups or an IsolationError. `auto`: cgroups when this worker may
    create them, else none, with the reason in the description."""
    if mode == "none":
        return None, "none (--isolation none)"
    try:
        cgroups = here(group, proc)
        cgroups.prepare()
    except (IsolationError, OSError) as exc:
        if mode == "cgroup":
            raise IsolationError(str(exc)) from None
        return None, f"none: cgroups unavailable ({exc})"
    return cgroups, cgroups.describe()
