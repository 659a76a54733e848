"""The handlers of the cluster state machine (synapse.core.state.fsm.ClusterState), one module per table.

`registry.HANDLERS` maps each command kind to its handler, `handler(state, cmd) -> Result`. The
state itself is the attributes of `tables.ClusterTables` (which ClusterState extends), grouped
there by table; each module's docstring names the ones it writes:

- jobs: submissions, cancels, failed attempts (`jobs`, `job_by_request`, `pending`)
- arrays: job arrays and their elements (`arrays`, `array_live`)
- gangs: plans committed, resizes, checkpoint notices, progress
- tasks: a worker's reports of its tasks (started, prepared, exited) and why a task ended
- nodes: registration, join tokens, down/up, cordons, spares (`nodes`, `join_tokens`, `spares`)
- node_faults: health checks, drains, GPU errors, suspect nodes
- queues: queues, preemption and its holds, pending reasons (`queues`, `holds`)
- usage: queue usage and decayed fair-share usage (`queue_usage`, `queue_decay`, `user_decay`)
- users: identities and their tokens (`users`, `user_by_token`)
- history: archive numbering, export cursor, forgetting (`archive_seq`, `unarchived`, `finished`)
- cluster: the command-set version, master replicas, the barrier

Shared by the handlers, deciding nothing themselves: transitions (a gang stopped, an attempt
ended, a job finished) and events (a job's events, each also a cluster event).
"""
