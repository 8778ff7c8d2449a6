"""What the gRPC services of :mod:`.grpc_server` (the own ``SignalService``) and
:mod:`.oip_grpc` (``inference.GRPCInferenceService``) share: handlers that parse the raw
request bytes themselves, and the engine deadline of a call."""
from __future__ import annotations

from typing import Any, Mapping

from .request import MAX_DEADLINE_US


def add_raw_service(server: Any, service: str, methods: Mapping[str, tuple[Any, Any, Any]],
                    proto: str) -> None:
    """Register ``service``'s unary ``methods`` (name → (callable, request type, response
    type)) with handlers that take the raw request bytes and parse them themselves: bytes that
    are not a valid message are the client's mistake (INVALID_ARGUMENT naming ``proto``), where
    gRPC's own deserializer answers INTERNAL."""
    import grpc

    def parsing(method: Any, req_type: Any, resp_type: Any) -> Any:
        name = req_type.DESCRIPTOR.full_name

        def handler(raw: bytes, context: Any) -> Any:
            try:
                req = req_type.FromString(raw)
            except Exception as exc:  # google.protobuf.message.DecodeError (any runtime)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"the request is not a valid {name} protobuf message ({exc}); "
                              f"build it from {proto}")
            return method(req, context)
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=None, response_serializer=resp_type.SerializeToString)

    handlers = {n: parsing(*m) for n, m in methods.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def call_budget_us(asked_us: float | None, remaining_s: float | None) -> float | None:
    """The engine deadline of a gRPC call: the smaller of the request's own (``asked_us``) and
    the call's time remaining less a reserve for the reply; None when neither is set."""
    # Without a client deadline gRPC reports ~9.2e18 s remaining (not None): beyond the
    # longest deadline the engine takes, the call has none, and the engine's own default
    # (EngineConfig.deadline_us, else none) applies.
    if remaining_s is not None and remaining_s * 1e6 > MAX_DEADLINE_US:
        remaining_s = None
    # Keep back time for the "unavailable" answer to reach the client before its own
    # deadline fires: 10% of what is left, at least 20 ms (a loaded host needs a time
    # slice or two to send it), never more than half.
    if remaining_s is not None:
        remaining_s -= min(max(0.1 * remaining_s, 0.020), 0.5 * remaining_s)
    budget = [v for v in (asked_us, remaining_s * 1e6 if remaining_s is not None else None)
              if v is not None]
    return min(budget) if budget else None
