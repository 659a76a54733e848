"""What runs in a user's process: the client library (`master_client`), `synctl`, job files."""
