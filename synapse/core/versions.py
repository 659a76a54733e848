"""Command-set versions (etcd's cluster version): the one place that answers "may this be proposed, or
passed on, at this cluster version".

Each kind of command has the version of the command set that introduced it (`KIND_VERSIONS`), and a
log entry carries its kind's version. A replica knows the versions up to `COMMAND_VERSION` and
refuses the rest; a leader proposes a kind only once every member has told it it knows that kind's
version, so a cluster upgrades one replica at a time. A worker's end reason newer than the first set
(`CAUSE_VERSIONS`) is passed on the same way. The leader asks `may_propose` and `cause_known`; the
codec stamps entries with `KIND_VERSIONS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from synapse.core import commands as c
from synapse.core.model import NEVER_RAN_VERSION, EndReason

#: The command-set version that introduced each kind of command; a log entry carries its kind's.
#: A new kind, or a kind whose encoding or apply changes so that an older replica would apply it
#: differently, takes COMMAND_VERSION + 1: a leader proposes it only once every member knows it.
KIND_VERSIONS: Mapping[type[c.Command], int] = MappingProxyType({
    c.RegisterNode: 1, c.NodeDown: 1, c.NodeUp: 1, c.SetSchedulable: 1, c.SetNodeHealth: 1, c.SubmitJob: 1,
    c.CommitPlan: 1, c.TaskStarted: 1, c.TaskExited: 1, c.CancelJob: 1, c.FailAttempt: 1, c.Barrier: 1,
    c.ForgetJobs: 1, c.SetReplica: 1, c.AddUser: 1, c.SetUserToken: 1, c.RemoveUser: 1, c.ApplyQueues: 1,
    c.DeleteQueue: 1, c.PendingReasons: 1, c.Preempt: 1,
    # Arrays, dependencies, elastic gangs. CancelJob of an array, a final FailAttempt's cause on a
    # pending job, a CommitPlan of an elastic gang's size and a Preempt that shrinks one apply
    # differently here, but only to jobs and arrays that version-2 submissions created, which no
    # older replica can hold: those kinds keep version 1.
    c.SubmitWorkflowJob: 2, c.SetArrayThrottle: 2, c.ResizeGang: 2, c.ArchiveJobs: 2,
    c.CreateJoinToken: 2, c.RevokeJoinToken: 2, c.JoinNode: 2,
    c.HistoryExported: 2, c.HistoryOverflow: 2, c.SetUsageHalfLife: 2,
    # Node loss and drains requeue gangs uncharged: an older replica would fail them (or charge them).
    # The checkpoint notice: a Preempt's victim notice and the notice a FailAttempt, ResizeGang or
    # DrainNode stop gives apply only to jobs that a SubmitCheckpointJob made, which no older
    # replica can hold: those kinds keep their versions.
    c.NodeLost: 3, c.DrainNode: 3, c.SetClusterVersion: 3, c.SubmitCheckpointJob: 3, c.CheckpointNotice: 3,
    # Goodput: an attempt's last checkpoint, as its tasks reported it.
    c.RecordProgress: 4,
    # Spare nodes (synapse.core.schedule.spares): an older replica knows no spare.
    c.SetSpares: 4,
    # Images: a job's mounts, and a job that runs its image's entrypoint (no command).
    c.SubmitImageJob: 4, c.TaskPrepared: 4,
    # A worker's GPU error (synapse.core.brain.heartbeat.gpu_fault_change): an older replica knows no such end.
    c.GpuFault: 4,
    # Job secrets, sealed (version 5 changed only the transport: SEALED_TRANSPORT_VERSION).
    c.SubmitSecretJob: 6,
    # Allocations and their steps (synapse.core.steps).
    c.SubmitAllocJob: 7, c.StartStep: 7,
    # Interactive work: an exec into a running task, recorded as the job's event.
    c.RecordExec: 7,
    # The researcher's loop: held jobs, a job's priority, time limit or queue changed, a requeue on
    # demand, per-user limits of a queue and interactive sessions (an older replica would place a held
    # job, or drop a limit and accept what this one refuses).
    c.SubmitInteractiveJob: 7, c.HoldJob: 7, c.ReleaseJob: 7, c.UpdateJob: 7, c.RequeueJob: 7,
    c.ApplyQueuesWithLimits: 7,
})
#: The command-set version that introduced each worker end reason later than the first set: a replica
#: of an older set reads it as an exit code (Error), so a leader passes it on only once every member
#: knows it (`cause_known`), and apply stays the same on every replica.
CAUSE_VERSIONS: Mapping[str, int] = MappingProxyType({EndReason.COMMAND_NOT_FOUND: 2,
                                                      EndReason.MASTER_PORT_IN_USE: 3,
                                                      EndReason.IMAGE_PULL_FAILED: 4,
                                                      EndReason.NODE_LOST: 4,
                                                      EndReason.MOUNT_REFUSED: NEVER_RAN_VERSION})
#: A version that changed no command but how replicas talk: from version 5 they seal the Raft
#: transport's messages with AES-GCM (synapse.master.cipher), which an older replica cannot read. A
#: replica seals so only once the cluster version is this (every member reads it); until then, Fernet.
SEALED_TRANSPORT_VERSION = 5
#: The highest command-set version this code knows: what its replica reports, and the most it applies.
COMMAND_VERSION = max(*KIND_VERSIONS.values(), *CAUSE_VERSIONS.values(), SEALED_TRANSPORT_VERSION)
#: The version every release applies (the first command set): commands of it are never held back.
BASE_VERSION = 1
#: The command-set version from which apply learns run times (SetClusterVersion raises it): a change
#: of apply within the kinds it had, which waits for every member (as model.NEVER_RAN_VERSION does).
PREDICT_VERSION = 4


def may_propose(kind: type[c.Command], version: int) -> bool:
    """Whether a command of `kind` may be proposed when every member applies command-set `version`."""
    return version >= KIND_VERSIONS[kind]


def cause_known(cause: str, version: int) -> bool:
    """Whether a worker's end reason may be passed on at command-set `version` (before, it reads as Error)."""
    return CAUSE_VERSIONS.get(cause, BASE_VERSION) <= version


def admits(version: int, kind: type[c.Command], cause: str = "") -> bool:
    """Whether a cluster at command-set `version` takes a command of `kind` (and, for a task's exit,
    its `cause`): the one version question a master asks before it proposes."""
    return may_propose(kind, version) and cause_known(cause, version)
