"""The pure, deterministic core: runs inside every master replica and inside the simulator.

The domain model, the replicated commands and their encoding, the state machine that applies them,
the capacity indexes, placement, the queue policy, the invariants and the simulator. Nothing here
does I/O, reads a clock or imports grpc, pysyncobj, asyncio, subprocess or socket
(`tests/test_layout.py` enforces it): the same state and the same input always give the same output.
"""
