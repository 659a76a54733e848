"""`synctl`, by verb group: `main` knows every verb's name and one-line help, and imports a verb's
module only when that verb runs (so `synctl --version` and `--help` load no gRPC)."""
