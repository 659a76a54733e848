"""What several processes share at their edges: authentication, TLS, logging, command lines."""
