"""The leader's brain: stimuli in, commands to propose out (`leader_state`), and heartbeat expiry
(`heartbeat`). Pure: the master (synapse.master.leader) and the simulator (synapse.sim.engine)
host it, each with its own clock.
"""
