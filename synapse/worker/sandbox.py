"""The container launcher: runs one task's command inside its image, run by the shim.

    python3 -I -S -c 'import os, sys; sys.path.append(sys.argv[1]); …' DIR SPEC (runtime.SANDBOX_LAUNCH)
    python3 -I -S sandbox.py SPEC                                               (the same, compiled each time)

`enter` is the other way in: `synctl exec` into a running task (synapse.worker.attach).

`SPEC` is what `synapse.worker.container.plan` decided for the task, as `container.prepare` wrote
it: the image's root, the task's writable layer, its argv, env and working directory, the devices
and bind mounts it gets. This file keeps no state (everything it needs is in the spec) and imports
only what a bare interpreter starts with, plus ctypes: its start is on every contained task's
start path, where each library module costs CPU time (json, platform and signal's enums cost
about 12 ms of CPU per start, more than all the rest of the sandbox's work; ctypes' 2 ms are kept
rather than binding libc through its private C core). That is also why the spec and the end
file are in `marshal`'s format (the worker and the sandbox are the same interpreter) and why the
worker imports this file as a module, from its cached bytecode, instead of running it as a
script, which Python compiles anew every time.

Three processes, all in the shim's process group, so the worker's signals (a SIGTERM, a checkpoint
notice, a SIGKILL to the group) reach the task directly, as they reach a plain task:

* P0, in the worker's namespaces: unshares mount, pid, ipc and uts namespaces (and a user namespace,
  mapping the worker's uid to root, where the worker is not root), forks P1, and exits with P1's
  status. It catches (and ignores) every signal a task may be sent, so it outlives the task and
  the shim records the task's own status, not P0's death.
* P1, pid 1 of the new pid namespace: makes every mount private, mounts the overlay (the image's
  root read-only below, the task's upper and work directories above) on the task's root, then
  /proc, a minimal /dev (null, zero, full, random, urandom, tty, a private devpts, shm) with the
  task's devices, /sys read-only, the host's /etc/hosts and /etc/resolv.conf (the network is the
  host's), then the bind mounts; pivots into the root, detaches the old one, drops every
  capability but Docker's default set from the bounding set, sets no_new_privs, forks P2 and
  reaps until P2 has ended. As the namespace's init it must catch signals (an init without a
  handler never gets them); when it exits the kernel kills whatever is left in the namespace.
* P2 takes the image's User (a name or uid, with an optional group, looked up in the image's
  /etc/passwd and /etc/group) where the worker is root, and execs the task's command (PATH from
  the task's env). With a `gate_fd` in the spec (one end of a socket pair whose other end the
  worker keeps, inherited through the shim) it first waits there: the worker creates a held
  gang's sandboxes as soon as their image is on the node, and the gang's release only opens the
  gate (runc's create/start split), so no task of a gang pays for its sandbox's set-up after the
  gang was released. At the gate P2 says `r` (its set-up is done: the worker reports the task
  prepared only then, so the release does not race the set-up) and execs once it reads `g`; on
  anything else, EOF included (the worker discarded the task, or died), it ends with 125 without
  running the command. An inherited socket pair rather than a FIFO opened by path: the worker may
  open the gate before the sandbox has even started (a FIFO's byte is lost when it has no reader
  yet), and it carries the `r` back. Under a user namespace only root is mapped, so the User is not applied there (the
  task's log says so). A command that is not in the image ends
  with 127, one that cannot be executed with 126, and both leave their reason in the end file.

A setup step that fails writes `{"cause": "Error", "detail": ...}` to the spec's end file and ends
the task with 125 before the command runs. Nothing is mounted in the worker's own namespace: the
task's mounts, its overlay included, go away with its last process.

Why not bubblewrap or runc: Debian's bwrap 0.8 has no overlay options, and its monitor process
dies of the SIGTERM or checkpoint signal sent to the task's group, losing the task's own exit
status; runc wants a bundle, moves the task into a cgroup of its own beside the worker's, and
makes the command pid 1, which drops a SIGTERM it does not handle.
"""

from __future__ import annotations

import ctypes
import errno
import marshal
import os
import stat
import sys

TYPE_CHECKING = False  # typing itself is not imported at run time (see above)
if TYPE_CHECKING:
    import signal
    from types import FrameType
    from typing import Any
else:
    import _signal as signal  # signal without its enums (the same functions and constants)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME = 1024, 2048
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
#: Docker's default capabilities (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
#: SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP): the rest leave the
#: bounding set, so even a root task cannot mount, load modules or trace the host's processes.
KEPT_CAPS = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31})
#: The host's device nodes every task gets.
BASE_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: The signals P0 and P1 catch so that they outlive the task: every one that can be caught but
#: SIGCHLD, the real-time ones included (32 and 33 belong to the C library: catching them fails).
CAUGHT = [s for s in range(1, signal.NSIG) if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD)]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETUP_FAILED = 125


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


class SetupError(Exception):
    """A step that prepares the task's root failed; the message says which and why."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(code)}")


def _enc(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)),
           f"mount {source or fstype} on {target}")


def secure_join(root: str, path: str) -> str:
    """`path` inside `root`, following symlinks as the task will see them (an absolute link from the
    root, `..` never above it), so a link in the image cannot point a mount outside the root."""
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        here = os.path.join(root, *resolved, part)
        if os.path.islink(here):
            hops += 1
            if hops > 40:
                raise SetupError(f"{path}: too many symbolic links inside the image")
            link = os.readlink(here)
            if link.startswith("/"):
                resolved = []
            parts = [p for p in link.split("/") if p] + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def _make_target(root: str, target: str, directory: bool) -> str:
    """The host path of `target` in the task's root, created (as a directory or an empty file)."""
    path = secure_join(root, target)
    if directory:
        os.makedirs(path, exist_ok=True)
    elif not os.path.lexists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
    return path


def bind(root: str, source: str, target: str, readonly: bool) -> None:
    """Bind `source` (a host path) on `target` (a path inside the root), read-only if asked."""
    try:
        directory = stat.S_ISDIR(os.stat(source).st_mode)
    except OSError as exc:
        raise SetupError(f"mount {source}: {exc.strerror}") from None
    path = _make_target(root, target, directory)
    mount(source, path, None, MS_BIND | MS_REC)
    if readonly:
        # A remount must keep the flags the source's mount is locked with (inside a user namespace
        # dropping nosuid or nodev is refused).
        kept = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)


def make_dev(root: str, devices: list[dict[str, str]]) -> None:
    """A minimal /dev: a tmpfs with the host's basic device nodes and the task's devices bound in,
    the usual links, a private devpts and a /dev/shm."""
    dev = _make_target(root, "/dev", True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k")
    for name in BASE_DEVICES:
        bind(root, f"/dev/{name}", f"/dev/{name}", False)
    for device in devices:
        bind(root, device["source"], device["target"], False)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(link, os.path.join(dev, name))
    os.mkdir(os.path.join(dev, "pts"))
    mount("devpts", os.path.join(dev, "pts"), "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    os.mkdir(os.path.join(dev, "shm"))
    mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def prepare_root(spec: dict[str, Any], user_ns: bool) -> None:
    """Everything P1 does before the pivot: the overlay and the mounts inside it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = spec["rootfs"]
    options = f"lowerdir={spec['image_root']},upperdir={spec['upper']},workdir={spec['work']}"
    mount("overlay", root, "overlay", 0, options + (",userxattr" if user_ns else ""))
    mount("proc", _make_target(root, "/proc", True), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(root, spec.get("devices", []))
    sys_dir = _make_target(root, "/sys", True)
    mount("/sys", sys_dir, None, MS_BIND | MS_REC)
    locked = os.statvfs(sys_dir).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, sys_dir, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)
    for name in ("/etc/hosts", "/etc/resolv.conf"):
        if os.path.exists(name):
            bind(root, name, name, True)
    for m in spec.get("mounts", []):
        bind(root, m["source"], m["target"], bool(m.get("readonly")))
    os.makedirs(secure_join(root, spec.get("cwd") or "/"), exist_ok=True)


def pivot(root: str) -> None:
    """Make `root` the root of this mount namespace, and let the old one go."""
    machine = os.uname().machine
    number = SYS_PIVOT_ROOT.get(machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {machine}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def drop_privileges() -> None:
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in KEPT_CAPS:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _ignore(signum: int, frame: FrameType | None) -> None:
    pass


def _catch_all() -> None:
    for sig in CAUGHT:
        try:
            signal.signal(sig, _ignore)
        except (OSError, ValueError):
            pass


def _status(wait_status: int) -> int:
    """A shell's reading of a wait status: the exit code, or 128+N for signal N."""
    return os.waitstatus_to_exitcode(wait_status) if os.WIFEXITED(wait_status) else 128 + os.WTERMSIG(wait_status)


def _write_end(fd: int, cause: str, detail: str) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, marshal.dumps({"cause": cause, "detail": detail}), 0)
    except OSError:
        pass


def _entries(path: str) -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.rstrip("\n").split(":") for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def resolve_user(user: str) -> tuple[int, int, str] | None:
    """(uid, gid, home) of an image's User (`name`, `uid`, `name:group`, `uid:gid`), read from the
    image's /etc/passwd and /etc/group (call inside the task's root); None for none (root)."""
    if not user:
        return None
    name, _, group = user.partition(":")
    passwd = _entries("/etc/passwd")
    entry = next((e for e in passwd if len(e) >= 6 and (e[0] == name or e[2] == name)), None)
    if entry is not None:
        uid, gid, home = int(entry[2]), int(entry[3]), entry[5]
    elif name.isdigit():
        uid, gid, home = int(name), int(name), "/"
    else:
        raise SetupError(f"user {name}: not in the image's /etc/passwd")
    if group:
        found = next((e for e in _entries("/etc/group") if len(e) >= 3 and (e[0] == group or e[2] == group)), None)
        if found is not None:
            gid = int(found[2])
        elif group.isdigit():
            gid = int(group)
        else:
            raise SetupError(f"group {group}: not in the image's /etc/group")
    return uid, gid, home


def _pass_gate(gate_fd: int, end_fd: int) -> None:
    """P2 (signals still caught, so a closed socket's SIGPIPE does not kill it): say the set-up is
    done, wait until the worker opens the task's gate (`g`); anything else ends the task unrun."""
    try:
        os.write(gate_fd, b"r")
    except OSError:
        pass  # the worker no longer listens (it opened the gate before the set-up was done, or left)
    try:
        got = os.read(gate_fd, 1)
    except OSError:
        got = b""
    if got != b"g":
        _write_end(end_fd, "Error", "the task's gate was closed without starting it")
        os._exit(SETUP_FAILED)
    os.close(gate_fd)


def _exec_task(spec: dict[str, Any], end_fd: int, user: tuple[int, int, str] | None, gate_fd: int = -1) -> None:
    """P2: become the task's command once its gate (if it has one) opens (never returns)."""
    if gate_fd >= 0:
        _pass_gate(gate_fd, end_fd)
    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    env = dict(spec["env"])
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", user[2] if user else "/root")
    argv = spec["argv"]
    try:
        if user is not None:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
        os.chdir(spec.get("cwd") or "/")
        _execvpe(argv, env)
    except FileNotFoundError:
        _write_end(end_fd, "CommandNotFound", f"{argv[0]}: no such command in the image")
        os.write(2, f"synapse: {argv[0]}: no such command in the image\n".encode())
        os._exit(127)
    except OSError as exc:
        _write_end(end_fd, "Error", f"{argv[0]}: cannot be run in the image: {exc.strerror}")
        os.write(2, f"synapse: {argv[0]}: cannot be run: {exc.strerror}\n".encode())
        os._exit(126)


def _execvpe(argv: list[str], env: dict[str, str]) -> None:
    """execve `argv[0]` looked up on the task's PATH (os.execvpe would import modules that the
    task's root does not have)."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    last: OSError = FileNotFoundError(errno.ENOENT, "not found")
    for directory in env["PATH"].split(":"):
        try:
            os.execve(os.path.join(directory or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            last = exc
    raise last


def _init(spec: dict[str, Any], end_fd: int, user_ns: bool, gate_fd: int) -> int:
    """P1: prepare the root, start the task, reap until it has ended; its status."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        prepare_root(spec, user_ns)
        pivot(spec["rootfs"])
        user = resolve_user(spec.get("user", ""))
        if user is not None and user_ns and user[:2] != (0, 0):
            os.write(2, f"synapse: the image's User {spec['user']} is not applied: the worker is not root\n".encode())
            user = None
        drop_privileges()
    except (SetupError, OSError, ValueError) as exc:
        _write_end(end_fd, "Error", f"container setup failed: {exc}")
        os.write(2, f"synapse: container setup failed: {exc}\n".encode())
        return SETUP_FAILED
    _catch_all()
    child = os.fork()
    if child == 0:
        _exec_task(spec, end_fd, user, gate_fd)
    if gate_fd >= 0:
        os.close(gate_fd)  # P2 alone waits at the gate
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        if pid == child:
            return _status(status)


def _enter_user_namespace(uid: int, gid: int) -> None:
    """Map this process's uid and gid to root in the user namespace it just entered."""
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1\n")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny\n")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1\n")


def main(argv: list[str]) -> int:
    with open(argv[1], "rb") as f:
        spec = marshal.load(f)
    end_fd = os.open(spec["end_file"], os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    gate_fd = spec.get("gate_fd", -1)
    if gate_fd >= 0:
        try:  # the task's command must never inherit it
            os.set_inheritable(gate_fd, False)
        except OSError as exc:
            _write_end(end_fd, "Error", f"container setup failed: gate fd {gate_fd}: {exc.strerror}")
            return SETUP_FAILED
    user_ns = os.geteuid() != 0
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if user_ns else 0)
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(flags) != 0:
        detail = f"container setup failed: unshare: {os.strerror(ctypes.get_errno())}"
        _write_end(end_fd, "Error", detail)
        os.write(2, f"synapse: {detail}\n".encode())
        return SETUP_FAILED
    if user_ns:
        try:
            _enter_user_namespace(uid, gid)
        except OSError as exc:
            _write_end(end_fd, "Error", f"container setup failed: user namespace: {exc.strerror}")
            return SETUP_FAILED
    _catch_all()
    child = os.fork()
    if child == 0:
        os._exit(_init(spec, end_fd, user_ns, gate_fd))
    if gate_fd >= 0:
        os.close(gate_fd)
    return _wait(child)


def _wait(child: int) -> int:
    """A child's status once it has ended (SETUP_FAILED if it cannot be waited for)."""
    while True:
        try:
            pid, status = os.waitpid(child, 0)
        except ChildProcessError:
            return SETUP_FAILED
        if pid == child:
            return _status(status)


#: The namespaces an exec joins, in the order it joins them: the user namespace first (it grants
#: the rights to join the others), the mount namespace last (the task's /proc hides the rest).
ENTERED = (("user", CLONE_NEWUSER), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS), ("pid", CLONE_NEWPID),
           ("mnt", CLONE_NEWNS))


def enter(argv: list[str]) -> int:
    """`synctl exec` into a task in an image: `PID -- CMD [ARGS...]`, PID the task's process. Join
    its namespaces (its user namespace only when it has one of its own), its root and working
    directory, its user, its capability bounding set and no_new_privs, then run the command as a
    child in its pid namespace, with this process's environment (the task's, which the worker
    passes); the command's status. The worker has put this process in the task's cgroup already."""
    if len(argv) < 3 or argv[1] != "--":
        os.write(2, b"usage: sandbox enter PID -- CMD [ARGS...]\n")
        return SETUP_FAILED
    pid, command = argv[0], argv[2:]
    try:
        own_user = os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")
        fds = [(os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC), flag)
               for kind, flag in ENTERED if kind != "user" or own_user]
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        cwd = os.open(f"/proc/{pid}/cwd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        ids = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("Uid:", "Gid:")):
                    ids[line[:3]] = int(line.split()[1])
        for fd, flag in fds:
            _check(_libc.setns(fd, flag), f"join the task's namespace {flag:#x}")
            os.close(fd)
        os.fchdir(root)
        os.chroot(".")
        os.fchdir(cwd)
        drop_privileges()
        if not own_user and (ids["Uid"], ids["Gid"]) != (0, 0):
            os.setgroups([])
            os.setgid(ids["Gid"])
            os.setuid(ids["Uid"])
    except (SetupError, OSError, KeyError, ValueError) as exc:
        os.write(2, f"synapse: cannot enter the task: {exc}\n".encode())
        return SETUP_FAILED
    child = os.fork()
    if child == 0:
        env = dict(os.environ)
        env.setdefault("PATH", DEFAULT_PATH)
        try:
            _execvpe(command, env)
        except OSError as exc:
            os.write(2, f"synapse: {command[0]}: {exc.strerror}\n".encode())
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    _catch_all()  # the exec's signals are its command's
    return _wait(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
