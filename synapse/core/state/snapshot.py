"""Snapshots: a ClusterState as plain, JSON-able data and back. Pure.

`encode` writes only what apply keeps (nodes, jobs with their tasks and events, users, queues, holds,
replicas, cluster events and the counters); `decode` reads it back and rebuilds every derived index
(capacity index, pending queue, live tasks, queue usage, held nodes, token and request lookups) the
way apply keeps them. Records are written in a fixed order, so equal states give equal snapshots and
equal digests on every replica. The format is versioned (SNAPSHOT_VERSION); a snapshot of a version
it does not read (READABLE_VERSIONS) is refused, never guessed at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from synapse.core.jobs.arrays import JobArray
from synapse.core.model import (
    UNLIMITED,
    CheckpointSpec,
    ClusterEvent,
    Event,
    Hold,
    Job,
    JobSpec,
    JobStatus,
    JoinToken,
    Node,
    NodeStatus,
    PackMode,
    Progress,
    Queue,
    Resources,
    Role,
    Run,
    Secret,
    Task,
    TaskState,
    TopologySpec,
    User,
)
from synapse.core.schedule.fairshare import DecayedUsage
from synapse.core.schedule.predict import RunTimes

#: The version of the format `encode` writes. 2 added arrays, the final states of forgotten jobs
#: and the workflow and elastic fields of jobs: a release that reads only version 1 would drop them,
#: so it refuses a version-2 snapshot instead.
SNAPSHOT_VERSION = 2
#: The version written once the state holds what version 2 cannot read (a replicated cluster version,
#: a job's uncharged requeues, a checkpoint notice, a job's excluded nodes, a node's suspect record): a
#: version-2 release refuses it rather than drop them. A state without them encodes (and digests)
#: exactly as version 2 did, so replicas compare equal during an upgrade.
SNAPSHOT_VERSION_3 = 3
#: The version written once the state holds what command-set version 4 brought (a recorded
#: progress: a job's, or a run's checkpoint, RecordProgress; a spare node, SetSpares; a node's GPU
#: error, GpuFault; a job's mounts, pull timeout or no command, which runs its image's entrypoint; a
#: task prepared, TaskPrepared; learned run times, synapse.core.schedule.predict): a version-3 release refuses
#: it rather than drop them.
SNAPSHOT_VERSION_4 = 4
#: The version written once a job holds secrets (command-set version 6): a version-4 release refuses
#: it rather than drop them.
SNAPSHOT_VERSION_5 = 5
#: The version written once the state holds what command-set version 7 brought: an allocation or a
#: step, a held job, a job requeued or updated by its owner, an interactive spec, a queue's per-user
#: limits or interactive maximum. A version-5 release refuses it rather than drop them (it would run
#: an allocation's steps on resources its nodes no longer count, or place a held job).
SNAPSHOT_VERSION_6 = 6
#: The versions `decode` reads (an older snapshot holds none of a later version's records: they are
#: read at their defaults); any other is refused.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
#: A job's records of version 6 (allocations and steps; holds, owners' requeues and updates), written
#: only when set.
_VERSION_6_KEYS = frozenset({"alloc_id", "step_count", "idle_since", "held_by", "manual_requeues", "updates"})
#: A queue's records of version 6 (per-user limits, an interactive maximum), written only when set.
_QUEUE_VERSION_6_KEYS = frozenset({"user_gpu", "user_jobs", "interactive_max"})
#: A job's records of version 3, written only when set.
_VERSION_3_KEYS = frozenset({"requeues", "stop_notice", "notice_at", "excluded_nodes"})
#: A node's records of version 3, written only when set.
_NODE_VERSION_3_KEYS = frozenset({"suspect", "failures"})
#: A node's records of version 4, written only when set.
_NODE_VERSION_4_KEYS = frozenset({"spare", "gpu_error"})


def encode(state: Any) -> dict[str, Any]:
    """A ClusterState as plain data (JSON-able); its derived indexes are left out and rebuilt on load."""
    jobs = [_job_to_dict(j) for j in sorted(state.jobs.values(), key=lambda j: j.seq)]
    arrays = [_array_to_dict(a) for a in sorted(state.arrays.values(), key=lambda a: a.seq)]
    nodes = [_node_to_dict(n) for n in sorted(state.nodes.values(), key=lambda n: n.id)]
    v4 = any("progress" in j or any(len(r) > _RUN_V3_LEN for r in j["runs"]) for j in jobs) \
        or any(_NODE_VERSION_4_KEYS & set(n) for n in nodes) or len(state.run_times) > 0
    newer = state.cluster_version > 1 or any(_VERSION_3_KEYS & set(j) or "checkpoint" in j["spec"] for j in jobs) \
        or any("checkpoint" in a["spec"] for a in arrays) or any(_NODE_VERSION_3_KEYS & set(n) for n in nodes)
    images = any("mounts" in s or "image_pull_timeout" in s or not s["command"]
                 for s in [j["spec"] for j in jobs] + [a["spec"] for a in arrays]) \
        or any("prepared" in t for j in jobs for t in j["tasks"])
    secrets = any("secrets" in s for s in [j["spec"] for j in jobs] + [a["spec"] for a in arrays])
    queues = [_queue_to_dict(q) for _, q in sorted(state.queues.items())]
    v6 = any(_VERSION_6_KEYS & set(j) or "alloc" in j["spec"] or "interactive" in j["spec"] for j in jobs) \
        or any("interactive" in a["spec"] for a in arrays) or any(_QUEUE_VERSION_6_KEYS & set(q) for q in queues)
    return {
        "version": SNAPSHOT_VERSION_6 if v6 else SNAPSHOT_VERSION_5 if secrets
        else SNAPSHOT_VERSION_4 if v4 or images
        else SNAPSHOT_VERSION_3 if newer else SNAPSHOT_VERSION,
        "levels": list(state.levels),
        "applied": state.applied,
        "max_term": state.max_term, "job_seq": state.job_seq,
        "replicas": {k: list(v) for k, v in sorted(state.replicas.items())},
        "users": [_user_to_dict(u) for _, u in sorted(state.users.items())],
        "queues": queues,
        "event_seq": state.event_seq,
        "archive": [state.archive_seq, state.archived_upto, state.history_dropped],
        "decay": {"half_life": state.usage_half_life, "clock": state.usage_clock,
                  "queues": [[k, *v] for k, v in sorted(state.queue_decay.items())],
                  "users": [[k, *v] for k, v in sorted(state.user_decay.items())]},
        "cluster_events": [list(e) for e in state.cluster_events],
        "holds": [[h.job_id, h.attempt, list(h.nodes), list(h.victims), h.rule, h.at]
                  for _, h in sorted(state.holds.items())],
        "nodes": nodes,
        "jobs": jobs,
        "arrays": arrays,
        "finished": [[k, v] for k, v in state.finished.items()],  # oldest first: the order is kept


        # Only when there are any: a state without join tokens encodes (and digests) exactly as it did
        # before they existed, so replicas of both releases compare equal during an upgrade.
        **({"join_tokens": [_join_token_to_dict(t) for _, t in sorted(state.join_tokens.items())]}
           if state.join_tokens else {}),
        **({"cluster_version": state.cluster_version} if state.cluster_version > 1 else {}),
        # Learned run times (synapse.core.schedule.predict), only when there are any (from cluster version 4
        # on), least recently learned first; a snapshot with them is version 4.
        **({"run_times": state.run_times.to_list()} if len(state.run_times) else {}),
    }


def decode(data: dict[str, Any], new_state: Callable[[tuple[str, ...]], Any]) -> Any:
    """The state a snapshot holds, built on `new_state(levels)` (the ClusterState class: fsm imports
    this module, so this one may not import fsm), with its derived indexes rebuilt."""
    if data.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
    state = new_state(tuple(data["levels"]))
    state.applied, state.max_term, state.job_seq = data["applied"], data["max_term"], data["job_seq"]
    state.cluster_version = data.get("cluster_version", state.cluster_version)
    state.replicas = {k: (v[0], v[1]) for k, v in data.get("replicas", {}).items()}
    for qd in data.get("queues", []):
        queue = _queue_from_dict(qd)
        state.queues[queue.name] = queue
    state.event_seq = data.get("event_seq", 0)
    state.cluster_events.extend(ClusterEvent(*e) for e in data.get("cluster_events", []))
    for job_id, attempt, nodes, victims, rule, at in data.get("holds", []):
        state.holds[job_id] = Hold(job_id, attempt, tuple(nodes), tuple(victims), rule, at)
        for node_id in nodes:
            state.held_nodes[node_id] = job_id
    for ud in data.get("users", []):
        user = _user_from_dict(ud)
        state.users[user.name] = user
        state.user_by_token[user.token_hash] = user.name
    for td in data.get("join_tokens", []):
        token = JoinToken(**{**td, "nodes": tuple(td["nodes"])})
        state.join_tokens[token.id] = token
        state.join_token_by_hash[token.token_hash] = token.id
    for nd in data["nodes"]:
        node = _node_from_dict(nd)
        state.nodes[node.id] = node
        state.live_tasks[node.id] = set()
        if node.spare:
            state.spares = state.spares | {node.id}
        state.index.update(node)
        state._note_capacity(node.capacity)  # derived as apply keeps it, by apply's own code
    decay = data.get("decay", {})
    state.usage_half_life, state.usage_clock = decay.get("half_life", 0.0), decay.get("clock", 0.0)
    state.queue_decay = {k: DecayedUsage(*v) for k, *v in decay.get("queues", ())}
    state.user_decay = {k: DecayedUsage(*v) for k, *v in decay.get("users", ())}
    if "archive" in data:
        state.archive_seq, state.archived_upto, state.history_dropped = data["archive"]
    else:  # a snapshot from before history: number its finished jobs in the order they ended
        ended = sorted((j for j in data["jobs"] if JobStatus(j["status"]).terminal),
                       key=lambda j: (j["finished_at"], j["seq"]))
        for seq, jd in enumerate(ended, 1):
            jd["archive_seq"] = seq
        state.archive_seq = len(ended)
    for jd in data["jobs"]:
        job = _job_from_dict(jd)
        state.jobs[job.id] = job
        if job.status.terminal and not job.archived_at:
            state.unarchived[job.archive_seq] = job.id
        if job.request_id:
            state.job_by_request[job.request_id] = job.id
        if job.status is JobStatus.PENDING:
            state.pending.add((job.queue_key(), job.id))
        for task in job.tasks:
            if task.state.live:
                state.live_tasks[task.node_id].add(task.key)
                if task.holder < 0:  # a step's task uses its allocation's share (synapse.core.steps)
                    state._use(job, task.resources)  # the queue usage apply keeps, by apply's own code
    for ad in data.get("arrays", []):
        array = _array_from_dict(ad)
        state.arrays[array.id] = array
        state.array_live[array.id] = set()
        if array.request_id:
            state.job_by_request[array.request_id] = array.id
    for job in state.jobs.values():
        if job.array_id in state.arrays and not job.status.terminal:
            state.array_live[job.array_id].add(job.id)
        if job.alloc_id in state.jobs and job.status.has_gang:
            state.jobs[job.alloc_id].live_step_ids.add(job.id)
    state.finished = {k: v for k, v in data.get("finished", [])}
    state.run_times = RunTimes.from_list(data.get("run_times", []))
    state.unarchived = dict(sorted(state.unarchived.items()))
    return state


def snapshot_digest(snapshot: dict[str, Any]) -> str:
    """The digest of a state's snapshot (hash it outside any lock: it is a pass over everything)."""
    blob = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _res(r: Resources) -> list[int]:
    return [r.cpu, r.memory, r.gpu]


def _node_to_dict(n: Node) -> dict[str, Any]:
    return {"id": n.id, "address": n.address, "topology": list(n.topology),
            "capacity": _res(n.capacity), "used": _res(n.used), "gpus_in_use": sorted(n.gpus_in_use),
            "status": n.status.value, "schedulable": n.schedulable,
            "registered_at": n.registered_at, "status_changed_at": n.status_changed_at,
            "labels": [list(kv) for kv in n.labels], "isolation": n.isolation, "cordon_reason": n.cordon_reason,
            "health_cordon": n.health_cordon, "health": n.health, **({"suspect": True} if n.suspect else {}),
            **({"failures": [list(f) for f in n.failures]} if n.failures else {}),
            **({"spare": True} if n.spare else {}), **({"gpu_error": n.gpu_error} if n.gpu_error else {})}


def _node_from_dict(d: dict[str, Any]) -> Node:
    return Node(id=d["id"], address=d["address"], topology=tuple(d["topology"]),
                capacity=Resources(*d["capacity"]), used=Resources(*d["used"]),
                gpus_in_use=set(d["gpus_in_use"]), status=NodeStatus(d["status"]),
                schedulable=d["schedulable"], registered_at=d["registered_at"],
                status_changed_at=d["status_changed_at"], labels=tuple((k, v) for k, v in d.get("labels", ())),
                isolation=d.get("isolation", ""), cordon_reason=d.get("cordon_reason", ""),
                health_cordon=d.get("health_cordon", False), health=d.get("health", ""),
                suspect=d.get("suspect", False),
                failures=tuple((at, job_id, cause) for at, job_id, cause in d.get("failures", ())),
                spare=d.get("spare", False), gpu_error=d.get("gpu_error", ""))


def _spec_to_dict(s: JobSpec) -> dict[str, Any]:
    return {"name": s.name, "tasks": s.tasks, "resources": _res(s.resources),
            "command": list(s.command), "env": [list(kv) for kv in s.env],
            "pack": s.topology.pack, "mode": s.topology.mode.value, "priority": s.priority,
            "max_restarts": s.max_restarts, "time_limit": s.time_limit, "image": s.image, "queue": s.queue,
            "grace": s.grace, "gpu_model": s.gpu_model, "array": s.array, "array_throttle": s.array_throttle,
            "after": [list(d) for d in s.after], "singleton": s.singleton, "on_unsatisfiable": s.on_unsatisfiable,
            "tasks_min": s.tasks_min, "resize_interval": s.resize_interval,
            **({"checkpoint": [s.checkpoint.signal, s.checkpoint.notice]} if s.has_checkpoint else {}),
            **({"mounts": [list(m) for m in s.mounts]} if s.mounts else {}),
            **({"image_pull_timeout": s.image_pull_timeout} if s.image_pull_timeout else {}),
            **({"interactive": True} if s.interactive else {}),
            # sealed: (name, fingerprint, nonce and ciphertext), the bytes as hex
            **({"secrets": [[x.name, x.fingerprint.hex(), x.sealed.hex()] for x in s.secrets]} if s.secrets else {}),
            **({"alloc": [s.alloc, s.idle_timeout]} if s.has_alloc else {})}


def _spec_from_dict(d: dict[str, Any]) -> JobSpec:
    return JobSpec(name=d["name"], tasks=d["tasks"], resources=Resources(*d["resources"]),
                   command=tuple(d["command"]), env=tuple((k, v) for k, v in d["env"]),
                   topology=TopologySpec(d["pack"], PackMode(d["mode"])), priority=d["priority"],
                   max_restarts=d["max_restarts"], time_limit=d["time_limit"], image=d["image"],
                   queue=d.get("queue", ""), grace=d.get("grace", 0.0), gpu_model=d.get("gpu_model", ""),
                   array=d.get("array", ""), array_throttle=d.get("array_throttle", 0),
                   after=tuple((k, j) for k, j in d.get("after", ())), singleton=d.get("singleton", False),
                   on_unsatisfiable=d.get("on_unsatisfiable", ""), tasks_min=d.get("tasks_min", 0),
                   resize_interval=d.get("resize_interval", 0.0),
                   checkpoint=CheckpointSpec(*d.get("checkpoint", ("", 0.0))),
                   mounts=tuple((s, t, bool(ro)) for s, t, ro in d.get("mounts", ())),
                   image_pull_timeout=d.get("image_pull_timeout", 0.0),
                   secrets=tuple(Secret(n, bytes.fromhex(f), bytes.fromhex(x)) for n, f, x in d.get("secrets", ())),
                   alloc=d.get("alloc", (False, 0.0))[0], idle_timeout=d.get("alloc", (False, 0.0))[1],
                   interactive=d.get("interactive", False))


def _task_to_dict(t: Task) -> dict[str, Any]:
    return {"index": t.index, "node_id": t.node_id, "resources": _res(t.resources),
            "gpus": list(t.gpus), "rank": t.rank, "state": t.state.value, "exit_code": t.exit_code,
            "started_at": t.started_at, "ended_at": t.ended_at, "reason": t.reason,
            "reason_message": t.reason_message, **({"prepared": True} if t.prepared else {}),
            **({"holder": t.holder} if t.holder >= 0 else {})}


def _job_to_dict(j: Job) -> dict[str, Any]:
    return {"id": j.id, "spec": _spec_to_dict(j.spec), "request_id": j.request_id,
            "submitted_at": j.submitted_at, "seq": j.seq, "status": j.status.value,
            "attempt": j.attempt, "tasks": [_task_to_dict(t) for t in j.tasks],
            "started_at": j.started_at, "finished_at": j.finished_at, "stop_reason": j.stop_reason,
            "cancel_requested": j.cancel_requested, "final_failure": j.final_failure,
            "placements": [[a, list(nodes)] for a, nodes in sorted(j.placements.items())],
            "events": [[e.at, e.kind, e.message] for e in j.events],
            "user": j.user, "cancelled_by": j.cancelled_by, "preemptions": j.preemptions,
            "preempted_at": list(j.preempted_at), "pending_reason": j.pending_reason,
            "stop_grace": j.stop_grace, "stop_cause": j.stop_cause, "failure": j.failure,
            "pending_since": j.pending_since, "placed_at": j.placed_at, "array_id": j.array_id,
            "array_index": j.array_index, "failure_cause": j.failure_cause, "resizes": j.resizes,
            "runs": [_run_to_list(r) for r in j.runs], "archive_seq": j.archive_seq,
            "archived_at": j.archived_at, **({"requeues": j.requeues} if j.requeues else {}),
            **({"stop_notice": j.stop_notice} if j.stop_notice else {}),
            **({"notice_at": j.notice_at} if j.notice_at else {}),
            **({"excluded_nodes": list(j.excluded_nodes)} if j.excluded_nodes else {}),
            **({"progress": _progress_to_list(j.progress)} if j.progress is not None else {}),
            **({"alloc_id": j.alloc_id} if j.alloc_id else {}),
            **({"step_count": j.step_count} if j.step_count else {}),
            **({"idle_since": j.idle_since} if j.idle_since else {}),
            **({"held_by": j.held_by} if j.held_by else {}),
            **({"manual_requeues": j.manual_requeues} if j.manual_requeues else {}),
            **({"updates": j.updates} if j.updates else {})}


def _progress_to_list(p: Progress) -> list[Any]:
    return [p.attempt, p.checkpoint_at, p.checkpoint_step, p.step, p.at]


#: A run's record up to version 3; a checkpoint (version 4) is appended only when one was reported.
_RUN_V3_LEN = 11


def _run_to_list(r: Run) -> list[Any]:
    return [r.attempt, r.placed_at, r.started_at, r.ended_at, list(r.nodes), _res(r.resources), r.outcome,
            r.reason, r.exit_code, r.gpu_seconds, r.cpu_seconds, *([r.checkpoint_at] if r.checkpoint_at else [])]


def _run_from_list(v: list[Any]) -> Run:
    return Run(attempt=v[0], placed_at=v[1], started_at=v[2], ended_at=v[3], nodes=tuple(v[4]),
               resources=Resources(*v[5]), outcome=v[6], reason=v[7], exit_code=v[8], gpu_seconds=v[9],
               cpu_seconds=v[10], checkpoint_at=v[11] if len(v) > _RUN_V3_LEN else 0.0)


def _job_from_dict(d: dict[str, Any]) -> Job:
    job = Job(id=d["id"], spec=_spec_from_dict(d["spec"]), request_id=d["request_id"],
              submitted_at=d["submitted_at"], seq=d["seq"], status=JobStatus(d["status"]),
              attempt=d["attempt"], started_at=d["started_at"], finished_at=d["finished_at"],
              stop_reason=d["stop_reason"], cancel_requested=d["cancel_requested"],
              final_failure=d["final_failure"], events=[Event(*e) for e in d["events"]],
              placements={a: tuple(nodes) for a, nodes in d["placements"]},
              user=d.get("user", ""), cancelled_by=d.get("cancelled_by", ""),
              preemptions=d.get("preemptions", 0), stop_grace=d.get("stop_grace", 0.0),
              preempted_at=tuple(d.get("preempted_at", ())), pending_reason=d.get("pending_reason", ""),
              stop_cause=d.get("stop_cause", ""), failure=d.get("failure", ""), array_id=d.get("array_id", ""),
              array_index=d.get("array_index", -1), failure_cause=d.get("failure_cause", ""),
              resizes=d.get("resizes", 0), requeues=d.get("requeues", 0),
              runs=[_run_from_list(r) for r in d.get("runs", ())], archive_seq=d.get("archive_seq", 0),
              archived_at=d.get("archived_at", 0.0), stop_notice=d.get("stop_notice", 0.0),
              notice_at=d.get("notice_at", 0.0), excluded_nodes=tuple(d.get("excluded_nodes", ())),
              progress=Progress(*d["progress"]) if "progress" in d else None, alloc_id=d.get("alloc_id", ""),
              step_count=d.get("step_count", 0), idle_since=d.get("idle_since", 0.0), held_by=d.get("held_by", ""),
              manual_requeues=d.get("manual_requeues", 0), updates=d.get("updates", 0))
    if "pending_since" in d:
        job.pending_since, job.placed_at = d["pending_since"], d["placed_at"]
    else:  # a snapshot from before these fields: the job's own events say when
        job.pending_since = _last_event_at(job, ("Submitted", "Requeued"))
        job.placed_at = _last_event_at(job, ("Scheduled",))
    job.tasks = [Task(job_id=job.id, attempt=job.attempt, index=t["index"], node_id=t["node_id"],
                      resources=Resources(*t["resources"]), gpus=tuple(t["gpus"]), rank=t["rank"],
                      state=TaskState(t["state"]), exit_code=t["exit_code"],
                      started_at=t["started_at"], ended_at=t["ended_at"], reason=t.get("reason", ""),
                      reason_message=t.get("reason_message", ""), prepared=t.get("prepared", False),
                      holder=t.get("holder", -1))
                 for t in d["tasks"]]
    return job


def _last_event_at(job: Job, kinds: tuple[str, ...]) -> float:
    """When the job's latest event of these kinds happened (its submission time if it kept none)."""
    return next((e.at for e in reversed(job.events) if e.kind in kinds), job.submitted_at)


def _array_to_dict(a: JobArray) -> dict[str, Any]:
    return {"id": a.id, "spec": _spec_to_dict(a.spec), "request_id": a.request_id, "user": a.user,
            "submitted_at": a.submitted_at, "seq": a.seq, "throttle": a.throttle, "next": a.next, "rep": a.rep,
            "skipped": sorted(a.skipped), "cancelled": a.cancelled,
            "never_satisfied": a.never_satisfied, "succeeded": a.succeeded, "failed": a.failed,
            "cancelled_count": a.cancelled_count, "finished_at": a.finished_at,
            **({"started_at": a.started_at} if a.started_at else {})}  # absent: as an older release wrote it


def _array_from_dict(d: dict[str, Any]) -> JobArray:
    return JobArray(id=d["id"], spec=_spec_from_dict(d["spec"]), request_id=d["request_id"], user=d["user"],
                    submitted_at=d["submitted_at"], seq=d["seq"], throttle=d["throttle"], next=d["next"],
                    rep=d["rep"], skipped=set(d["skipped"]), cancelled=d["cancelled"],
                    never_satisfied=d.get("never_satisfied", False), succeeded=d["succeeded"],
                    failed=d["failed"], cancelled_count=d["cancelled_count"], finished_at=d["finished_at"],
                    started_at=d.get("started_at", 0.0))


def _join_token_to_dict(t: JoinToken) -> dict[str, Any]:
    return {"id": t.id, "token_hash": t.token_hash, "created_at": t.created_at, "created_by": t.created_by,
            "expires_at": t.expires_at, "max_uses": t.max_uses, "uses": t.uses, "nodes": list(t.nodes)}


def _user_to_dict(u: User) -> dict[str, Any]:
    return {"name": u.name, "role": u.role.value, "groups": list(u.groups), "token_hash": u.token_hash,
            "created_at": u.created_at, "created_by": u.created_by, "token_set_at": u.token_set_at}


def _user_from_dict(d: dict[str, Any]) -> User:
    return User(name=d["name"], role=Role(d["role"]), groups=tuple(d["groups"]), token_hash=d["token_hash"],
                created_at=d["created_at"], created_by=d["created_by"], token_set_at=d["token_set_at"])


def _queue_to_dict(q: Queue) -> dict[str, Any]:
    return {"name": q.name, "parent": q.parent, "weight": q.weight, "guaranteed": _res(q.guaranteed),
            "max": _res(q.max), "lending_limit": _res(q.lending_limit), "users": list(q.users),
            "groups": list(q.groups), "preemption_rules": list(q.preemption_rules), "min_runtime": q.min_runtime,
            "max_grace": q.max_grace, **({"user_gpu": q.user_gpu} if q.user_gpu != UNLIMITED else {}),
            **({"user_jobs": q.user_jobs} if q.user_jobs != UNLIMITED else {}),
            **({"interactive_max": q.interactive_max} if q.interactive_max else {})}


def _queue_from_dict(d: dict[str, Any]) -> Queue:
    return Queue(name=d["name"], parent=d["parent"], weight=d["weight"], guaranteed=Resources(*d["guaranteed"]),
                 max=Resources(*d["max"]), lending_limit=Resources(*d["lending_limit"]), users=tuple(d["users"]),
                 groups=tuple(d["groups"]), preemption_rules=tuple(d["preemption_rules"]),
                 min_runtime=d["min_runtime"], max_grace=d["max_grace"], user_gpu=d.get("user_gpu", UNLIMITED),
                 user_jobs=d.get("user_jobs", UNLIMITED), interactive_max=d.get("interactive_max", 0.0))
