"""Checkpoint jobs on the pure core: a submission with a notice, and a job's events of one kind."""

from __future__ import annotations

import dataclasses

from synapse.core import commands as c
from synapse.core.model import CheckpointSpec
from synapse.core.state.fsm import ClusterState
from tests.support.helpers import checked, spec

USR1 = CheckpointSpec("USR1", 120.0)


def submit(state: ClusterState, job_id: str, at: float = 10.0, checkpoint: CheckpointSpec = USR1, **kw) -> None:
    checked(state, c.SubmitCheckpointJob(at=at, job_id=job_id, request_id=job_id,
                                         spec=dataclasses.replace(spec(name=job_id, **kw), checkpoint=checkpoint)))


def events(state: ClusterState, job_id: str, kind: str) -> list[tuple[float, str]]:
    return [(e.at, e.message) for e in state.jobs[job_id].events if e.kind == kind]
