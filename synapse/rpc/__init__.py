"""The edge between the masters' gRPC API and the domain: `convert` turns API messages into domain
objects and back. Imported by the master, the worker, the client and synctl, never by the core.
"""
