"""The pure, deterministic core: runs inside every master replica and inside the simulator.

By concern:
- `state/`: the replicated state machine (`fsm`: the door, `apply`), its tables and their handlers
  (one module per table, `registry` mapping each command kind to its handler), its snapshots and
  the invariants every replica must keep;
- `schedule/`: what a scheduling round decides, reading the state and never changing it: the
  round (`scheduler`), placement over the capacity indexes (`topology`), admission, eligibility,
  preemption, spares, elastic sizes, run-time prediction and fair share;
- `brain/`: the leader's decisions, stimuli in and commands out (`leader_state`), and heartbeat
  expiry with the nodes' leases (`heartbeat`);
- `jobs/`: what a job file becomes: the spec's validation (`jobspec`), quantities, image
  references, arrays, dependencies;
- `model/`: the domain model, plain data (nodes, jobs, why tasks end, tenants, plans), its names
  imported from `synapse.core.model`;
- at the top: the replicated commands and their encoding for the Raft log (`commands`, `codec`),
  `versions`, the rules a submission must meet against the state (`submission`), queues,
  identities, the rendezvous port, the link-shard map, goodput and the history record.

Nothing here does I/O, reads a clock or imports grpc, pysyncobj, asyncio, subprocess or socket, nor
the API's messages, which synapse.rpc converts (`tests/unit/test_layout.py` enforces it): the same
state and the same input always give the same output.
"""
