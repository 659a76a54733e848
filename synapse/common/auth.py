"""Cluster-token authentication for the gRPC API.

Every RPC carries `authorization: Bearer <token>`; the server interceptor compares it in constant
time and answers UNAUTHENTICATED otherwise. A master configured without a token accepts every
caller (a local development setting; the README says so).
"""

from __future__ import annotations

import hmac

import grpc

#: Metadata key of the cluster token: `authorization: Bearer <token>`.
METADATA_KEY = "authorization"
#: Trailing metadata key naming the leader's API address on a redirect.
LEADER_METADATA_KEY = "synapse-leader"
#: Metadata key of the credential a worker got from RegisterNode: an HMAC only masters can make.
NODE_CREDENTIAL_KEY = "synapse-node-credential"


def client_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls whose bearer token is not the cluster token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[override]
        presented = dict(handler_call_details.invocation_metadata or ()).get(METADATA_KEY, "")
        if hmac.compare_digest(str(presented).encode(), self._expected):
            return await continuation(handler_call_details)
        return _deny(await continuation(handler_call_details))


def _deny(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    async def abort(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")

    async def abort_stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")
        yield  # pragma: no cover - makes this an async generator

    if handler is None:
        return None
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            abort_stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(
        abort, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)
