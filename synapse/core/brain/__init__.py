"""The leader's brain: stimuli in, commands to propose out (`leader_state`, which dispatches to
`rounds`, `preempting`, `nodes`, `progress` and `monitors`, all sharing one `inflight` ledger), and
heartbeat expiry (`heartbeat`). Pure: the master (synapse.master.leader) and the simulator
(synapse.sim.engine) host it, each with its own clock.
"""
