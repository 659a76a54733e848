"""`python -m synapse.worker`: the same as `synapse-worker`."""

from synapse.worker.main import main

main()
