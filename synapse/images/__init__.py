"""The node's image store: pulling OCI images from registries and local layouts, verifying every
blob, and unpacking them safely into one shared read-only root per image (docs/operating/images.md).

The worker calls `store.ImageStore`; nothing here decides what runs where.
"""
