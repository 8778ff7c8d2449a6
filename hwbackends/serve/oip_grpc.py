"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` (proto in
``serve/proto/grpc_service.proto``, the published messages and field numbers), served by
:class:`~hwbackends.serve.grpc_server.GrpcServer` beside its own ``SignalService``, with the
same TLS, token, size cap and connection limits.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer, ModelConfig,
ModelStatistics and RepositoryIndex answer from :class:`~hwbackends.serve.oip.OipModels`
(the other RPCs of the full service are UNIMPLEMENTED, as gRPC answers an unknown method).
ModelInfer reads inputs from ``raw_input_contents`` (one little-endian buffer per input, as
tritonclient sends them) or ``contents.fp32_contents``, and answers in
``raw_output_contents``; its engine deadline is the smaller of the ``timeout`` parameter (µs)
and the call's gRPC deadline less a reserve for the reply. Refusals are gRPC status codes
(:data:`hwbackends.serve.oip.GRPC_CODE`) with the reason as the message.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .grpc_handlers import add_raw_service, call_budget_us
from .oip import GRPC_CODE, InTensor, OipError, OipModels

SERVICE = "inference.GRPCInferenceService"
PROTO = "hwbackends/serve/proto/grpc_service.proto (or Triton's own grpc_service.proto)"
#: The most input tensors one request may carry.
MAX_TENSORS = 64


def _pb() -> Any:
    from .proto import grpc_service_pb2
    return grpc_service_pb2


def param_value(p: Any) -> Any:
    """The Python value of one ``InferParameter`` (None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def decode_inputs(req: Any) -> list[InTensor]:
    """The tensors of a ``ModelInferRequest`` as flat float32 arrays; OipError if malformed."""
    if len(req.inputs) > MAX_TENSORS:
        raise OipError(f"a request may carry at most {MAX_TENSORS} input tensors")
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise OipError(f"raw_input_contents has {len(raw)} buffers for {len(req.inputs)} inputs "
                       f"(one per input, in order)")
    out = []
    for k, t in enumerate(req.inputs):
        shape = tuple(int(d) for d in t.shape)
        if len(shape) > 16 or any(d < 0 for d in shape):
            raise OipError(f"input {t.name[:100]!r}: shape {list(shape)[:16]} is not a shape")
        if t.datatype != "FP32":
            data = np.empty(0, np.float32)
        elif raw:
            b = raw[k]
            if len(b) % 4:
                raise OipError(f"input {t.name[:100]!r}: {len(b)} raw bytes is not a whole number "
                               f"of FP32 values")
            data = np.frombuffer(b, "<f4").astype(np.float32, copy=False)
        else:
            data = np.asarray(t.contents.fp32_contents, np.float32)
        if data.size and not np.isfinite(data).all():
            raise OipError(f"input {t.name[:100]!r} holds NaN or Inf; send finite float32 features")
        out.append(InTensor(t.name, t.datatype, shape, data))
    return out


class OipServicer:
    """The RPCs (each takes the parsed request and the gRPC context)."""

    def __init__(self, models: OipModels):
        self.models = models
        self.pb = _pb()
        from .proto import model_config_pb2
        self.mc = model_config_pb2

    def _abort(self, context: Any, exc: OipError) -> None:
        import grpc
        context.abort(getattr(grpc.StatusCode, GRPC_CODE.get(exc.kind, "INVALID_ARGUMENT")), str(exc))

    def _guard(self, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def call(req: Any, context: Any) -> Any:
            try:
                return fn(req, context)
            except OipError as exc:
                self._abort(context, exc)
        return call

    def ServerLive(self, req: Any, context: Any) -> Any:  # noqa: N802 (the protocol's names)
        return self.pb.ServerLiveResponse(live=self.models.live())

    def ServerReady(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self.pb.ServerReadyResponse(ready=self.models.ready())

    def ModelReady(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self.pb.ModelReadyResponse(ready=self.models.model_ready(req.name, req.version))

    def ServerMetadata(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self._parse(self.models.server_metadata(), self.pb.ServerMetadataResponse())

    def ModelMetadata(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self._parse(self.models.model_metadata(req.name, req.version),
                           self.pb.ModelMetadataResponse())

    def ModelConfig(self, req: Any, context: Any) -> Any:  # noqa: N802
        cfg = self._parse(self.models.model_config(req.name, req.version), self.mc.ModelConfig())
        return self.pb.ModelConfigResponse(config=cfg)

    def ModelStatistics(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self._parse(self.models.model_stats(req.name, req.version),
                           self.pb.ModelStatisticsResponse())

    def RepositoryIndex(self, req: Any, context: Any) -> Any:  # noqa: N802
        return self._parse({"models": self.models.repository_index()},
                           self.pb.RepositoryIndexResponse())

    @staticmethod
    def _parse(obj: dict, msg: Any) -> Any:
        from google.protobuf import json_format
        return json_format.ParseDict(obj, msg)

    def ModelInfer(self, req: Any, context: Any) -> Any:  # noqa: N802
        pb = self.pb
        params = {k: param_value(v) for k, v in req.parameters.items()}
        requested = [o.name for o in req.outputs] or None
        inputs = decode_inputs(req)
        served, outs = self.models.infer(req.model_name, req.model_version, inputs, requested,
                                         params, call_budget_us(None, context.time_remaining()))
        resp = pb.ModelInferResponse(model_name=served.name, model_version=served.versions[0],
                                     id=req.id)
        for o in outs:
            resp.outputs.add(name=o.name, datatype="FP32", shape=list(o.shape))
            resp.raw_output_contents.append(np.ascontiguousarray(o.data, "<f4").tobytes())
        return resp


def add_oip_service(models: OipModels, server: Any) -> None:
    """Register ``inference.GRPCInferenceService`` for ``models`` on a ``grpc.Server``."""
    s = OipServicer(models)
    pb = s.pb
    names = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
             "ModelInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex")
    methods = {n: (s._guard(getattr(s, n)), getattr(pb, f"{n}Request"), getattr(pb, f"{n}Response"))
               for n in names}
    add_raw_service(server, SERVICE, methods, PROTO)
