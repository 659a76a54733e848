"""Synapse: a gang scheduler for multi-machine AI training jobs with a Raft-replicated master."""

__version__ = "0.1.0"
