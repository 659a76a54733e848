"""`python -m synapse.master`: the same as `synapse-master`."""

from synapse.master.main import main

main()
