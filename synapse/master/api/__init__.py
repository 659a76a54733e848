"""The gRPC API of a master replica, by audience: convert, call the domain, map errors to status codes.

`servicer.MasterServicer` is the one servicer, composed of one mixin per audience: `submit` and `jobs` (users'
jobs, with `job_info`), `admin` (nodes, users, queues, join tokens), `workers`, `replicas` (the
masters themselves) and `history` (events and the history store). `base` holds what they share
and `add_to_server`, which serves no RPC that synapse.master.access does not cover.
"""
