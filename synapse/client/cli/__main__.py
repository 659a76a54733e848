"""`python -m synapse.client.cli`: the same command as `synctl`."""

from synapse.client.cli.main import main

main()
