"""Generated protobuf and gRPC code; regenerate with scripts/gen_proto.py, never edit."""
