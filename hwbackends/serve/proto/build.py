"""Regenerate signal_pb2.py / signal_pb2_grpc.py from signal.proto (needs grpcio-tools)."""
from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc

    here = Path(__file__).parent
    rc = protoc.main(["grpc_tools.protoc", f"-I{here}", f"--python_out={here}",
                      f"--grpc_python_out={here}", str(here / "signal.proto")])
    grpc_mod = here / "signal_pb2_grpc.py"
    # protoc writes an absolute import; the package lives under hwbackends.serve.proto
    text = grpc_mod.read_text().replace("import signal_pb2 as", "from . import signal_pb2 as")
    grpc_mod.write_text(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
