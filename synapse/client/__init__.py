"""What runs in a user's process: the client library (`master_client`), `synctl` and what it prints
(`render`), job files. The worker talks to the masters through `master_client` too."""
