"""Generated gRPC/protobuf modules for hwbackends.serve (regenerate: python -m hwbackends.serve.proto.build)."""
