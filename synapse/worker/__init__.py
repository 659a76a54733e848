"""The worker process (`synapse-worker`): the agent on every machine that runs the tasks.

`agent` talks to the masters and carries out what `state` (the worker's bookkeeping, events in and
instructions out) decides; `runtime` starts and stops task processes through `shim.sh`.
"""
