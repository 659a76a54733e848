"""The access rules on a real gRPC server: serving refuses to start with an RPC that has no rule
(the rules themselves are checked in tests/unit/test_access.py)."""

from __future__ import annotations

import asyncio

import pytest

from synapse.master import access


def test_serving_refuses_to_start_with_an_unguarded_rpc(monkeypatch):
    import grpc

    from synapse.master.api import base

    monkeypatch.delitem(access.ACCESS, "CancelJob")
    monkeypatch.setattr(base, "ACCESS", access.ACCESS)
    async def serve() -> None:  # a gRPC aio server belongs to a running loop (other tests close theirs)
        base.add_to_server(object(), grpc.aio.server())  # type: ignore[arg-type]

    with pytest.raises(RuntimeError, match="CancelJob"):
        asyncio.run(serve())
