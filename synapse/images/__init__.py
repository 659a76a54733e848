"""The node's image store: pulling OCI images from registries and local layouts, verifying every
blob, and unpacking them safely into one shared read-only root per image (docs/operating/images.md).

The worker drives it; nothing here decides what runs where:

    store = ImageStore(data_dir / "images", budget_bytes=cache_size, credentials=credentials_file,
                       insecure_registries=insecure)            # ValueError: a bad credentials file
    image = store.ensure(job.image, holder=task_id, deadline=time.monotonic() + 600)  # PullError
    ... run the task in image.root with image.config ...
    store.release(task_id)                                       # when the task has ended

`store.ImageStore` is the API; `model` holds what it hands out (Image, ImageConfig, PullProgress,
CachedImage) and PullError with its causes.
"""
