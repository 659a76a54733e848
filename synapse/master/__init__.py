"""The master process (`synapse-master`): one replica of the Raft-replicated control plane.

`main` assembles a replica from `raft` (pysyncobj with Synapse's corrections), `durability`,
`replica` (process-local state), `api` (the gRPC API, by audience) and, while it leads, `leader` (the
scheduling, heartbeat-expiry and time-limit loops, with `heartbeat` and `dispatch`).
"""
