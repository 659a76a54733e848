"""The Master service as one gRPC servicer: one mixin per audience, so each RPC has one home.

Mixins of one base rather than a servicer that delegates: every RPC stays a method of one class
(what `add_to_server` registers and tests/unit/test_one_proposal.py walks), and an RPC is found by its
audience's module without a forwarding layer in between.
"""

from __future__ import annotations

from synapse.master.api.admin import AdminApi
from synapse.master.api.history import HistoryApi
from synapse.master.api.interactive import InteractiveApi
from synapse.master.api.jobs import JobsApi
from synapse.master.api.replicas import ReplicasApi
from synapse.master.api.steps import StepsApi
from synapse.master.api.submit import SubmitApi
from synapse.master.api.workers import WorkersApi
from synapse.proto import api_pb2_grpc


class MasterServicer(SubmitApi, JobsApi, StepsApi, InteractiveApi, AdminApi, WorkersApi, ReplicasApi, HistoryApi,
                     api_pb2_grpc.MasterServicer):
    """Every RPC of the Master service (the generated base last: an RPC no mixin serves fails the
    one-proposal test, which finds every RPC among the mixins)."""
