"""Job specs: parsing a job document and validating a spec, with errors that name the field and why.

The same checks guard every entry point: `synctl submit` runs them before sending (reading the
file is `synapse.client.jobfile`), and the master runs `check_spec` on every SubmitJob request, so
a bad job never reaches the replicated log.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from synapse.core.jobs import dependencies, imageref
from synapse.core.jobs.arrays import MAX_ARRAY_SIZE, ArraySpecError, format_ranges, parse_array
from synapse.core.jobs.quantity import QuantityError, parse_cpu, parse_duration, parse_memory
from synapse.core.model import CheckpointSpec, JobSpec, PackMode, Queue, Resources, TopologySpec
from synapse.core.queues import queue_name_problem

#: Limits on what one job may carry; they keep the log and the API's messages small.
MAX_NAME = 63
MAX_TASKS = 100_000
MAX_GPUS_PER_TASK = 1024
MAX_COMMAND_ARGS = 1024
MAX_ARG_CHARS = 8192
MAX_ENV_ENTRIES = 512
MAX_ENV_CHARS = 8192
MAX_RESTARTS = 1000
MAX_PRIORITY = 1_000_000
MAX_IMAGE_CHARS = 1024
MAX_MOUNTS = 64
#: Limits on a job's secrets: how many, and the longest value (a key or a certificate chain fits).
MAX_SECRETS = 32
MAX_SECRET_CHARS = 16384
#: The least memory a task may ask for: a worker confines each task to what it asked, and below this
#: even the task's shim and a small process are OOM-killed at once (Docker's floor is 6 MB).
MIN_TASK_MEMORY = 8 << 20
MAX_GPU_MODEL_CHARS = 63
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIELDS = {"name", "tasks", "resources", "command", "env", "topology", "priority", "max_restarts",
           "time_limit", "image", "queue", "grace", "gpu_model", "array", "after", "singleton", "on_unsatisfiable",
           "resize_interval", "checkpoint", "mounts", "image_pull_timeout", "secrets", "interactive"}
#: The signals a checkpoint notice may be, spelled as `kill -l` gives them without SIG: those a task
#: can trap and whose default is not to stop or core-dump a process it did not expect (the task
#: shim, shim.sh, outlives every one of them). A job file may write SIGUSR1 or usr1 too.
NOTICE_SIGNALS = ("HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM", "URG", "WINCH", "XCPU", "XFSZ", "VTALRM",
                  "PROF")
#: The longest checkpoint notice (as for `grace`).
MAX_NOTICE_S = 86400.0


class JobFileError(ValueError):
    """A job file or spec that cannot be accepted; `field` names where."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


def _int(doc: dict[str, Any], field: str, default: int, low: int, high: int, path: str = "") -> int:
    value = doc.get(field, default)
    name = path or field
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobFileError(name, f"must be a whole number, not {value!r}")
    if not low <= value <= high:
        raise JobFileError(name, f"must be between {low} and {high}, not {value}")
    return value


def notice_signal(value: Any) -> str:
    """A checkpoint notice's signal as NOTICE_SIGNALS spells it, from `USR1`, `SIGUSR1` or `usr1`;
    raises ValueError saying why a value is not one."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"must be a signal name such as USR1, not {value!r} (signal numbers differ between systems)")
    name = value.strip().upper().removeprefix("SIG")
    if name in NOTICE_SIGNALS:
        return name
    if name in ("KILL", "STOP"):
        raise ValueError(f"SIG{name} cannot be trapped, so the task could save nothing; give one it can trap, "
                         "such as USR1")
    raise ValueError(f"{value!r} is not a signal a notice may be (one of {', '.join(NOTICE_SIGNALS)})")


def _checkpoint(doc: Any) -> CheckpointSpec:
    """`checkpoint: {signal: USR1, notice: 2m}` (absent: no notice)."""
    if doc is None:
        return CheckpointSpec()
    if not isinstance(doc, dict):
        raise JobFileError("checkpoint", "must be a mapping such as {signal: USR1, notice: 2m}")
    bad = sorted(set(map(str, doc)) - {"signal", "notice"})
    if bad:
        raise JobFileError(f"checkpoint.{bad[0]}", "unknown field (known: signal, notice)")
    if doc.get("signal") is None or doc.get("notice") is None:
        raise JobFileError("checkpoint", "give both the signal and the notice, e.g. {signal: USR1, notice: 2m}")
    try:
        name = notice_signal(doc["signal"])
    except ValueError as exc:
        raise JobFileError("checkpoint.signal", str(exc)) from None
    try:
        notice = parse_duration(doc["notice"])
    except QuantityError as exc:
        raise JobFileError("checkpoint.notice", str(exc)) from None
    return CheckpointSpec(name, notice)


def _duration(doc: dict[str, Any], field: str) -> float:
    """A duration field such as `2h` or `90s` (absent: 0)."""
    try:
        return parse_duration(doc[field]) if doc.get(field) is not None else 0.0
    except QuantityError as exc:
        raise JobFileError(field, str(exc)) from None


def _tasks(doc: dict[str, Any]) -> tuple[int, int]:
    """`tasks: N`, or an elastic gang's `{min: N, max: M}`: (tasks, tasks_min; 0 for a fixed gang)."""
    tasks_doc = doc.get("tasks", 1)
    if not isinstance(tasks_doc, dict):
        return _int(doc, "tasks", 1, 1, MAX_TASKS), 0
    bad = sorted(set(map(str, tasks_doc)) - {"min", "max"})
    if bad or "max" not in tasks_doc or "min" not in tasks_doc:
        raise JobFileError("tasks", "an elastic gang is {min: N, max: M}")
    tasks_min = _int(tasks_doc, "min", 1, 1, MAX_TASKS, "tasks.min")
    tasks = _int(tasks_doc, "max", 1, 1, MAX_TASKS, "tasks.max")
    if tasks_min > tasks:
        raise JobFileError("tasks.min", f"must not be above tasks.max ({tasks_min} > {tasks})")
    return tasks, tasks_min if tasks_min < tasks else 0


def _resources(doc: dict[str, Any]) -> Resources:
    """`resources: {cpu: 4, memory: 16Gi, gpu: 1}` (cpu 1, memory 0, gpu 0 unless given)."""
    resources = doc.get("resources", {}) or {}
    if not isinstance(resources, dict):
        raise JobFileError("resources", "must be a mapping such as {cpu: 4, memory: 16Gi, gpu: 1}")
    bad = sorted(set(map(str, resources)) - {"cpu", "memory", "gpu"})
    if bad:
        raise JobFileError(f"resources.{bad[0]}", "unknown resource (known: cpu, memory, gpu)")
    try:
        cpu = parse_cpu(resources.get("cpu", 1))
    except QuantityError as exc:
        raise JobFileError("resources.cpu", str(exc)) from None
    try:
        memory = parse_memory(resources.get("memory", 0))
    except QuantityError as exc:
        raise JobFileError("resources.memory", str(exc)) from None
    return Resources(cpu, memory, _int(resources, "gpu", 0, 0, MAX_GPUS_PER_TASK, "resources.gpu"))


def _command(doc: dict[str, Any]) -> tuple[str, ...]:
    """`command:` as a list or a shell-like string; none at all only where an image names its entrypoint."""
    command = doc.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if command is None and doc.get("image"):
        command = []  # the image's Entrypoint and Cmd run
    if not isinstance(command, list) or not (command or doc.get("image")) \
            or not all(isinstance(a, str | int | float) for a in command):
        raise JobFileError("command", "is required (unless an image names its entrypoint): a list of strings "
                                      "such as [python, train.py]")
    return tuple(str(a) for a in command)


def _topology(doc: dict[str, Any]) -> TopologySpec:
    """`topology: {pack: rack, mode: preferred}` (absent: no packing level, preferred)."""
    topology = doc.get("topology", {}) or {}
    if not isinstance(topology, dict):
        raise JobFileError("topology", "must be a mapping such as {pack: rack, mode: preferred}")
    bad = sorted(set(map(str, topology)) - {"pack", "mode"})
    if bad:
        raise JobFileError(f"topology.{bad[0]}", "unknown field (known: pack, mode)")
    mode_text = str(topology.get("mode", "preferred"))
    try:
        mode = PackMode(mode_text)
    except ValueError:
        raise JobFileError("topology.mode", f"must be preferred or required, not {mode_text!r}") from None
    return TopologySpec(str(topology.get("pack", "") or ""), mode)


def _array(doc: dict[str, Any]) -> tuple[str, int]:
    """`array: 0-99%10` as (its ranges, written canonically; its throttle), ("", 0) if absent."""
    if doc.get("array") is None:
        return "", 0
    try:
        ranges, throttle = parse_array(str(doc["array"]))
    except ArraySpecError as exc:
        raise JobFileError("array", str(exc)) from None
    return format_ranges(ranges), throttle


def parse_job(doc: Any, levels: tuple[str, ...] = ("zone", "block", "rack")) -> JobSpec:
    """A JobSpec from a parsed job file (a mapping); raises JobFileError naming the field (the first
    wrong field in the order below)."""
    if not isinstance(doc, dict):
        raise JobFileError("(file)", "a job file must be a YAML mapping of fields")
    unknown = sorted(set(map(str, doc)) - _FIELDS)
    if unknown:
        raise JobFileError(unknown[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise JobFileError("name", "is required and must be a string")
    tasks, tasks_min = _tasks(doc)
    resize_interval = _duration(doc, "resize_interval")
    resources = _resources(doc)
    command = _command(doc)
    env = doc.get("env", {}) or {}
    if not isinstance(env, dict):
        raise JobFileError("env", "must be a mapping of NAME: value")
    topology = _topology(doc)
    time_limit = _duration(doc, "time_limit")
    image = doc.get("image", "") or ""
    if not isinstance(image, str):
        raise JobFileError("image", "must be a string")
    grace = _duration(doc, "grace")
    queue = doc.get("queue", "") or ""
    if not isinstance(queue, str):
        raise JobFileError("queue", "must be a queue name")
    gpu_model = doc.get("gpu_model", "") or ""
    if not isinstance(gpu_model, str | int):
        raise JobFileError("gpu_model", "must be a GPU model such as H100")
    array, throttle = _array(doc)
    try:
        after = dependencies.parse_after(doc.get("after"))
    except ValueError as exc:
        raise JobFileError("after", str(exc)) from None
    singleton = doc.get("singleton", False)
    if not isinstance(singleton, bool):
        raise JobFileError("singleton", "must be true or false")
    on_unsatisfiable = doc.get("on_unsatisfiable", "") or ""
    interactive = doc.get("interactive", False)
    if not isinstance(interactive, bool):
        raise JobFileError("interactive", "must be true or false")
    if interactive and array:
        raise JobFileError("interactive", "an interactive job cannot be an array")
    spec = JobSpec(
        name=name, tasks=tasks, resources=resources, command=command,
        env=tuple(sorted((str(k), str(v)) for k, v in env.items())), topology=topology,
        priority=_int(doc, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
        max_restarts=_int(doc, "max_restarts", 0, 0, MAX_RESTARTS),
        time_limit=time_limit, image=image, queue=queue, grace=grace, gpu_model=str(gpu_model), array=array,
        array_throttle=throttle, after=after, singleton=singleton, on_unsatisfiable=str(on_unsatisfiable),
        tasks_min=tasks_min, resize_interval=resize_interval, checkpoint=_checkpoint(doc.get("checkpoint")),
        mounts=_mounts(doc.get("mounts")), image_pull_timeout=_pull_timeout(doc.get("image_pull_timeout")),
        interactive=interactive)
    check_spec(spec, levels)
    return spec


def secret_refs(doc: Any) -> tuple[tuple[str, str], ...]:
    """The job file's `secrets:` ({NAME: ref}) as (name, ref) pairs, sorted; what a ref names is
    read by the client that submits (synapse.client.jobfile), never by the masters."""
    if not isinstance(doc, dict):
        raise JobFileError("(file)", "a job file must be a YAML mapping of fields")
    refs = doc.get("secrets") or {}
    if not isinstance(refs, dict):
        raise JobFileError("secrets", "must be a mapping of NAME: file:PATH or env:VARIABLE")
    for name, ref in refs.items():
        if not isinstance(ref, str) or not ref.strip():
            raise JobFileError(f"secrets.{name}", f"must be file:PATH or env:VARIABLE, not {ref!r}")
    pairs = tuple(sorted((str(k), str(v)) for k, v in refs.items()))
    check_secret_names(tuple(name for name, _ in pairs), _env_names(doc))
    return pairs


def _env_names(doc: dict[str, Any]) -> tuple[str, ...]:
    env = doc.get("env") or {}
    return tuple(map(str, env)) if isinstance(env, dict) else ()


def check_secret_names(names: tuple[str, ...], env_names: tuple[str, ...]) -> None:
    """Raise JobFileError if a job's secret names break a rule: each a variable name, not also in
    its env, at most MAX_SECRETS."""
    if len(names) > MAX_SECRETS:
        raise JobFileError("secrets", f"has more than {MAX_SECRETS} entries")
    for name in names:
        if not _ENV_KEY_RE.match(name):
            raise JobFileError(f"secrets.{name}", "is not a valid variable name")
        if name in env_names:
            raise JobFileError(f"secrets.{name}", "is also in env: a variable is one or the other")
    if len(set(names)) != len(names):
        raise JobFileError("secrets", "names a variable twice")


def check_secret_value(name: str, value: str) -> None:
    """Raise JobFileError if a secret's value cannot be given as an environment variable."""
    if "\0" in value:
        raise JobFileError(f"secrets.{name}", "holds a NUL byte, which no environment variable can")
    if len(value) > MAX_SECRET_CHARS:
        raise JobFileError(f"secrets.{name}", f"is longer than {MAX_SECRET_CHARS} characters")


def check_spec(spec: JobSpec, levels: tuple[str, ...] = ("zone", "block", "rack"),
               max_array_size: int = MAX_ARRAY_SIZE) -> None:
    """Raise JobFileError if a spec (from a file, flags or an RPC) breaks any rule or limit."""
    if not spec.name or len(spec.name) > MAX_NAME or not _NAME_RE.match(spec.name):
        raise JobFileError("name", f"must be 1-{MAX_NAME} characters of letters, digits, '.', '_' or '-', "
                                   f"starting with a letter or digit, not {spec.name!r}")
    if not 1 <= spec.tasks <= MAX_TASKS:
        raise JobFileError("tasks", f"must be between 1 and {MAX_TASKS}, not {spec.tasks}")
    r = spec.resources
    if r.cpu < 0 or r.memory < 0 or r.gpu < 0:
        raise JobFileError("resources", "must not be negative")
    if r.gpu > MAX_GPUS_PER_TASK:
        raise JobFileError("resources.gpu", f"must be at most {MAX_GPUS_PER_TASK}")
    if r == Resources():
        raise JobFileError("resources", "a task must ask for some cpu, memory or gpu")
    if 0 < r.memory < MIN_TASK_MEMORY:
        raise JobFileError("resources.memory", f"{r.memory} bytes is below {MIN_TASK_MEMORY >> 20}Mi, the least a "
                                               "worker can confine a task to")
    if not (spec.command or spec.image or spec.alloc) or len(spec.command) > MAX_COMMAND_ARGS:
        raise JobFileError("command", f"must have 1 to {MAX_COMMAND_ARGS} arguments (none only with an image, "
                                      "or for an allocation)")
    if spec.alloc and (spec.command or spec.image):
        raise JobFileError("command", "an allocation runs nothing itself: its steps run the commands")
    if spec.idle_timeout < 0 or (spec.idle_timeout and not spec.alloc):
        raise JobFileError("idle_timeout", "an allocation's only, and not negative")
    if any(len(a) > MAX_ARG_CHARS for a in spec.command):
        raise JobFileError("command", f"an argument is longer than {MAX_ARG_CHARS} characters")
    if len(spec.env) > MAX_ENV_ENTRIES:
        raise JobFileError("env", f"has more than {MAX_ENV_ENTRIES} entries")
    for key, value in spec.env:
        if not _ENV_KEY_RE.match(key):
            raise JobFileError(f"env.{key}", "is not a valid variable name")
        if len(key) + len(value) > MAX_ENV_CHARS:
            raise JobFileError(f"env.{key}", f"is longer than {MAX_ENV_CHARS} characters")
    if spec.topology.pack and spec.topology.pack not in (*levels, "node"):
        raise JobFileError("topology.pack", f"must be one of {', '.join((*levels, 'node'))}, "
                                            f"not {spec.topology.pack!r}")
    if not 0 <= spec.max_restarts <= MAX_RESTARTS:
        raise JobFileError("max_restarts", f"must be between 0 and {MAX_RESTARTS}")
    if abs(spec.priority) > MAX_PRIORITY:
        raise JobFileError("priority", f"must be between {-MAX_PRIORITY} and {MAX_PRIORITY}")
    if not 0 <= spec.time_limit <= 366 * 86400 or spec.time_limit != spec.time_limit:
        raise JobFileError("time_limit", "must be between 0 and 366 days")
    if len(spec.image) > MAX_IMAGE_CHARS:
        raise JobFileError("image", f"is longer than {MAX_IMAGE_CHARS} characters")
    if spec.image:
        try:
            imageref.parse(spec.image)
        except imageref.ImageRefError as exc:
            raise JobFileError("image", str(exc)) from None
    if not 0 <= spec.grace <= 86400 or spec.grace != spec.grace:
        raise JobFileError("grace", "must be between 0 and 1 day")
    if spec.gpu_model and (len(spec.gpu_model) > MAX_GPU_MODEL_CHARS or not _MODEL_RE.match(spec.gpu_model)):
        raise JobFileError("gpu_model", f"must be a GPU model such as H100 (letters, digits, '.', '_' or '-', up to "
                                        f"{MAX_GPU_MODEL_CHARS}), not {spec.gpu_model!r}")
    if spec.queue and queue_name_problem(spec.queue):
        raise JobFileError("queue", queue_name_problem(spec.queue))
    check_secret_names(tuple(x.name for x in spec.secrets), tuple(key for key, _ in spec.env))
    check_checkpoint(spec)
    check_mounts(spec)
    check_workflow(spec, max_array_size)


def _mounts(value: object) -> tuple[tuple[str, str, bool], ...]:
    """The job file's `mounts:` ([{source, target, readonly}]) as (source, target, readonly)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JobFileError("mounts", "must be a list such as [{source: /data/set, target: /data, readonly: true}]")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or set(map(str, m)) - {"source", "target", "readonly"}:
            raise JobFileError(f"mounts[{i}]", "must be a mapping of source, target and readonly")
        source, target, readonly = m.get("source"), m.get("target", m.get("source")), m.get("readonly", False)
        if not isinstance(source, str) or not isinstance(target, str) or not isinstance(readonly, bool):
            raise JobFileError(f"mounts[{i}]", "source and target must be paths, readonly true or false")
        out.append((source, target, readonly))
    return tuple(out)


def _pull_timeout(value: object) -> float:
    if value is None:
        return 0.0
    if not isinstance(value, int | float | str):
        raise JobFileError("image_pull_timeout", f"must be a duration such as 10m, not {value!r}")
    try:
        return parse_duration(value)
    except QuantityError as exc:
        raise JobFileError("image_pull_timeout", str(exc)) from None


def check_mounts(spec: JobSpec) -> None:
    """Raise JobFileError if a spec's mounts are plainly wrong: no image, a relative path, a `..`,
    too many. Whether a worker allows a source is its own admin's call (--allow-mount)."""
    if spec.image_pull_timeout and not spec.image:
        raise JobFileError("image_pull_timeout", "needs an image")
    if not 0 <= spec.image_pull_timeout <= 86400 or spec.image_pull_timeout != spec.image_pull_timeout:
        raise JobFileError("image_pull_timeout", "must be between 0 and 1 day")
    if not spec.mounts:
        return
    if not spec.image:
        raise JobFileError("mounts", "need an image: a task without one sees the node's files already")
    if len(spec.mounts) > MAX_MOUNTS:
        raise JobFileError("mounts", f"at most {MAX_MOUNTS}")
    for i, (source, target, _) in enumerate(spec.mounts):
        for what, path in (("source", source), ("target", target)):
            if not path.startswith("/") or len(path) > MAX_ARG_CHARS:
                raise JobFileError(f"mounts[{i}].{what}", f"must be an absolute path, not {path!r}")
            if ".." in path.split("/") or any(ord(ch) < 0x20 for ch in path) or "," in path or ":" in path:
                raise JobFileError(f"mounts[{i}].{what}", f"{path!r}: '..', ',', ':' and control characters "
                                                          "are not allowed")


def check_checkpoint(spec: JobSpec) -> None:
    """Raise JobFileError if a spec's checkpoint notice breaks a rule: a signal of NOTICE_SIGNALS
    with a notice above 0, no longer than a day nor than the job's time_limit (the notice would
    then come before the job starts). A queue's max_grace caps it without refusing it."""
    signal, notice = spec.checkpoint.signal, spec.checkpoint.notice
    if not signal:
        if notice:
            raise JobFileError("checkpoint.signal", "a notice needs a signal, e.g. {signal: USR1, notice: 2m}")
        return
    if signal not in NOTICE_SIGNALS:
        raise JobFileError("checkpoint.signal", f"{signal!r} is not a signal a notice may be (one of "
                                                f"{', '.join(NOTICE_SIGNALS)})")
    if not 0 < notice <= MAX_NOTICE_S:  # also refuses NaN
        raise JobFileError("checkpoint.notice", "must be above 0 and at most 1 day")
    if spec.time_limit and notice > spec.time_limit:
        raise JobFileError("checkpoint.notice", f"{notice:g}s is longer than the job's time_limit of "
                                                f"{spec.time_limit:g}s: the notice would come before the job "
                                                "starts; give a shorter notice or a longer time_limit")


def notice_capped(spec: JobSpec, queue: Queue | None) -> str:
    """What a submission is told when its queue's max_grace caps its checkpoint notice ('' if not)."""
    if queue is None or queue.capped(spec.checkpoint.notice) >= spec.checkpoint.notice:
        return ""
    return (f"checkpoint.notice {spec.checkpoint.notice:g}s is longer than queue {queue.name}'s max_grace of "
            f"{queue.max_grace:g}s: the tasks get {queue.max_grace:g}s of notice")


def check_workflow(spec: JobSpec, max_array_size: int = MAX_ARRAY_SIZE) -> None:
    """Raise JobFileError if a spec's array or dependencies break a rule (what the state says of
    the jobs they name is checked by the master)."""
    if spec.array:
        if "%" in spec.array:
            raise JobFileError("array", "give the throttle apart from the index spec")
        try:
            parse_array(spec.array, max_array_size)
        except ArraySpecError as exc:
            raise JobFileError("array", str(exc)) from None
    if spec.array_throttle < 0 or (spec.array_throttle and not spec.array):
        raise JobFileError("array", "a throttle (%N) needs an index spec, and must be at least 1")
    problem = dependencies.after_problem(spec.after)
    if problem:
        raise JobFileError("after", problem)
    if spec.on_unsatisfiable not in ("", *dependencies.ON_UNSATISFIABLE):
        raise JobFileError("on_unsatisfiable", f"must be fail or wait, not {spec.on_unsatisfiable!r}")
    if spec.tasks_min < 0 or spec.tasks_min > spec.tasks:
        raise JobFileError("tasks.min", f"must be between 1 and tasks.max ({spec.tasks}), not {spec.tasks_min}")
    if not 0 <= spec.resize_interval <= 366 * 86400 or spec.resize_interval != spec.resize_interval:
        raise JobFileError("resize_interval", "must be between 0 and 366 days")

