"""The node table: registration (by an admin, a node's credential, or a join token), join tokens, a
node declared down or up, cordons, spares.

State: `nodes`, `live_tasks` (a node's entry), `index`, `largest`, `join_tokens`,
`join_token_by_hash`, `spares`. Commands: RegisterNode, CreateJoinToken, RevokeJoinToken,
JoinNode, NodeDown, NodeLost, NodeUp, SetSchedulable, SetSpares.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import (
    DEFAULT_LABEL,
    JOIN_TOKEN_NODES,
    EndReason,
    JobStatus,
    JoinToken,
    Node,
    NodeStatus,
    TaskState,
)
from synapse.core.state.node_faults import note_node_failures
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import end_task, maybe_end_attempt, stop_attempt
from synapse.core.state.usage import release_hold


def register_node(state: ClusterTables, cmd: c.RegisterNode) -> Result:
    """A node joins, or joins again with a new address, capacity or topology (refused below what its
    live tasks use); a DOWN node registering again is READY."""
    if not cmd.node_id:
        return Result.rejected("node id must not be empty")
    if cmd.capacity.is_negative():
        return Result.rejected(f"node {cmd.node_id}: capacity must not be negative")
    if len(cmd.topology) > len(state.levels):
        return Result.rejected(f"node {cmd.node_id}: topology {'/'.join(cmd.topology)} has more "
                               f"levels than the cluster's {'/'.join(state.levels)}")
    if any(not label or "/" in label for label in cmd.topology):
        return Result.rejected(f"node {cmd.node_id}: topology labels must be non-empty, without '/'")
    topology = (DEFAULT_LABEL,) * (len(state.levels) - len(cmd.topology)) + tuple(cmd.topology)
    labels = tuple(sorted(cmd.labels))
    node = state.nodes.get(cmd.node_id)
    if node is None:
        node = Node(id=cmd.node_id, address=cmd.address, topology=topology,
                    capacity=cmd.capacity, registered_at=cmd.at, status_changed_at=cmd.at,
                    labels=labels, isolation=cmd.isolation)
        state.nodes[node.id] = node
        state.live_tasks[node.id] = set()
        state.index.update(node)
        state._note_capacity(node.capacity)
        state.emit(cmd.at, "Normal", "node", "NodeRegistered", node.id,
                   f"{node.capacity.gpu} GPU(s) in {'/'.join(topology)}")
        return Result(True, value="registered")
    if not node.used.fits_in(cmd.capacity) or any(g >= cmd.capacity.gpu for g in node.gpus_in_use):
        return Result.rejected(f"node {node.id}: new capacity is below what its live tasks use")
    node.address, node.topology, node.capacity = cmd.address, topology, cmd.capacity
    node.labels, node.isolation = labels, cmd.isolation
    state._note_capacity(node.capacity)
    if node.status is NodeStatus.DOWN:
        node.status, node.status_changed_at = NodeStatus.READY, cmd.at
        state.emit(cmd.at, "Normal", "node", "NodeUp", node.id, "registered again")
    state.index.update(node)
    return Result(True, value="re-registered")




def create_join_token(state: ClusterTables, cmd: c.CreateJoinToken) -> Result:
    """A join token, kept by its hash only; its id and hash must be new (nor may the hash be a user's)."""
    if not cmd.token_id or cmd.token_id in state.join_tokens:
        return Result.rejected(f"join token id {cmd.token_id!r} is empty or taken")
    if not cmd.token_hash or cmd.token_hash in state.join_token_by_hash or cmd.token_hash in state.user_by_token:
        return Result.rejected("join token hash is empty or taken")
    if cmd.max_uses < 0 or cmd.expires_at < 0:
        return Result.rejected("join token: uses and expiry must not be negative")
    state.join_tokens[cmd.token_id] = JoinToken(id=cmd.token_id, token_hash=cmd.token_hash, created_at=cmd.at,
                                                created_by=cmd.by, expires_at=cmd.expires_at,
                                                max_uses=cmd.max_uses)
    state.join_token_by_hash[cmd.token_hash] = cmd.token_id
    return Result(True, value=cmd.token_id)


def revoke_join_token(state: ClusterTables, cmd: c.RevokeJoinToken) -> Result:
    """Forget a join token: no node joins with it any more (those that joined stay)."""
    token = state.join_tokens.pop(cmd.token_id, None)
    if token is None:
        return Result.not_found(f"unknown join token {cmd.token_id}")
    del state.join_token_by_hash[token.token_hash]
    return Result(True)


def join_node(state: ClusterTables, cmd: c.JoinNode) -> Result:
    """A new node by a join token: the token's use and the registration happen together or not
    at all (the expiry is judged at the proposer's time, carried in the command)."""
    token = state.join_tokens.get(cmd.token_id)
    if token is None:
        return Result.not_found(f"unknown join token {cmd.token_id}")
    why = token.unusable(cmd.at)
    if why:
        return Result.rejected(why)
    if cmd.node.node_id in state.nodes:
        return Result.rejected(f"node {cmd.node.node_id} is registered: re-registering it needs an admin or "
                               "its own credential, not a join token")
    result = register_node(state, cmd.node)
    if result.ok:
        token.uses += 1
        token.nodes = (*token.nodes, cmd.node.node_id)[-JOIN_TOKEN_NODES:]
    return result


def node_down(state: ClusterTables, cmd: c.NodeDown) -> Result:
    """A node is DOWN (NodeDown) or lost (NodeLost): its tasks are lost, their resources freed and
    their gangs stopped; failed for a NodeDown, requeued uncharged for a NodeLost, which also
    records the ends against the node and in the jobs' excluded nodes."""
    holder = state.held_nodes.get(cmd.node_id)
    if holder is not None and cmd.node_id in state.nodes:
        release_hold(state, holder)  # the plan lapses; the preemptor is planned afresh
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    if node.status is NodeStatus.DOWN:
        return Result(True, value="already down")
    node.status, node.status_changed_at = NodeStatus.DOWN, cmd.at
    reason = f"node {node.id} down" + (f": {cmd.reason}" if cmd.reason else "")
    state.emit(cmd.at, "Warning", "node", "NodeDown", node.id, reason)
    # A NodeLost (version 3) requeues the gangs uncharged; a NodeDown of an older leader fails them.
    uncharged = isinstance(cmd, c.NodeLost)
    ended: list[str] = []  #: the jobs whose gangs this loss ends (not those stopping already), in order
    for job_id, _attempt, index in sorted(state.live_tasks[node.id]):
        job = state.jobs[job_id]
        task = job.tasks[index]
        if not task.state.live:  # an allocation's task that a step's end on this node ended already
            continue
        if job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING) and job_id not in ended:
            ended.append(job_id)
        end_task(state, task, TaskState.LOST, None, cmd.at, EndReason.NODE_LOST, reason)
        lost = f"task {index} (rank {task.rank}) on {node.id}: NodeLost: {cmd.reason or 'node declared down'}"
        # An uncharged loss is no failure of the job's: it keeps none (its run records the cause).
        stop_attempt(state, job, f"{'' if uncharged else 'failed: '}task {index} lost ({reason})", cmd.at,
                     cause=EndReason.NODE_LOST if uncharged else "", failure="" if uncharged else lost)
        maybe_end_attempt(state, job, cmd.at)
    if uncharged:  # version 3 only: an older replica applies a NodeDown, which keeps no record
        note_node_failures(state, node, ended, EndReason.NODE_LOST.value, cmd.at)
    state.index.update(node)
    return Result(True)


def node_up(state: ClusterTables, cmd: c.NodeUp) -> Result:
    """A DOWN node is heard from again: READY (a cordon, if any, stays)."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    if node.status is NodeStatus.READY:
        return Result(True, value="already ready")
    node.status, node.status_changed_at = NodeStatus.READY, cmd.at
    state.emit(cmd.at, "Normal", "node", "NodeUp", node.id, "heard from again")
    state.index.update(node)
    return Result(True)


def set_schedulable(state: ClusterTables, cmd: c.SetSchedulable) -> Result:
    """An admin's cordon or uncordon. An admin's cordon replaces a health cordon, so the health
    check passing again never lifts it."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    reason = "" if cmd.schedulable else (cmd.reason or "cordoned") + (f" (by {cmd.by})" if cmd.by else "")
    if node.schedulable != cmd.schedulable or node.health_cordon or node.suspect:
        state.emit(cmd.at, "Normal", "node", "NodeUncordoned" if cmd.schedulable else "NodeCordoned", node.id,
                   ("uncordoned" + (f" by {cmd.by}" if cmd.by else "")) if cmd.schedulable else reason)
    node.schedulable, node.cordon_reason, node.health_cordon = cmd.schedulable, reason, False
    # An admin's cordon replaces a suspect's; an uncordon also forgives the node its record (and
    # its GPU error: the admin says it was repaired).
    node.suspect = False
    if cmd.schedulable:
        node.failures, node.gpu_error = (), ""
    state.index.update(node)
    return Result(True)


def set_spares(state: ClusterTables, cmd: c.SetSpares) -> Result:
    """Designate exactly these nodes spares (all or nothing: an unknown node rejects the set)."""
    unknown = sorted(set(cmd.node_ids) - set(state.nodes))
    if unknown:
        return Result.not_found(f"unknown node(s) {', '.join(unknown)}")
    chosen = frozenset(cmd.node_ids)
    why = f": {cmd.reason}" if cmd.reason else ""
    for node_id in sorted(chosen ^ state.spares):
        node = state.nodes[node_id]
        node.spare = node_id in chosen
        state.emit(cmd.at, "Normal", "node", "NodeSpare" if node.spare else "NodeSpareReleased", node_id,
                   ("designated a spare" if node.spare else "no longer a spare") + why)
    state.spares = chosen
    return Result(True, value=str(len(chosen)))
