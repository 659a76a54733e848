"""`synapse-local`: a whole cluster on one machine, for trying Synapse, tests and chaos runs."""
