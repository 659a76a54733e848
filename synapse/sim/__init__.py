"""Trace-driven evaluation: traces (generated or imported), baseline policies, replay, metrics.

The replay runs Synapse's real state machine and queue policy (synapse.sim.engine); the baselines
are other queue policies over the same placement code. Files are read and written here, never in
the core, and nothing here imports the master, the worker or gRPC.
"""
