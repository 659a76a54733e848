"""The built-in container runtime's plan: what a task inside an image sees, decided before it starts.

`plan` is pure apart from reading the host (which devices and driver libraries exist, the CDI
specs): it turns an assignment, its image and the worker's policy into a `ContainerSpec`, or a
`ContainerRefused` naming what the worker will not do. `synapse/worker/sandbox.py` carries the
spec out inside the task's process tree (namespaces, overlay, mounts, pivot), so nothing here
mounts anything, and a restarted worker needs none of it to re-adopt a running task.

What a task gets:
* its argv: the job's `command` when it has one (it replaces the image's Entrypoint and Cmd, as a
  Kubernetes `command` does), else the image's Entrypoint followed by its Cmd;
* its env: the image's Env, then the GPUs' CDI env, then the job's env and Synapse's variables
  (SYNAPSE_*, the torch.distributed ones), later ones winning;
* its working directory: the image's WorkingDir (created if the image lacks it), else /;
* its user: the image's User where the worker runs as root (sandbox.py), else root;
* devices: the task's own GPUs only (`/dev/nvidiaN` for each allotted index) and the NVIDIA control
  devices that exist, or, where the node has a CDI spec for `nvidia.com/gpu`, the spec's device
  nodes, mounts and env for those GPUs and its common edits. CDI hooks are not run (they are
  programs such as `nvidia-ctk hook update-ldcache` that expect an OCI runtime's state); the
  driver libraries a spec mounts are mounted all the same;
* without a CDI spec, the host's NVIDIA driver libraries (libcuda, libnvidia-*) read-only under
  /usr/local/nvidia/lib64, which NGC images have on LD_LIBRARY_PATH (added when an image lacks it),
  and nvidia-smi in /usr/local/nvidia/bin;
* the job's `mounts:` whose source lies under a prefix the worker's admin allows (`--allow-mount`);
  any other is refused and the task ends with that reason before it starts.

Test hook: `SYNAPSE_TEST_DEV_ROOT`, in the worker's environment, is where the GPU device nodes are
looked up instead of /dev (tests make plain files there: making device nodes needs mknod).
"""

from __future__ import annotations

import glob
import json
import marshal
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: The NVIDIA control devices a task with GPUs gets, where the node has them.
NVIDIA_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
#: Where a node's CDI specs live (the CDI specification's defaults).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The CDI kind that names a node's GPUs by index.
CDI_GPU_KIND = "nvidia.com/gpu"
#: Where the host's driver libraries appear inside an image when no CDI spec places them.
DRIVER_LIB_DIR = "/usr/local/nvidia/lib64"
DRIVER_BIN_DIR = "/usr/local/nvidia/bin"
DRIVER_LIB_PATTERNS = ("libcuda.so*", "libnvidia-*.so*", "libcudadebugger.so*", "libnvcuvid.so*",
                       "libnvoptix.so*")
HOST_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
#: Targets a job's mount may not cover: the runtime's own.
RESERVED_TARGETS = ("/", "/proc", "/dev", "/sys")
DEV_ROOT_HOOK = "SYNAPSE_TEST_DEV_ROOT"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerRefused(Exception):
    """The worker will not run this task as asked (a mount outside the allowed prefixes, no command
    at all); the message says why, for the job's events."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount into the task's root."""

    source: str  #: a host path
    target: str  #: an absolute path inside the image
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What the sandbox does for one task (written next to the task's files by `prepare`)."""

    image_root: str
    upper: str
    work: str
    rootfs: str
    end_file: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    devices: tuple[Mount, ...] = ()  #: device nodes: source on the host, target in /dev
    mounts: tuple[Mount, ...] = ()
    skipped: tuple[str, ...] = field(default=())  #: what of a CDI spec was not applied, for the log
    user: str = ""  #: the image's User (name or uid, optional :group); "" runs as root
    #: the fd (inherited through the shim) of the socket the command waits at until the worker opens
    #: the gate (runtime.open_gate); -1: none
    gate_fd: int = -1

    def to_dict(self) -> dict[str, Any]:
        """Plain data (str, list, dict, bool) as the sandbox reads it."""
        return {
            "image_root": self.image_root, "upper": self.upper, "work": self.work, "rootfs": self.rootfs,
            "end_file": self.end_file, "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
            "devices": [{"source": d.source, "target": d.target} for d in self.devices],
            "mounts": [{"source": m.source, "target": m.target, "readonly": m.readonly} for m in self.mounts],
            "user": self.user, "gate_fd": self.gate_fd}


def env_of(image_env: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """An image config's Env (["K=V", …], or already a mapping) as a mapping."""
    if isinstance(image_env, Mapping):
        return dict(image_env)
    out: dict[str, str] = {}
    for item in image_env:
        key, _, value = item.partition("=")
        if key:
            out[key] = value
    return out


def argv_of(command: Sequence[str], entrypoint: Sequence[str], cmd: Sequence[str]) -> tuple[str, ...]:
    """The task's argv: the job's command, or the image's Entrypoint + Cmd; refused if neither."""
    if command:
        return tuple(command)
    argv = tuple(entrypoint or ()) + tuple(cmd or ())
    if not argv:
        raise ContainerRefused("the job has no command and the image names no Entrypoint or Cmd")
    return argv


def allowed_mount(source: str, target: str, allowed: Sequence[str]) -> str:
    """Why the job's mount `source` -> `target` is refused here ("" if allowed): the source, with
    its symlinks resolved, must lie under one of the worker's `--allow-mount` prefixes."""
    if not os.path.isabs(source) or not os.path.isabs(target):
        return f"mount {source} -> {target}: paths must be absolute"
    if ".." in source.split("/") or ".." in target.split("/"):
        return f"mount {source} -> {target}: '..' is not allowed"
    norm = os.path.normpath(target)
    if any(norm == r or (r != "/" and norm.startswith(r + "/")) for r in RESERVED_TARGETS):
        return f"mount {source} -> {target}: {norm} belongs to the runtime"
    if not allowed:
        return f"mount {source}: this worker allows no mounts (its admin names prefixes with --allow-mount)"
    real = os.path.realpath(source)
    for prefix in allowed:
        base = os.path.realpath(prefix)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            if not os.path.exists(real):
                return f"mount {source}: no such file or directory on this node"
            return ""
    return f"mount {source}: not under a prefix this worker allows ({', '.join(allowed)})"


def load_cdi_specs(dirs: Sequence[str]) -> list[dict[str, Any]]:
    """The node's CDI specs (JSON or YAML files in `dirs`), unreadable ones left out."""
    specs = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "*.json")) + glob.glob(os.path.join(directory, "*.yaml"))
                           + glob.glob(os.path.join(directory, "*.yml"))):
            try:
                with open(path) as f:
                    doc = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if isinstance(doc, dict):
                specs.append(doc)
    return specs


def _apply_edits(edits: Mapping[str, Any], devices: list[Mount], mounts: list[Mount], env: dict[str, str],
                 skipped: list[str]) -> None:
    """One CDI containerEdits: device nodes, mounts and env applied; hooks noted as skipped."""
    for node in edits.get("deviceNodes") or ():
        path = str(node.get("path", ""))
        if path:
            devices.append(Mount(str(node.get("hostPath") or path), path))
    for m in edits.get("mounts") or ():
        host, target = str(m.get("hostPath", "")), str(m.get("containerPath", ""))
        if host and target:
            mounts.append(Mount(host, target, "ro" in (m.get("options") or ())))
    env.update(env_of(edits.get("env") or ()))
    for hook in edits.get("hooks") or ():
        skipped.append(f"hook {hook.get('hookName', '?')} {hook.get('path', '')}")


def cdi_gpu_edits(specs: Sequence[Mapping[str, Any]], gpus: Sequence[int]) -> tuple[list[Mount], list[Mount],
                                                                                     dict[str, str], list[str]] | None:
    """(devices, mounts, env, skipped) for `gpus` from the node's `nvidia.com/gpu` CDI spec, or None
    when the node has no such spec. A GPU index the spec does not name gets nothing."""
    spec = next((s for s in specs if s.get("kind") == CDI_GPU_KIND), None)
    if spec is None:
        return None
    devices: list[Mount] = []
    mounts: list[Mount] = []
    env: dict[str, str] = {}
    skipped: list[str] = []
    _apply_edits(spec.get("containerEdits") or {}, devices, mounts, env, skipped)
    named = {str(d.get("name")): d for d in spec.get("devices") or ()}
    for index in gpus:
        device = named.get(str(index))
        if device is not None:
            _apply_edits(device.get("containerEdits") or {}, devices, mounts, env, skipped)
    return devices, mounts, env, skipped


def gpu_devices(gpus: Sequence[int], dev_root: str) -> list[Mount]:
    """The task's own GPU device nodes and the control devices this node has (no CDI spec)."""
    names = [f"nvidia{i}" for i in gpus] + list(NVIDIA_CONTROL)
    return [Mount(os.path.join(dev_root, n), f"/dev/{n}") for n in names if os.path.exists(os.path.join(dev_root, n))]


#: The driver libraries found in each set of lib dirs: lib dirs -> (their modification times when
#: scanned, the libraries). Installing or removing a driver adds or removes files there, which
#: changes the times; an unchanged stamp spares the scan (a few ms of the worker's main loop for
#: each task with GPUs, in a lib dir of 1,500 files). Only the main loop's task starts use it.
_driver_libs: dict[tuple[str, ...], tuple[tuple[int, ...], tuple[Mount, ...]]] = {}
#: How old a lib dir's modification time must be for a scan of it to be kept (ns).
SETTLED_NS = 2_000_000_000


def _mtimes(dirs: Sequence[str]) -> tuple[int, ...]:
    out = []
    for directory in dirs:
        try:
            out.append(os.stat(directory).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


def driver_mounts(lib_dirs: Sequence[str] = HOST_LIB_DIRS) -> list[Mount]:
    """The host's NVIDIA driver libraries and nvidia-smi, read-only where NGC images look for them
    (the lib dirs scanned again only when one changed)."""
    key, stamp = tuple(lib_dirs), _mtimes(lib_dirs)
    known = _driver_libs.get(key)
    if known is None or known[0] != stamp:
        known = (stamp, tuple(_scan_driver_libs(lib_dirs)))
        # A directory's time moves in clock ticks: one changed again within the tick of this scan
        # would keep its time, so a scan is kept only once its directories' times are settled.
        if max(stamp) < time.time_ns() - SETTLED_NS:
            _driver_libs[key] = known
    out = list(known[1])
    smi = shutil.which("nvidia-smi")
    if out and smi:
        out.append(Mount(smi, f"{DRIVER_BIN_DIR}/nvidia-smi", True))
    return out


def _scan_driver_libs(lib_dirs: Sequence[str]) -> list[Mount]:
    seen: dict[str, Mount] = {}
    for directory in lib_dirs:
        for pattern in DRIVER_LIB_PATTERNS:
            for path in sorted(glob.glob(os.path.join(directory, pattern))):
                name = os.path.basename(path)
                if name not in seen and os.path.isfile(path):
                    seen[name] = Mount(path, f"{DRIVER_LIB_DIR}/{name}", True)
    return list(seen.values())


def plan(*, task_dir: Path, image_root: str, image_env: Iterable[str] | Mapping[str, str], working_dir: str,
         entrypoint: Sequence[str], cmd: Sequence[str], command: Sequence[str], task_env: Mapping[str, str],
         gpus: Sequence[int], mounts: Sequence[Mount], allowed_mounts: Sequence[str],
         cdi_specs: Sequence[Mapping[str, Any]], dev_root: str = "/dev",
         lib_dirs: Sequence[str] = HOST_LIB_DIRS, user: str = "") -> ContainerSpec:
    """The container a task runs in; ContainerRefused when the worker will not run it as asked."""
    argv = argv_of(command, entrypoint, cmd)
    for m in mounts:
        why = allowed_mount(m.source, m.target, allowed_mounts)
        if why:
            raise ContainerRefused(why)
    env = env_of(image_env)
    env.setdefault("PATH", DEFAULT_PATH)
    devices: list[Mount] = []
    extra: list[Mount] = []
    skipped: list[str] = []
    if gpus:
        cdi = cdi_gpu_edits(cdi_specs, gpus)
        if cdi is not None:
            devices, extra, cdi_env, skipped = cdi
            env.update(cdi_env)
        else:
            devices = gpu_devices(gpus, dev_root)
            extra = driver_mounts(lib_dirs)
            if extra:
                paths = env.get("LD_LIBRARY_PATH", "")
                if DRIVER_LIB_DIR not in paths.split(":"):
                    env["LD_LIBRARY_PATH"] = f"{paths}:{DRIVER_LIB_DIR}" if paths else DRIVER_LIB_DIR
    env.update(task_env)
    return ContainerSpec(
        image_root=image_root, upper=str(task_dir / "upper"), work=str(task_dir / "work"),
        rootfs=str(task_dir / "rootfs"), end_file=str(task_dir / "end.marshal"), argv=argv, env=env,
        cwd=working_dir or "/", devices=tuple(devices), mounts=tuple(extra) + tuple(mounts), skipped=tuple(skipped),
        user=user)


def prepare(task_dir: Path, spec: ContainerSpec) -> Path:
    """Make the task's directories and write its spec; the path the sandbox reads. The format is
    `marshal`'s (the sandbox loads it without importing json: see sandbox.py); to read one,
    `python3 -c 'import marshal, pprint, sys; pprint.pprint(marshal.load(open(sys.argv[1], "rb")))' SPEC`."""
    drop(task_dir)
    for name in ("upper", "work", "rootfs"):
        (task_dir / name).mkdir(parents=True, exist_ok=True)
    # The task sees the overlay's root with the upper dir's mode, and the worker's umask made it 0700:
    # a task running as the image's non-root User could not even look in /.
    os.chmod(task_dir / "upper", 0o755)
    path = task_dir / "spec.marshal"
    path.write_bytes(marshal.dumps(spec.to_dict()))
    return path


def end_of(task_dir: Path) -> tuple[str, str] | None:
    """(cause, detail) the sandbox left when it refused or could not exec the task, or None."""
    try:
        data = marshal.loads((task_dir / "end.marshal").read_bytes())
    except (OSError, ValueError, EOFError, TypeError):  # none written (the task ran), or torn
        try:  # a task a worker before the marshal format started, still running across the upgrade
            data = json.loads((task_dir / "end.json").read_text())
        except (OSError, ValueError):
            return None
    if not isinstance(data, dict) or not data.get("cause"):
        return None
    return str(data["cause"]), str(data.get("detail", ""))


def drop(task_dir: Path) -> None:
    """Remove a task's writable layer and files (its mounts went with its mount namespace)."""
    shutil.rmtree(task_dir, ignore_errors=True)
