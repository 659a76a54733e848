"""A plain job submitted on the pure core, for the spares tests."""

from __future__ import annotations

from synapse.core import commands as c
from tests.support.helpers import checked, spec


def submit(state, job_id, at=10.0, **kw):
    assert checked(state, c.SubmitJob(at=at, job_id=job_id, request_id=job_id, spec=spec(**kw))).ok
