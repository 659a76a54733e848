"""The client tells a TLS verdict from a handshake cut short (synapse.client.master_client)."""

from __future__ import annotations

import grpc
import pytest

from synapse.client.master_client import Failover, MasterClient, TLSError


class _Error(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()


@pytest.mark.parametrize("details", [
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Handshake read failed "
    "(Shutting down endpoint)",
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Handshake read failed "
    "(Endpoint closing)",
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: tcp handshaker shutdown",
    # all three masters killed and restarted (tests/cluster/test_master_ha.py, once in a CI-like run)
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Handshake read failed "
    "(recvmsg:Connection reset by peer (104))",
])
def test_a_handshake_cut_short_is_retried_not_a_tls_failure(details):
    """A loaded machine: the try's deadline ended the handshake. Another try may well succeed."""
    client = MasterClient(["127.0.0.1:1", "127.0.0.1:2"], "token")
    try:
        Failover(client, 5.0).failed_try("127.0.0.1:1", _Error(details))  # no raise: the next try goes on
    finally:
        client.close()


def test_a_refused_certificate_is_a_tls_failure():
    client = MasterClient(["127.0.0.1:1"], "token")
    try:
        with pytest.raises(TLSError):
            Failover(client, 5.0).failed_try("127.0.0.1:1", _Error(
                "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Handshake failed "
                "(TSI_PROTOCOL_FAILURE: certificate verify failed)"))
    finally:
        client.close()
