"""Regenerate the Python modules from the .proto files here (needs grpcio-tools):
``signal_pb2*.py`` (the own SignalService) and ``grpc_service_pb2*.py`` +
``model_config_pb2.py`` (the Open Inference Protocol, package ``inference``, built into the
private pool of :mod:`.oip_pool`)."""
from __future__ import annotations

import sys
from pathlib import Path

#: (proto, whether protoc writes a gRPC module for it, whether it lives in the private pool)
PROTOS = (("signal.proto", True, False), ("model_config.proto", False, True),
          ("grpc_service.proto", True, True))


def main() -> int:
    from grpc_tools import protoc

    here = Path(__file__).parent
    for proto, grpc_mod, private in PROTOS:
        args = ["grpc_tools.protoc", f"-I{here}", f"--python_out={here}"]
        if grpc_mod:
            args.append(f"--grpc_python_out={here}")
        rc = protoc.main([*args, str(here / proto)])
        if rc:
            return rc
        stem = proto.removesuffix(".proto")
        # protoc writes absolute imports; the modules live under hwbackends.serve.proto
        for path in [here / f"{stem}_pb2.py"] + ([here / f"{stem}_pb2_grpc.py"] if grpc_mod else []):
            text = path.read_text()
            for dep in ("signal_pb2", "model_config_pb2", "grpc_service_pb2"):
                text = text.replace(f"\nimport {dep} as", f"\nfrom . import {dep} as")
            if private and path.name.endswith("_pb2.py"):
                text = text.replace("_descriptor_pool.Default().AddSerializedFile",
                                    "_oip_pool.POOL.AddSerializedFile")
                text = text.replace("from google.protobuf import descriptor_pool as _descriptor_pool\n",
                                    "from google.protobuf import descriptor_pool as _descriptor_pool\n"
                                    "from . import oip_pool as _oip_pool\n")
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
