"""The one registry of state-machine commands: each command kind -> the function that applies it.

A handler is `handler(state, cmd) -> Result`, in the module of the table it changes (see
synapse.core.state). `fsm.ClusterState.apply` dispatches through this table alone, so a kind missing
here is a kind this code cannot apply (codec.CodecError for its log entry). The kinds the codec
knows (`versions.KIND_VERSIONS`, with the command-set version of each) must be exactly these:
scripts/command_table.py checks it and renders docs/architecture/commands.md from both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.state import (
    arrays,
    cluster,
    gangs,
    history,
    job_controls,
    jobs,
    node_faults,
    nodes,
    queues,
    steps,
    tasks,
    usage,
    users,
)
from synapse.core.state.tables import ClusterTables

HANDLERS: dict[type[c.Command], Callable[[ClusterTables, Any], Result]] = {
    # jobs and gangs
    c.SubmitJob: jobs.submit_job,
    c.SubmitWorkflowJob: jobs.submit_job,
    c.SubmitCheckpointJob: jobs.submit_job,
    c.SubmitImageJob: jobs.submit_job,
    c.SubmitSecretJob: jobs.submit_job,
    c.SubmitAllocJob: jobs.submit_job,
    c.StartStep: steps.start_step,
    c.SubmitInteractiveJob: jobs.submit_job,
    c.HoldJob: job_controls.hold_job,
    c.ReleaseJob: job_controls.release_job,
    c.UpdateJob: job_controls.update_job,
    c.RequeueJob: job_controls.requeue_job,
    c.CancelJob: jobs.cancel_job,
    c.FailAttempt: jobs.fail_attempt,
    c.SetArrayThrottle: arrays.set_array_throttle,
    c.CommitPlan: gangs.commit_plan,
    c.TaskStarted: tasks.task_started,
    c.TaskPrepared: tasks.task_prepared,
    c.TaskExited: tasks.task_exited,
    c.ResizeGang: gangs.resize_gang,
    c.CheckpointNotice: gangs.checkpoint_notice,
    c.RecordProgress: gangs.record_progress,
    c.RecordExec: gangs.record_exec,
    # nodes
    c.RegisterNode: nodes.register_node,
    c.CreateJoinToken: nodes.create_join_token,
    c.RevokeJoinToken: nodes.revoke_join_token,
    c.JoinNode: nodes.join_node,
    c.NodeDown: nodes.node_down,
    c.NodeLost: nodes.node_down,
    c.NodeUp: nodes.node_up,
    c.SetSchedulable: nodes.set_schedulable,
    c.SetSpares: nodes.set_spares,
    c.SetNodeHealth: node_faults.set_node_health,
    c.DrainNode: node_faults.drain_node,
    c.GpuFault: node_faults.gpu_fault,
    # queues and usage
    c.ApplyQueues: queues.apply_queues,
    c.ApplyQueuesWithLimits: queues.apply_queues,
    c.DeleteQueue: queues.delete_queue,
    c.Preempt: queues.preempt,
    c.PendingReasons: queues.pending_reasons,
    c.SetUsageHalfLife: usage.set_usage_half_life,
    # identities and tokens
    c.AddUser: users.add_user,
    c.SetUserToken: users.set_user_token,
    c.RemoveUser: users.remove_user,
    # history numbering
    c.ForgetJobs: history.forget_jobs,
    c.ArchiveJobs: history.archive_jobs,
    c.HistoryExported: history.history_exported,
    c.HistoryOverflow: history.history_overflow,
    # the cluster
    c.SetClusterVersion: cluster.set_cluster_version,
    c.SetReplica: cluster.set_replica,
    c.Barrier: cluster.barrier,
}
